"""The pipeline's non-stage tasks: discover, plan and report, outside a running Airflow."""

import re
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowFailException, DownstreamTasksSkipped
from airflow.sdk.execution_time import xcom

from helpers.ledger import flaky_connect
from replayable import db, pipeline
from replayable.airflow import tasks as dag_tasks
from replayable.airflow.dag_factory import pipeline_dag
from replayable.airflow.tasks import common, planning
from replayable.stages.builtin import BUILTIN
from replayable.vocabulary import STAGES

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
    monkeypatch.setattr(common, "get_current_context", lambda: {"ti": ti, "params": {}})
    monkeypatch.setattr(common, "connection_dsn", lambda conn_id: "dsn")


def test_the_report_that_starts_during_a_database_restart_waits_for_it(monkeypatch, in_a_task):
    """The report rides out a restart instead of failing a try (so do discover and plan)."""
    monkeypatch.setattr(db, "connect", flaky_connect(2))
    monkeypatch.setattr(pipeline, "build_report", lambda conn, **run: REPORT)
    assert dag_tasks.report() == REPORT


@pytest.mark.parametrize(
    ("conf", "named"),
    [
        ({"batch_szie": 5}, "'batch_szie' (did you mean 'batch_size'?)"),
        (
            {"redrive": {"stage": "embed", "reason": "fixed", "bye": "x"}},
            "'redrive.bye' (did you mean 'redrive.by'?)",
        ),
    ],
)
def test_plan_refuses_an_unknown_conf_key_before_it_reads_any_source(monkeypatch, conf, named):
    """Airflow lets any extra key into a run's conf; plan stops the run instead of ignoring it."""
    ti = SimpleNamespace(dag_id="document_pipeline", run_id="run-1")
    context = {"ti": ti, "params": {**conf}, "dag_run": SimpleNamespace(conf=conf)}
    monkeypatch.setattr(common, "get_current_context", lambda: context)
    reached: list[str] = []
    monkeypatch.setattr(planning, "run_models", lambda *a: reached.append("model") or None)
    monkeypatch.setattr(common, "on_database", lambda *a: reached.append("database") or None)
    with pytest.raises(AirflowFailException, match=re.escape(named)):
        dag_tasks.plan()
    assert reached == []


@pytest.mark.parametrize("batches", [[], [{"label": "1-2", "size": 2}]])
def test_a_plan_with_no_batch_skips_the_batch_tasks_itself(monkeypatch, batches):
    """Every task mapped over the plan ends skipped with it, not a scheduler loop per stage
    later, and the plan leaves the empty list (mapped length 0) a cleared one expands over."""
    dag = pipeline_dag("plan_skip_probe", BUILTIN, source="/tmp", sweeper=False)
    plan = dag.get_task("plan")
    ti = SimpleNamespace(dag_id=dag.dag_id, run_id="run-1", task_id="plan", map_index=-1)
    monkeypatch.setattr(common, "get_current_context", lambda: {"ti": ti, "task": plan})
    monkeypatch.setattr(planning, "plan", lambda *args: batches)
    pushed: list[tuple[str, object, dict]] = []
    monkeypatch.setattr(
        xcom.XCom, "set", lambda key, value, **where: pushed.append((key, value, where))
    )
    if batches:
        assert dag_tasks.plan_task() == batches
        assert pushed == []
        return
    with pytest.raises(DownstreamTasksSkipped) as skipped:
        dag_tasks.plan_task()
    assert skipped.value.tasks == sorted(f"batch.{stage.name}" for stage in BUILTIN)
    assert [(key, value, where["_mapped_length"]) for key, value, where in pushed] == [
        ("return_value", [], 0)
    ]
