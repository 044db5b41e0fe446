"""Model costs on the UI's overview and its JSON twin: the last 30 days and the newest runs
(ADR 0110). Every value on the page is escaped, a run id included."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from ui_fixtures import (  # noqa: F401 - fixtures
    app_fixture,
    auth_manager_fixture,
    client_fixture,
)

from replayable import db

pytestmark = pytest.mark.db

ODD_RUN = "manual__<b>&run"


def add_call(conn: Any, run_id: str, model: str, cost: float | None, *, days_ago: int = 0):
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO replayable.model_calls (stage, item_key, attempt, status, latency_ms,"
            " n_inputs, tokens, idempotency_key, run_id, model, cost_usd, created_at)"
            " VALUES ('embed', 'i', 1, 'ok', 5, 1, 100, 'k', %s, %s, %s,"
            " now() - make_interval(days => %s))",
            (run_id, model, cost, days_ago),
        )
    conn.commit()


def add_run(conn: Any, run_id: str, *, minutes_ago: int, report: dict | None = None) -> None:
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO replayable.runs (dag_id, run_id, documents, to_do, created_at)"
            " VALUES ('document_pipeline', %s, 3, 3, now() - make_interval(mins => %s))",
            (run_id, minutes_ago),
        )
    conn.commit()
    if report is not None:
        params = {"dag_id": "document_pipeline", "run_id": run_id, "report": json.dumps(report)}
        db.execute(conn, "report/save_report", params)
        conn.commit()


def test_the_overview_shows_the_last_30_days_cost_and_each_runs(client: TestClient, conn):
    add_run(conn, "old", minutes_ago=60, report={"cost": {"usd": 0.5, "unpriced_calls": 0}})
    add_run(conn, ODD_RUN, minutes_ago=1)  # running: its cost so far, from its calls
    add_call(conn, "old", "text-embedding-3-small", 0.25)
    add_call(conn, ODD_RUN, "text-embedding-3-small", 0.125)
    add_call(conn, ODD_RUN, "unpriced-model", None)
    add_call(conn, "ancient", "text-embedding-3-small", 9.0, days_ago=40)  # out of the window

    summary = client.get("/replayable/api/summary").json()
    assert summary["cost"]["days"] == 30
    assert summary["cost"]["usd"] == pytest.approx(0.375)
    assert summary["cost"]["unpriced_calls"] == 1
    runs = {r["run_id"]: r for r in summary["runs"]}
    assert [r["run_id"] for r in summary["runs"]] == [ODD_RUN, "old"]  # newest first
    assert (runs[ODD_RUN]["usd"], runs[ODD_RUN]["unpriced_calls"]) == (0.125, 1)
    assert runs[ODD_RUN]["reported"] is False
    assert runs["old"]["usd"] == 0.5  # the report's figure once the run has ended

    page = client.get("/replayable/").text
    assert "Model cost, last 30 days" in page
    assert "$0.375000" in page
    assert "manual__&lt;b&gt;&amp;run" in page and ODD_RUN not in page
    assert "+ 1 unpriced" in page


def test_a_batch_runs_cost_on_the_overview_is_what_the_provider_charged_at_half_price(
    client: TestClient, run_in_process, conn, model, tmp_path, monkeypatch
):
    """A run in embed_mode batch (ADR 0117), priced at the connection's sync price: the
    overview's 30 days and the run's row show the provider's charged batch tokens at half."""
    import os

    from checks import subset

    connection = json.loads(os.environ["AIRFLOW_CONN_REPLAYABLE_MODEL"])
    connection["extra"] = {
        **connection.get("extra", {}),
        "prices": {"text-embedding-3-small": {"input": 0.02}},
    }
    monkeypatch.setenv("AIRFLOW_CONN_REPLAYABLE_MODEL", json.dumps(connection))
    model.set_faults(batch_delay_s=0.1)
    report = run_in_process(
        {"source": str(subset(tmp_path, 3)), "embed_mode": "batch", "batch_poll_s": 0.1}
    )
    assert not report["_failed"], report["_tasks"]
    charged = model.stats()["batch_tokens_charged"] * 0.02 / 2 / 1e6
    assert charged > 0
    summary = client.get("/replayable/api/summary").json()
    assert summary["cost"]["usd"] == pytest.approx(charged, rel=1e-9)
    ((run),) = [r for r in summary["runs"] if r["run_id"] == report["run_id"]]
    assert run["usd"] == pytest.approx(charged, rel=1e-9)
    page = client.get("/replayable/").text
    assert f"${charged:.6f}" in page
