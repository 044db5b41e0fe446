"""IdempotentStageOperator: one stage over one batch of documents, safe to run twice."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator, Context
from airflow.sdk.definitions.retry_policy import RetryDecision, RetryPolicy
from airflow.sdk.exceptions import AirflowSkipException

from replayable import db
from replayable.airflow.context import triggered_by
from replayable.airflow.hooks import ModelHook, connection_dsn
from replayable.ledger import Revival, RunContext
from replayable.models.choice import run_models
from replayable.pipeline.registry import pipeline_of
from replayable.retry import Classified, ErrorKind, classify
from replayable.runner import DEADLINE, BatchResult, Limits, run_batch
from replayable.settings import PipelineSettings
from replayable.stage import BuildContext, Pipeline, StageBuildError
from replayable.stages.embed.batch import BATCH_WAITING
from replayable.vocabulary import LEDGER_CONN_ID, MODEL_CONN_ID, STAGES

# The longest a task waits on the triggerer for a provider batch: its 24-hour window, and
# the provider's time to write the results of one that expired.
BATCH_WAIT = timedelta(hours=26)


class BatchIncompleteError(Exception):
    """Some items of the batch failed retryably and are under their attempt cap."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class SystemicFailureError(Exception):
    """The batch stopped because of something that is not any item's fault."""

    def __init__(self, error: Classified, cap_s: float | None = None) -> None:
        super().__init__(f"{error.error_class}: {error.message}")
        self.error = error
        self.cap_s = cap_s

    @property
    def is_auth(self) -> bool:
        return self.error.error_class in ("http_401", "http_403")

    @property
    def retry_after_s(self) -> float | None:
        wait = self.error.retry_after_s
        if wait is not None and self.cap_s is not None:
            return min(wait, self.cap_s)
        return wait


class BatchRetryPolicy(RetryPolicy):
    """Fail fast on auth errors; otherwise retry after the largest Retry-After seen."""

    def evaluate(
        self,
        exception: BaseException,
        try_number: int,
        max_tries: int,
        context: Context | None = None,
    ) -> RetryDecision:
        if isinstance(exception, StageBuildError):
            return RetryDecision.fail(reason=f"stage {exception.stage!r} could not be built")
        if isinstance(exception, SystemicFailureError) and exception.is_auth:
            return RetryDecision.fail(
                reason=f"provider refused credentials ({exception.error.error_class})"
            )
        retry_after = getattr(exception, "retry_after_s", None)
        if retry_after:
            return RetryDecision.retry(
                delay=timedelta(seconds=retry_after),
                reason=f"provider asked for {retry_after:.0f}s",
            )
        return RetryDecision.default()

    def serialize(self) -> dict[str, Any]:
        return {"__type": "BatchRetryPolicy"}

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> BatchRetryPolicy:
        return cls()


def _transient(error: BaseException) -> bool:
    """Whether a later try may not meet ``error``: the database, the network, a provider."""
    found = classify(error)
    if found.kind is ErrorKind.SYSTEMIC:
        return True
    return found.retryable and found.error_class != "unexpected"


def revival_reason(settings: PipelineSettings, run_id: str) -> str:
    """What a reviving run writes on the letters it closes; the actor is always who triggered it.

    A redrive's ``by`` is a free-text note kept in the reason, never the recorded actor, so
    that whoever can trigger a run cannot write another person's name into the history.
    """
    if settings.redrive:
        note = settings.redrive.get("by")
        reason = f"{settings.redrive['reason']} (run {run_id}"
        return reason + (f"; note: {note})" if note else ")")
    return f"run {run_id}: {dict(settings.rerun or {})}"


def emit_stats(result: BatchResult, seconds: float | None) -> None:
    """Airflow metrics of one batch (StatsD or OpenTelemetry, as ``[metrics]`` configures).

    ``replayable.items.{done,failed,dead}`` count the batch's documents in each end state
    and ``replayable.batch.duration`` times the batch, all tagged with the stage. Tags reach
    StatsD only with its Datadog or InfluxDB tagging on; OpenTelemetry keeps them.
    """
    from airflow.sdk.observability import stats

    tags = {"stage": result.stage}
    for state, items in (("done", result.done), ("failed", result.failed), ("dead", result.dead)):
        if items:
            stats.incr(f"replayable.items.{state}", count=len(items), tags=tags)
    if seconds is not None:
        stats.timing("replayable.batch.duration", timedelta(seconds=seconds), tags=tags)


class IdempotentStageOperator(BaseOperator):
    """Run one pipeline stage over one batch of document ids.

    Only items not yet done under their key (content + code version + config) are
    processed; each is claimed with a lease first. The task fails (and Airflow retries
    it) while any item is failed and under its attempt cap; it succeeds once every item
    is done or dead. It returns counts of the documents in each end state.

    :param stage: the name of one of the pipeline's stages (``extract``, ``chunk``, ``embed``,
        ``summarize`` in the shipped one).
    :param batch: a batch reference from the plan task, ``{"index": n, "label": ..., "size":
        ...}`` (its documents are read from ``run_docs``), or explicit ids, as
        ``{"doc_ids": [...]}`` or a list.
    :param settings: run settings, usually ``"{{ params }}"`` (see PipelineSettings).
    :param postgres_conn_id: Airflow connection of the replayable database.
    :param model_conn_id: Airflow connection of the model provider (embeddings, chat).
    :param pipeline: the pipeline whose stage this is (``pipeline_dag`` passes it); None:
        the one registered for the DAG, else the shipped document pipeline.
    """

    template_fields: Sequence[str] = ("batch", "settings")
    ui_color = "#e8f4ea"

    def __init__(
        self,
        *,
        stage: str,
        batch: Mapping[str, Any] | Sequence[str] | str,
        settings: Mapping[str, Any] | str = "{{ params }}",
        postgres_conn_id: str = LEDGER_CONN_ID,
        model_conn_id: str = MODEL_CONN_ID,
        pipeline: Pipeline | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("retry_policy", BatchRetryPolicy())
        super().__init__(**kwargs)
        if pipeline is not None:
            pipeline.stage(stage)  # refuses a stage the pipeline does not have, naming it
        elif stage not in STAGES:
            raise ValueError(f"stage: {stage!r} is not one of {list(STAGES)}")
        self.stage = stage
        self.pipeline = pipeline
        self.batch = batch
        self.settings = settings
        self.postgres_conn_id = postgres_conn_id
        self.model_conn_id = model_conn_id

    def doc_ids(self, dsn: str, dag_id: str, run_id: str) -> list[str]:
        """The batch's documents: explicit ids, or the plan's batch ``index`` of this run."""
        if isinstance(self.batch, Mapping) and "doc_ids" in self.batch:
            return list(self.batch["doc_ids"])
        if isinstance(self.batch, Mapping) and "index" in self.batch:
            from replayable.pipeline import batch_doc_ids

            index = int(self.batch["index"])
            # Through a restart, like every later read and write of the batch (ADR 13): a
            # task that starts while Postgres is down waits for it instead of failing a try.
            database = db.Database(dsn)
            try:
                return database.transaction(
                    lambda conn: batch_doc_ids(conn, dag_id=dag_id, run_id=run_id, batch=index),
                    describe="read the batch",
                )
            finally:
                database.close()
        if isinstance(self.batch, str) or not isinstance(self.batch, Sequence):
            raise ValueError(f"batch was not rendered to a batch reference: {self.batch!r:.80}")
        return list(self.batch)

    def execute(self, context: Context) -> dict[str, Any]:
        if not isinstance(self.settings, Mapping):
            raise ValueError(
                f"settings must render to a mapping, got {type(self.settings).__name__}"
            )
        settings = PipelineSettings.from_params(self.settings)
        ti = context["ti"]
        pipeline = self.pipeline or pipeline_of(ti.dag_id)
        stages = pipeline.effective_stages(settings)
        if self.stage not in stages:
            raise AirflowSkipException(f"stage {self.stage} is not in this run's stages")
        started = time.monotonic()
        ctx = RunContext(
            owner=f"{socket.gethostname()}:{os.getpid()}:{ti.run_id}:{ti.map_index}:{ti.try_number}",
            dag_id=ti.dag_id,
            run_id=ti.run_id,
            map_index=ti.map_index,
            try_number=ti.try_number,
        )
        dsn = connection_dsn(self.postgres_conn_id)
        doc_ids = self.doc_ids(dsn, ti.dag_id, ti.run_id)
        limits = Limits(
            lease_s=settings.lease_s,
            max_attempts=settings.max_attempts,
            deadline_s=settings.batch_deadline_s(len(doc_ids)),
        )
        revive = None
        if self.stage == settings.first_stage and (settings.revives_dead or settings.redrive):
            revive = Revival(by=triggered_by(context), reason=revival_reason(settings, ti.run_id))

        def connect() -> db.Database:
            return db.Database(dsn)

        # Read once, and only when a stage asks: a run of extract alone needs no model connection.
        model_hook = ModelHook(self.model_conn_id)
        models = run_models(settings, model_hook.get_settings, stages)
        with ExitStack() as stack:
            build = BuildContext(
                settings=settings,
                run_id=ti.run_id,
                documents=len(doc_ids),
                connect=connect,
                stack=stack,
                spec_hashes=pipeline.spec_hashes(settings, models),
                model_conn_id=self.model_conn_id,
                model_provider=model_hook.get_settings,
                models=models,
                dag_id=ti.dag_id,
                map_index=ti.map_index,
                announces=pipeline.announces(self.stage),
            )
            spec = self._build(pipeline, build, dsn)
            result = run_batch(
                spec, doc_ids, connect=connect, ctx=ctx, limits=limits, revive=revive
            )
        if result.systemic is not None and result.systemic.error_class == BATCH_WAITING:
            self._wait_for_batches(result, getattr(spec, "waiting_on", []), settings)
        return self._outcome(result, settings, time.monotonic() - started)

    def _build(self, pipeline: Pipeline, build: BuildContext, dsn: str) -> Any:
        """The stage's spec; a ``build`` that raises fails the task once, naming the stage,
        and the run's report says why its documents never entered it (ADR 0133). A transient
        failure (the database, the network) is raised as it is, and retried."""
        try:
            return pipeline.stage(self.stage).build(build)
        except Exception as error:
            if _transient(error) or type(error).__module__.startswith("airflow"):
                raise  # retried as usual; Airflow's own exceptions keep their meaning
            failure = StageBuildError(self.stage, error)
            self.log.error("%s", failure)
            self._record_build_error(dsn, build, failure)
            raise failure from error

    def _record_build_error(self, dsn: str, build: BuildContext, failure: StageBuildError) -> None:
        params = {
            "dag_id": build.dag_id,
            "run_id": build.run_id,
            "stage": self.stage,
            "message": str(failure)[:2000],
        }
        database = db.Database(dsn)
        try:
            database.transaction(
                lambda conn: db.execute(conn, "report/record_stage_error", params),
                describe=f"{self.stage}: record the build error",
            )
        except Exception:  # the task fails with the build error whatever happens here
            self.log.exception("%s: the build error could not be recorded", self.stage)
        finally:
            database.close()

    def _wait_for_batches(
        self, result: BatchResult, waiting_on: Sequence[str], settings: PipelineSettings
    ) -> None:
        """Defer the task to the triggerer until one of the provider batches its items wait
        for has ended; the task then runs again and collects it (ADR 0117)."""
        from replayable.airflow.triggers import ProviderBatchTrigger

        emit_stats(result, None)
        batch_ids = [b for b in waiting_on if not b.startswith("submission:")]
        self.log.info(
            "%s: %d done, %d failed, %d dead; waiting on the triggerer for %s",
            self.stage,
            len(result.done),
            len(result.failed),
            len(result.dead),
            ", ".join(waiting_on) or "a batch being sent",
        )
        self.defer(
            trigger=ProviderBatchTrigger(self.model_conn_id, batch_ids, settings.batch_poll_s),
            method_name="resume_after_batches",
            timeout=BATCH_WAIT,
        )

    def resume_after_batches(
        self, context: Context, event: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Back from the triggerer: run the stage again, which collects what has ended, or
        classifies the failure the trigger ended on (ADR 0147)."""
        event = event or {}
        if event.get("status") == "failed":
            self.log.warning(
                "%s: the trigger gave up on batch %s (%s): %s",
                self.stage,
                event.get("batch_id"),
                event.get("error_class"),
                event.get("message"),
            )
        else:
            ended = event.get("ended") or {}
            self.log.info("%s: provider batches ended: %s", self.stage, ended or "none yet")
        return self.execute(context)

    def _outcome(
        self, result: BatchResult, settings: PipelineSettings, seconds: float | None = None
    ) -> dict[str, Any]:
        summary = result.summary()
        emit_stats(result, seconds)
        self.log.info(
            "%s: %d done (%d already), %d failed, %d dead, %d without input",
            self.stage,
            len(result.done),
            result.skipped_done,
            len(result.failed),
            len(result.dead),
            len(result.not_entered),
        )
        if result.dead:
            self.log.warning(
                "%s: %d document(s) dead-lettered: %s",
                self.stage,
                len(result.dead),
                ", ".join(d[:12] for d in result.dead[:20]),
            )
        systemic = result.systemic
        if systemic is not None and systemic.error_class == DEADLINE:
            # The deadline came as the last items finished: nothing was released.
            systemic = systemic if result.failed else None
        if systemic is not None:
            raise SystemicFailureError(systemic, cap_s=settings.max_retry_after_s)
        if result.failed:
            retry_after = result.retry_after_s
            if retry_after is not None:
                retry_after = min(retry_after, settings.max_retry_after_s)
            raise BatchIncompleteError(
                f"{len(result.failed)} item(s) failed and will be retried", retry_after
            )
        return summary
