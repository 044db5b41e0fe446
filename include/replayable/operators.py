"""IdempotentStageOperator: one stage over one batch of documents, safe to run twice."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseHook, BaseOperator, Context
from airflow.sdk.definitions.retry_policy import RetryDecision, RetryPolicy
from airflow.sdk.exceptions import AirflowSkipException

from replayable import db
from replayable.ledger import RunContext
from replayable.provider.config import settings_from_connection
from replayable.retry import CallRetry, Classified
from replayable.runner import BatchResult, Limits, Revival, StageSpec, run_batch
from replayable.settings import DEFAULT_MODEL, STAGES, PipelineSettings


class BatchIncompleteError(Exception):
    """Some items of the batch failed retryably and are under their attempt cap."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class SystemicFailureError(Exception):
    """The batch stopped because of something that is not any item's fault."""

    def __init__(self, error: Classified) -> None:
        super().__init__(f"{error.error_class}: {error.message}")
        self.error = error

    @property
    def is_auth(self) -> bool:
        return self.error.error_class in ("http_401", "http_403")

    @property
    def retry_after_s(self) -> float | None:
        return self.error.retry_after_s


class BatchRetryPolicy(RetryPolicy):
    """Fail fast on auth errors; otherwise retry after the largest Retry-After seen."""

    def evaluate(
        self,
        exception: BaseException,
        try_number: int,
        max_tries: int,
        context: Context | None = None,
    ) -> RetryDecision:
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


def triggered_by(context: Context) -> str:
    """The person (or system) behind this run, for the ledger's resolution notes."""
    dag_run = context["dag_run"]
    return getattr(dag_run, "triggering_user_name", None) or str(dag_run.run_type)


def connection_dsn(conn_id: str) -> str:
    """Turn the Airflow Postgres connection ``conn_id`` into a libpq DSN."""
    import psycopg2.extensions

    conn = BaseHook.get_connection(conn_id)
    options = {
        "host": conn.host,
        "port": conn.port,
        "user": conn.login,
        "password": conn.password,
        "dbname": conn.schema,
    }
    return str(psycopg2.extensions.make_dsn(**{k: v for k, v in options.items() if v}))


class IdempotentStageOperator(BaseOperator):
    """Run one pipeline stage over one batch of document ids.

    Only items not yet done under their key (content + code version + config) are
    processed; each is claimed with a lease first. The task fails (and Airflow retries
    it) while any item is failed and under its attempt cap; it succeeds once every item
    is done or dead. It returns the ids of the documents in each end state.

    :param stage: one of ``extract``, ``chunk``, ``embed``.
    :param batch: the documents, as ``{"doc_ids": [...], "label": ...}`` or a list of ids.
    :param settings: run settings, usually ``"{{ params }}"`` (see PipelineSettings).
    :param postgres_conn_id: Airflow connection of the replayable database.
    :param model_conn_id: Airflow connection of the embeddings provider.
    """

    template_fields: Sequence[str] = ("batch", "settings")
    ui_color = "#e8f4ea"

    def __init__(
        self,
        *,
        stage: str,
        batch: Mapping[str, Any] | Sequence[str] | str,
        settings: Mapping[str, Any] | str = "{{ params }}",
        postgres_conn_id: str = "replayable_db",
        model_conn_id: str = "replayable_model",
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("retry_policy", BatchRetryPolicy())
        super().__init__(**kwargs)
        if stage not in STAGES:
            raise ValueError(f"stage: {stage!r} is not one of {list(STAGES)}")
        self.stage = stage
        self.batch = batch
        self.settings = settings
        self.postgres_conn_id = postgres_conn_id
        self.model_conn_id = model_conn_id

    @property
    def doc_ids(self) -> list[str]:
        if isinstance(self.batch, Mapping):
            return list(self.batch["doc_ids"])
        if isinstance(self.batch, str):
            raise ValueError(f"batch was not rendered to ids: {self.batch[:80]!r}")
        return list(self.batch)

    def execute(self, context: Context) -> dict[str, Any]:
        if not isinstance(self.settings, Mapping):
            raise ValueError(
                f"settings must render to a mapping, got {type(self.settings).__name__}"
            )
        settings = PipelineSettings.from_params(self.settings)
        if self.stage not in settings.effective_stages:
            raise AirflowSkipException(f"stage {self.stage} is not in this run's stages")
        ti = context["ti"]
        ctx = RunContext(
            owner=f"{socket.gethostname()}:{os.getpid()}:{ti.run_id}:{ti.map_index}:{ti.try_number}",
            dag_id=ti.dag_id,
            run_id=ti.run_id,
            map_index=ti.map_index,
            try_number=ti.try_number,
        )
        dsn = connection_dsn(self.postgres_conn_id)
        limits = Limits(lease_s=settings.lease_s, max_attempts=settings.max_attempts)
        revive = None
        if settings.revives_dead and self.stage == settings.first_stage:
            revive = Revival(
                by=triggered_by(context), reason=f"re-run {ti.run_id}: {dict(settings.rerun or {})}"
            )
        with ExitStack() as stack:
            spec = self._spec(settings, stack)
            result = run_batch(
                spec,
                self.doc_ids,
                connect=lambda: db.connect(dsn),
                ctx=ctx,
                limits=limits,
                revive=revive,
            )
        return self._outcome(result)

    def _spec(self, settings: PipelineSettings, stack: ExitStack) -> StageSpec:
        # Imported here: pypdf and the process pool are task-time needs, not parse-time ones.
        from replayable import guards
        from replayable.specs import ChunkSpec, EmbedSpec, ExtractSpec
        from replayable.stages.embed import HttpEmbeddingClient

        if self.stage == "extract":
            pool = stack.enter_context(
                guards.GuardedPool(timeout_s=settings.item_timeout_s, memory_mb=settings.memory_mb)
            )
            return ExtractSpec(pool=pool, max_bytes=settings.max_bytes)
        if self.stage == "chunk":
            return ChunkSpec(config=settings.chunk_config)
        provider = settings_from_connection(self.model_conn_id)
        # Params win over the connection's defaults; both feed the item keys, so resolve once.
        model = settings.model or provider.model or DEFAULT_MODEL
        dimensions = settings.dimensions or provider.dimensions
        client = HttpEmbeddingClient(
            base_url=provider.base_url,
            model=model,
            api_key=provider.api_key,
            dimensions=dimensions,
            timeout_s=provider.timeout_s,
            retry=CallRetry(),
        )
        stack.callback(client.close)
        return EmbedSpec(
            provider=client,
            model=model,
            chunker_key=settings.chunk_config.key,
            dimensions=dimensions,
            inputs_per_call=settings.embed_inputs_per_call,
        )

    def _outcome(self, result: BatchResult) -> dict[str, Any]:
        summary = result.summary()
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
                ", ".join(d[:12] for d in result.dead),
            )
        if result.systemic is not None:
            raise SystemicFailureError(result.systemic)
        if result.failed:
            raise BatchIncompleteError(
                f"{len(result.failed)} item(s) failed and will be retried", result.retry_after_s
            )
        return summary
