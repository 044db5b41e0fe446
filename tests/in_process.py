"""document_pipeline in this process: plan, each batch's stages, report and publish.

What the library does with faults, bad files and re-run selection does not need Airflow's
scheduler or a cold ``airflow dags test`` (about 10 s of imports and parsing per run) to be
seen: the DAG's own task callables and operators run here, in the order and with the trigger
rules and retries the DAG gives them. What only Airflow can show (mapping, clearing one map
index, the scheduler, the UI and API, the cluster) stays in tests/e2e/.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.definitions.param import ParamsDict
from airflow.sdk.definitions.retry_policy import RetryAction
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException, TaskDeferred

from checks import SAMPLES
from replayable import (
    IdempotentStageOperator,
    PublishEventsOperator,
    pipeline_params,
    sources,
)
from replayable.airflow import tasks as dag_tasks
from replayable.airflow.tasks import common as task_common
from replayable.pipeline.registry import pipeline_of, register
from replayable.stage import Pipeline
from replayable.vocabulary import PIPELINE_DAG_ID

# The DAG's own settings (dags/document_pipeline.py): four retries per batch task.
RETRIES = 4
_RUNS = itertools.count(1)


# Each deferral of a stage task run in process: (task's stage, the trigger's batch ids).
DEFERRALS: list[tuple[str, list[str]]] = []


def run_deferring(operator: IdempotentStageOperator, context: Any) -> Any:
    """``execute``, and while it defers, run its trigger here until it fires, then resume
    the task with the event, as ``airflow dags test`` runs triggers inline."""
    call: Any = operator.execute
    kwargs: dict[str, Any] = {}
    while True:
        try:
            return call(context, **kwargs)
        except TaskDeferred as deferred:
            DEFERRALS.append((operator.stage, list(getattr(deferred.trigger, "batch_ids", []))))
            event = asyncio.run(_first_event(deferred.trigger))
            call = getattr(operator, deferred.method_name)
            kwargs = {**(deferred.kwargs or {}), "event": event.payload}


async def _first_event(trigger: Any) -> Any:
    async for event in trigger.run():
        return event
    raise AssertionError("the trigger ended without an event")


@dataclass
class Outcome:
    """How one task of the run ended: ``success``, ``skipped`` or ``failed`` after ``tries``."""

    state: str
    tries: int
    error: BaseException | None = None


@dataclass
class PipelineInProcess:
    """Runs document_pipeline's tasks in this process and returns the run's report.

    The report is the one the report task writes (``pipeline.build_report``), with
    ``_failed`` (the run would have failed: a batch task or the report failed) and
    ``_tasks`` (each task's :class:`Outcome`, by ``(task_id, map_index)``).

    :param user: the user who triggers the runs, as the API records it.
    :param pipeline: the pipeline whose DAG this is (registered, as ``pipeline_dag`` does);
        None: document_pipeline.
    """

    monkeypatch: pytest.MonkeyPatch
    user: str | None = "tester"
    tasks: dict[tuple[str, int], Outcome] = field(default_factory=dict)
    pipeline: Pipeline | None = None
    # The asset events the last run's publish task emitted, by asset.
    outlets: dict[Any, Any] = field(default_factory=dict)

    def __call__(self, conf: dict[str, Any]) -> dict[str, Any]:
        run_id = f"manual__in-process-{next(_RUNS)}"
        dag_run = SimpleNamespace(conf=conf, triggering_user_name=self.user, run_type="manual")
        pipeline = self.pipeline or pipeline_of(PIPELINE_DAG_ID)
        register(pipeline)
        dag_id = pipeline.dag_id
        params = ParamsDict(
            pipeline_params(
                str(SAMPLES),
                sources.allowed_roots(),
                stages=pipeline.names,
                default_stages=pipeline.defaults,
            )
        )
        params.update(conf)
        settings = params.validate()
        self.tasks = {}

        def context(task_id: str, map_index: int = -1, try_number: int = 1) -> dict[str, Any]:
            ti = SimpleNamespace(
                dag_id=dag_id,
                run_id=run_id,
                task_id=task_id,
                map_index=map_index,
                try_number=try_number,
            )
            return {"ti": ti, "params": settings, "dag_run": dag_run}

        failed = False
        current = context("plan")
        self.monkeypatch.setattr(task_common, "get_current_context", lambda: current)
        try:
            batches = dag_tasks.plan()
        except AirflowFailException as error:
            self.tasks["plan", -1] = Outcome("failed", 1, error)
            batches, failed = [], True
        for map_index, batch in enumerate(batches):
            for stage in pipeline.names:
                task_id = f"batch.{stage}"
                # trigger_rule none_failed for every stage that reads another: a skipped
                # input lets it run, a failed (or upstream_failed) one does not.
                source = pipeline.stage(stage).reads
                upstream = self.tasks[f"batch.{source}", map_index].state if source else "success"
                if upstream in ("failed", "upstream_failed"):
                    self.tasks[task_id, map_index] = Outcome("upstream_failed", 0)
                    continue
                operator = IdempotentStageOperator(
                    task_id=stage, stage=stage, batch=batch, settings=settings, pipeline=pipeline
                )
                outcome = self._run_with_retries(
                    operator, lambda tries, t=task_id, m=map_index: context(t, m, tries)
                )
                self.tasks[task_id, map_index] = outcome
                failed = failed or outcome.state == "failed"
        current = context("report")
        try:
            report = dag_tasks.report()
        except AirflowFailException as error:
            self.tasks["report", -1] = Outcome("failed", 1, error)
            failed = True
            report = self._saved_report(dag_id, run_id)
        # The teardown runs however the run went; the run's state stays the report's verdict.
        current = context("publish")
        publisher = PublishEventsOperator(task_id="publish")
        outlets: dict[Any, Any] = defaultdict(SimpleNamespace)
        self.outlets = outlets
        try:
            publisher.execute({**current, "outlet_events": outlets})
            self.tasks["publish", -1] = Outcome("success", 1)
        except Exception as error:
            self.tasks["publish", -1] = Outcome("failed", 1, error)
        report["_failed"] = failed
        report["_tasks"] = self.tasks
        return report

    @staticmethod
    def _run_with_retries(operator: IdempotentStageOperator, context: Any) -> Outcome:
        """``execute`` until it succeeds, is skipped, or its retry policy or tries run out.

        The waits between tries are not taken: a failed item is ``failed``, not leased, so
        the next try takes it at once; the delays themselves are the policy's tests' concern.
        """
        for try_number in range(1, RETRIES + 2):
            try:
                run_deferring(operator, context(try_number))
            except AirflowSkipException:
                return Outcome("skipped", try_number)
            except Exception as error:
                decision = operator.retry_policy.evaluate(error, try_number, RETRIES + 1)
                if decision.action == RetryAction.FAIL or try_number == RETRIES + 1:
                    return Outcome("failed", try_number, error)
                continue
            return Outcome("success", try_number)
        raise AssertionError("unreachable")

    @staticmethod
    def _saved_report(dag_id: str, run_id: str) -> dict[str, Any]:
        """The report the failed report task saved before it failed the run."""
        from replayable import db
        from replayable.airflow.hooks import connection_dsn
        from replayable.vocabulary import LEDGER_CONN_ID

        conn = db.connect(connection_dsn(LEDGER_CONN_ID))
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT report FROM replayable.run_reports WHERE dag_id = %s AND run_id = %s",
                    (dag_id, run_id),
                )
                (report,) = cur.fetchone()
        finally:
            conn.close()
        return dict(report)
