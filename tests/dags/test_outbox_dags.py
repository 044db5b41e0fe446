"""The outbox and sweeper wiring: publish ends the pipeline without deciding its state."""

import copy

import pytest
from airflow.models import DagBag

from helpers import ROOT
from replayable import DOCUMENTS_READY
from replayable.outbox import PublishLimits


@pytest.fixture(scope="module")
def dagbag():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
        mp.syspath_prepend(str(ROOT / "dags"))  # as Airflow does for a bundle's own modules
        yield DagBag(dag_folder=str(ROOT / "dags"))


def test_publish_is_a_teardown_after_the_report_so_the_report_decides_the_run(dagbag):
    dag = dagbag.dags["document_pipeline"]
    publish = dag.get_task("publish")
    assert publish.is_teardown and not publish.on_failure_fail_dagrun
    assert publish.upstream_task_ids == {"report"}
    assert DOCUMENTS_READY in publish.outlets


def test_the_publisher_dag_runs_every_ten_minutes_and_announces_ready_documents(dagbag):
    dag = dagbag.dags["outbox_publisher"]
    dag.params.validate()
    assert dag.max_active_runs == 1
    assert DOCUMENTS_READY in dag.get_task("publish").outlets


def test_the_sweeper_is_hourly_and_triggers_the_pipeline_per_stage(dagbag):
    dag = dagbag.dags["replayable_sweeper"]
    dag.params.validate()
    assert dag.max_active_runs == 1
    trigger = dag.get_task("trigger_rerun")
    assert trigger.partial_kwargs["trigger_dag_id"] == "document_pipeline"
    assert trigger.partial_kwargs["skip_when_already_exists"] is True
    assert trigger.upstream_task_ids == {"sweep"}


def test_every_pipeline_has_a_sweeper_of_its_own(dagbag):
    """A pipeline built by pipeline_dag gets `<dag_id>_sweeper`, which re-runs it; the
    document pipeline's keeps its name, replayable_sweeper (ADR 0109)."""
    sweepers = {
        dag_id: dag.get_task("trigger_rerun").partial_kwargs["trigger_dag_id"]
        for dag_id, dag in dagbag.dags.items()
        if "trigger_rerun" in dag.task_dict
    }
    assert sweepers == {
        "replayable_sweeper": "document_pipeline",
        "keyword_pipeline_sweeper": "keyword_pipeline",
    }
    sweep = dagbag.dags["keyword_pipeline_sweeper"].get_task("sweep")
    assert list(sweep.op_args) == ["keyword_pipeline"]


def test_a_sweep_checks_its_rerun_as_often_as_the_deployment_says(monkeypatch):
    """``[replayable] sweeper_poke_interval_s`` (default 30 s), read when the DAG is parsed."""
    monkeypatch.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    monkeypatch.delenv("AIRFLOW__REPLAYABLE__SWEEPER_POKE_INTERVAL_S", raising=False)
    default = DagBag(dag_folder=str(ROOT / "dags" / "document_pipeline.py"))
    assert (
        default.dags["replayable_sweeper"].get_task("trigger_rerun").partial_kwargs["poke_interval"]
        == 30
    )
    monkeypatch.setenv("AIRFLOW__REPLAYABLE__SWEEPER_POKE_INTERVAL_S", "2")
    quick = DagBag(dag_folder=str(ROOT / "dags" / "document_pipeline.py"))
    trigger = quick.dags["replayable_sweeper"].get_task("trigger_rerun")
    assert trigger.partial_kwargs["poke_interval"] == 2


def test_the_publisher_dag_defaults_are_the_outbox_limits_defaults(dagbag):
    """The event lease and claim size are stated once; the DAG's params show those values."""
    params = dagbag.dags["outbox_publisher"].params
    limits = PublishLimits()
    assert params["lease_s"] == limits.lease_s and params["batch_size"] == limits.claim_size
    assert params["max_events"] == limits.max_events
    assert params["max_attempts"] == limits.max_attempts


def test_the_dead_letter_watch_takes_any_stage_name(dagbag):
    """A stage of your own (keywords) can be watched alone; a name no stage can have is
    refused at trigger time, naming the field."""
    from airflow.sdk.exceptions import ParamValidationError

    params = copy.deepcopy(dagbag.dags["dead_letter_watch"].params)
    params["stage"] = "keywords"
    params.validate()
    with pytest.raises(ParamValidationError, match="stage"):
        params["stage"] = "Key Words"
