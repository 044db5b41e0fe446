"""The UI's reads of the ledger: status per stage, failed items, dead letters, keyset paging."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from ui_fixtures import (  # noqa: F401 - fixtures
    A,
    B,
    app_fixture,
    auth_manager_fixture,
    client_fixture,
    ledger_fixture,
)

from helpers import ROOT
from replayable.vocabulary import STAGES

WEB = ROOT / "include" / "replayable" / "web"


def test_overview_counts_items_by_current_status_per_stage(
    client: TestClient, ledger: dict[str, int]
) -> None:
    data = client.get("/replayable/api/summary").json()
    stages = {s["stage"]: s for s in data["stages"]}
    assert [s["stage"] for s in data["stages"]] == list(STAGES)
    assert stages["extract"] == {
        "stage": "extract",
        "pending": 1,
        "running": 0,
        "done": 1,
        "failed": 1,
        "dead": 1,
        "total": 4,
        "open_dead_letters": 1,
    }
    assert stages["chunk"]["running"] == 1 and stages["chunk"]["total"] == 1
    assert stages["embed"]["failed"] == 1 and stages["embed"]["open_dead_letters"] == 1
    assert data["open_dead_letters"] == 2

    page = client.get("/replayable/")
    assert page.status_code == 200
    assert "failed?stage=extract" in page.text and "dead-letters?stage=embed" in page.text


def test_failed_list_shows_only_items_whose_current_status_is_failed(
    client: TestClient, ledger: dict[str, int]
) -> None:
    data = client.get("/replayable/api/failed").json()
    assert data["matched"] == 2
    assert [(i["stage"], i["item_key"]) for i in data["items"]] == [
        ("embed", "ma"),
        ("extract", "eb"),
    ]
    embed = data["items"][0]
    assert (embed["run_id"], embed["map_index"], embed["attempts"]) == ("r1", 3, 2)

    page = client.get("/replayable/failed").text
    assert "b.pdf" in page and "a.pdf" in page and "superseded" not in page


def test_dead_letter_list_defaults_to_open_letters(
    client: TestClient, ledger: dict[str, int]
) -> None:
    data = client.get("/replayable/api/dead-letters").json()
    assert [d["id"] for d in data["dead_letters"]] == [ledger["bad_input"], ledger["encrypted"]]
    assert {d["status"] for d in data["dead_letters"]} == {"open"}

    page = client.get("/replayable/dead-letters").text
    assert "m-old" not in page and "<details>" in page


def test_dead_letter_list_filters_by_status_and_stage(
    client: TestClient, ledger: dict[str, int]
) -> None:
    every = client.get("/replayable/api/dead-letters?status=all").json()
    assert every["matched"] == 3
    redriven = client.get("/replayable/api/dead-letters?status=redriven&stage=embed").json()
    assert [d["id"] for d in redriven["dead_letters"]] == [ledger["redriven"]]
    none = client.get("/replayable/api/dead-letters?status=ignored").json()
    assert none == {"matched": 0, "dead_letters": [], "next_after": None}


def test_pages_follow_a_keyset_cursor_to_the_end(
    client: TestClient, ledger: dict[str, int]
) -> None:
    """Each page's next_after leads to the next rows; no row repeats and none is skipped."""
    seen: list[int] = []
    after = None
    while True:
        query = "status=all&limit=1" + (f"&after={after}" if after else "")
        page = client.get(f"/replayable/api/dead-letters?{query}").json()
        seen += [d["id"] for d in page["dead_letters"]]
        after = page["next_after"]
        if after is None:
            break
    assert sorted(seen) == sorted(ledger.values()) and len(seen) == 3
    failed_ids = []
    after = None
    while True:
        page = client.get(
            "/replayable/api/failed?limit=1" + (f"&after={after}" if after else "")
        ).json()
        failed_ids += [(i["stage"], i["doc_id"]) for i in page["items"]]
        after = page["next_after"]
        if after is None:
            break
    assert sorted(failed_ids) == [("embed", A), ("extract", B)]
    html_page = client.get("/replayable/dead-letters?status=all&limit=1").text
    assert "Next page" in html_page


@pytest.mark.parametrize(
    "cursor",
    [
        "bm90LWEtY3Vyc29y",  # "not-a-cursor"
        # A well-formed cursor whose id is past bigint: refused, not a database error.
        "MjAyNi0wMS0wMVQwMDowMDowMCswMDowMAA5OTk5OTk5OTk5OTk5OTk5OTk5OTk5",
    ],
)
def test_a_bad_cursor_is_refused_naming_it(
    client: TestClient, ledger: dict[str, int], cursor: str
) -> None:
    response = client.get(f"/replayable/api/dead-letters?after={cursor}")
    assert response.status_code == 400 and "after" in response.text


def _queries_run_in(path: Path) -> list[str]:
    """The query names ``path`` hands to ``db.fetch_all``, ``db.execute`` or ``db.sql``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        position = {"fetch_all": 1, "execute": 1, "sql": 0}.get(node.func.attr)
        if position is None or len(node.args) <= position:
            continue
        name = node.args[position]
        found.append(name.value if isinstance(name, ast.Constant) else f"<{ast.unparse(name)}>")
    return found


def test_the_ui_reads_what_the_cli_reads_too_through_views() -> None:
    """Status, failed items, dead letters, redrive scope and outbox come from views (ADR 0093);
    the UI's own queries are the reads only it makes and its writes."""
    views = set(_queries_run_in(ROOT / "include" / "replayable" / "views.py"))
    queries = {
        path.name: set(names)
        for path in sorted(WEB.glob("*.py"))
        if path.name != "metrics.py" and (names := _queries_run_in(path))
    }
    assert queries == {
        "actions.py": {"<query>", "views/dead_letter_status"},  # ignore, assign; why refused
        "reads.py": {
            "views/dead_letter",
            "views/dead_letters_per_hour",
            "views/dead_letter_history",
        },
    }
    assert not views & set().union(*queries.values())
