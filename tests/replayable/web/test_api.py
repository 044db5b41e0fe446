"""The UI's JSON API: the shapes it answers with, and each row's links into Airflow (ADR 0060)."""

from __future__ import annotations

from fastapi.testclient import TestClient
from ui_fixtures import (  # noqa: F401 - fixtures
    HOSTILE,
    app_fixture,
    auth_manager_fixture,
    client_fixture,
    ledger_fixture,
)


def test_json_api_shapes(client: TestClient, ledger: dict[str, int]) -> None:
    summary = client.get("/replayable/api/summary").json()
    assert set(summary) == {
        "stages",
        "open_dead_letters",
        "outbox",
        "index",
        "cost",
        "searches",
        "runs",
    }
    assert summary["index"] == {"retracted": 0, "purged": 0}
    failed = client.get("/replayable/api/failed").json()
    assert set(failed) == {"matched", "items", "next_after"}
    assert set(failed["items"][0]) == {
        "stage",
        "item_key",
        "doc_id",
        "uri",
        "attempts",
        "error_class",
        "last_error",
        "code_version",
        "dag_id",
        "run_id",
        "map_index",
        "try_number",
        "updated_at",
        "links",
    }
    letters = client.get("/replayable/api/dead-letters").json()
    assert set(letters) == {"matched", "dead_letters", "next_after"}
    letter = letters["dead_letters"][-1]
    assert letter["error"] == HOSTILE and letter["traceback"] == HOSTILE  # JSON is not HTML
    assert {"id", "owner", "note", "status", "run_id", "map_index", "resolved_by"} <= set(letter)
    assert {"try_number", "links"} <= set(letter)
    chart = client.get("/replayable/api/dead-letters/per-hour").json()
    assert set(chart) == {"hours", "per_hour", "total", "peak"}


def test_failed_items_and_letters_link_to_their_task_instance_run_and_log(
    client: TestClient, ledger: dict[str, int]
) -> None:
    run = "dags/document_pipeline/runs/r1"
    item = client.get("/replayable/api/failed?stage=extract").json()["items"][0]
    assert item["links"] == {
        "run": run,
        "task_instance": f"{run}/tasks/batch.extract/mapped/1/details",
        "log": f"{run}/tasks/batch.extract/mapped/1?try_number=1",
    }
    letter = client.get(f"/replayable/api/dead-letters/{ledger['encrypted']}").json()
    run = "dags/document_pipeline/runs/r2"
    assert letter["links"] == {
        "run": run,
        "task_instance": f"{run}/tasks/batch.extract/mapped/0/details",
        "log": f"{run}/tasks/batch.extract/mapped/0?try_number=2",
    }
    # A letter whose row names no DAG run has nowhere to link to.
    other = client.get(f"/replayable/api/dead-letters/{ledger['bad_input']}").json()
    assert other["links"] is None
