"""The pipeline's non-stage tasks: discover, plan and report, outside a running Airflow."""

from types import SimpleNamespace

import pytest
from test_operators import flaky_connect

from replayable import dag_tasks, db, pipeline
from replayable.settings import STAGES

REPORT = {
    "run_id": "run-1",
    "documents": 3,
    "stages": {stage: {"done": 3, "failed": 0, "dead": 0, "errors": {}} for stage in STAGES},
    "model_calls": {"calls": 1, "ok": 1, "inputs": 3, "tokens": 30},
    "dead_letters_opened": 0,
}


@pytest.fixture
def in_a_task(monkeypatch):
    ti = SimpleNamespace(dag_id="document_pipeline", run_id="run-1")
    monkeypatch.setattr(dag_tasks, "get_current_context", lambda: {"ti": ti, "params": {}})
    monkeypatch.setattr(dag_tasks, "connection_dsn", lambda conn_id: "dsn")


def test_the_report_that_starts_during_a_database_restart_waits_for_it(monkeypatch, in_a_task):
    """The report rides out a restart instead of failing a try (so do discover and plan)."""
    monkeypatch.setattr(db, "connect", flaky_connect(2))
    monkeypatch.setattr(pipeline, "build_report", lambda conn, **run: REPORT)
    assert dag_tasks.report() == REPORT
