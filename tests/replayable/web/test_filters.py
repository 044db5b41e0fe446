"""The list filters, declared once for a page and its JSON twin: what they take and refuse."""

from __future__ import annotations

import html
import re
from typing import Any, get_args

import pytest
from fastapi.testclient import TestClient
from pydantic import TypeAdapter, ValidationError
from ui_fixtures import (  # noqa: F401 - fixtures
    B,
    _iso,
    app_fixture,
    auth_manager_fixture,
    client_fixture,
    ledger_fixture,
)

from replayable.vocabulary import DEAD_LETTER_STATUSES, STAGES
from replayable.web.filters import LetterStatus, Stage


def test_the_stage_filter_takes_every_stage_name_and_refuses_others() -> None:
    """The shipped stages and a stage of your own ("wordcount") alike; nothing else."""
    stage = TypeAdapter(Stage)
    for name in (*STAGES, "wordcount"):
        assert stage.validate_python(name) == name
    for bad in ("Embed", "embed;drop", "", "x" * 41):
        with pytest.raises(ValidationError):
            stage.validate_python(bad)


def test_the_status_filter_offers_every_letter_status_and_all() -> None:
    assert get_args(LetterStatus) == (*DEAD_LETTER_STATUSES, "all")


@pytest.mark.parametrize(
    ("query", "keys"),
    [
        ("stage=extract", ["eb"]),
        ("error_class=http_429", ["ma"]),
        ("error_class=http_429&error_class=http_503", ["ma", "eb"]),
        ("error_class=http_429,+http_503", ["ma", "eb"]),  # as the page shows a filter
        ("stage=embed&error_class=http_503", []),
        ("stage=&error_class=", ["ma", "eb"]),  # what the filter form sends for "any"
        ("limit=1", ["ma"]),
    ],
)
def test_failed_list_filters_by_stage_error_class_and_limit(
    client: TestClient, ledger: dict[str, int], query: str, keys: list[str]
) -> None:
    data = client.get(f"/replayable/api/failed?{query}").json()
    assert [i["item_key"] for i in data["items"]] == keys
    assert client.get(f"/replayable/failed?{query}").status_code == 200


@pytest.mark.parametrize(
    "query",
    [
        "/api/failed?stage=summarise",
        "/failed?stage=EXTRACT",
        "/failed?limit=0",
        "/api/failed?limit=501",
        "/api/dead-letters?limit=x",
        "/dead-letters?status=closed",
        "/api/dead-letters?stage=chunk;drop",
    ],
)
def test_invalid_stage_status_or_limit_is_422(
    client: TestClient, ledger: dict[str, int], query: str
) -> None:
    assert client.get("/replayable" + query).status_code == 422


def test_a_stage_of_your_own_is_a_filter_once_the_ledger_has_its_items(
    client: TestClient, conn: Any, ledger: dict[str, int]
) -> None:
    """No edit to the package: the pages offer the stages the ledger has items of."""
    assert client.get("/replayable/api/failed?stage=wordcount").status_code == 422
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO replayable.stage_runs (stage, item_key, doc_id, status, attempts,"
            " error_class, code_version, config_hash, is_current)"
            " SELECT 'wordcount', 'wc-a', doc_id, 'failed', 1, 'poisoned', '1.0', 'c', true"
            " FROM replayable.documents ORDER BY doc_id LIMIT 1"
        )
    conn.commit()
    data = client.get("/replayable/api/failed?stage=wordcount").json()
    assert [i["item_key"] for i in data["items"]] == ["wc-a"]
    page = client.get("/replayable/failed?stage=wordcount").text
    assert '<option value="wordcount" selected>wordcount</option>' in page


def test_dead_letters_filter_by_error_class_and_creation_time(
    client: TestClient, conn: Any, ledger: dict[str, int]
) -> None:
    def ids(query: str) -> list[int]:
        return [
            d["id"]
            for d in client.get(f"/replayable/api/dead-letters?{query}").json()["dead_letters"]
        ]

    assert ids("status=all&error_class=http_400") == [ledger["bad_input"]]
    assert ids("status=all&error_class=http_400,encrypted") == [
        ledger["bad_input"],
        ledger["encrypted"],
    ]
    # The letters are 3, 2 and 1 minutes old; a time without a zone is UTC.
    middle = _iso(conn, "SELECT now() - interval '150 seconds'")
    assert ids(f"status=all&since={middle}") == [ledger["redriven"], ledger["bad_input"]]
    assert ids(f"status=all&until={middle}") == [ledger["encrypted"]]
    assert ids(f"status=all&since={middle}Z&error_class=http_500") == [ledger["redriven"]]
    assert ids("since=&until=&error_class=") == [ledger["bad_input"], ledger["encrypted"]]
    page = client.get(f"/replayable/dead-letters?status=all&since={middle}").text
    assert f'name="since" type="datetime-local" step="1" value="{middle[:19]}"' in page


def test_keyset_paging_keeps_the_filters(
    client: TestClient, conn: Any, ledger: dict[str, int]
) -> None:
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO replayable.dead_letters (stage, item_key, doc_id, error_class,"
            " error_kind, error, attempts, code_version, created_at)"
            " SELECT 'embed', 'p' || n, %s, CASE WHEN n %% 2 = 0 THEN 'http_400' ELSE 'x' END,"
            " 'terminal', 'e', 1, '1', now() - make_interval(mins => 10 + n)"
            " FROM generate_series(1, 9) AS n RETURNING id, error_class",
            (B,),
        )
        wanted = {row[0] for row in cur.fetchall() if row[1] == "http_400"}
    conn.commit()
    wanted.add(ledger["bad_input"])
    since = _iso(conn, "SELECT now() - interval '1 hour'")
    query: str | None = f"error_class=http_400&since={since}&limit=2"
    seen: list[int] = []
    while query is not None:
        page = client.get(f"/replayable/dead-letters?{query}")
        seen += [int(i) for i in re.findall(r'<tbody class="letter" id="dl-(\d+)">', page.text)]
        nxt = re.search(r'<a href="\?([^"]*)">Next page', page.text)
        query = html.unescape(nxt.group(1)) if nxt else None
        if query is not None:
            assert "error_class=http_400" in query and "since=" in query
    assert len(seen) == len(set(seen)) and set(seen) == wanted
