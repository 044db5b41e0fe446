"""``/replayable/api/check``: the ledger against its invariants, as ``replayable check``."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from ui_fixtures import (  # noqa: F401 - fixtures
    anonymous_fixture,
    app_fixture,
    auth_manager_fixture,
    client_fixture,
)

from invariant_ledger import A, B, fill_clean_ledger, run_sql

pytestmark = pytest.mark.db


@pytest.fixture
def ledger(conn: Any) -> Any:
    return fill_clean_ledger(conn)


def test_a_clean_ledger_answers_clean(client: TestClient, ledger: Any) -> None:
    answer = client.get("/replayable/api/check?quiescent=true").json()
    assert answer["clean"] is True and answer["quiescent"] is True
    assert answer["violations"] == [] and answer["totals"]["no_outcome"] == 0


def test_a_violation_is_listed_with_its_stage_document_and_item(
    client: TestClient, ledger: Any
) -> None:
    run_sql(ledger, "UPDATE replayable.dead_letters SET status = 'redriven' WHERE doc_id = %s", B)
    answer = client.get("/replayable/api/check", params={"limit": 5}).json()
    assert answer["clean"] is False and answer["totals"]["dead_without_letter"] == 1
    [violation] = answer["violations"]
    assert (violation["invariant"], violation["stage"], violation["doc_id"]) == (
        "dead_without_letter",
        "embed",
        B,
    )
    assert violation["item_key"] == "embed-b"


def test_the_limit_is_bounded_and_anonymous_requests_are_refused(
    client: TestClient, anonymous: TestClient, ledger: Any
) -> None:
    assert client.get("/replayable/api/check?limit=0").status_code == 422
    assert anonymous.get("/replayable/api/check").status_code == 401


def test_the_page_lists_each_violation_escaped(client: TestClient, ledger: Any) -> None:
    run_sql(
        ledger,
        "INSERT INTO replayable.dead_letters (stage, item_key, doc_id, error_class, error_kind,"
        " error, attempts, code_version) VALUES ('embed', 'old', %s, '<script>x</script>',"
        " 'terminal', 'e', 1, '1.0')",
        A,
    )
    html = client.get("/replayable/check?limit=5").text
    assert "done_with_open_letter" in html and A[:12] in html
    assert "<script>x" not in html and "&lt;script&gt;x" in html
    assert 'aria-current="page">Check' in html
