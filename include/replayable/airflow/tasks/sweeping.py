"""The sweeper's task: the failed items a pipeline's runs left, as one re-run per stage,
and the provider files and retracted documents nothing needs any more."""

from __future__ import annotations

import logging
from typing import Any

from replayable import db, mirror
from replayable.airflow.hooks import ModelHook, connection_dsn
from replayable.airflow.tasks import common
from replayable.models.choice import run_models
from replayable.pipeline.registry import pipeline_of
from replayable.settings import PipelineSettings
from replayable.vocabulary import LEDGER_CONN_ID, MODEL_CONN_ID, PIPELINE_DAG_ID

log = logging.getLogger(__name__)


def _sweep_provider_files(conn: Any, model_conn_id: str, dsn: str) -> None:
    """Delete batch input files the provider keeps that no submission records (ADR 0117);
    best effort: a provider without the Files API, or one that is down, is left alone. Each
    call is paced by the connection's shared rate (ADR 0149)."""
    from replayable.budget import RequestBudget
    from replayable.stages.embed.batch_files import sweep_orphan_files

    try:
        hook = ModelHook(model_conn_id)
        provider = hook.get_settings()
        # Its rate only: these calls take no slot (RequestBudget.paced).
        budget = RequestBudget(
            provider.base_url,
            1,
            max_rps=provider.max_rps,
            connect=lambda: db.Database(dsn),
        )
        api = hook.get_batch_api(budget=budget)
        try:
            deleted = sweep_orphan_files(api, conn)
        finally:
            api.close()
            budget.close()
    except Exception as error:
        log.warning("provider files were not swept: %s", type(error).__name__)
        return
    if deleted:
        log.info("deleted %d orphan batch file(s) at the provider: %s", len(deleted), deleted)


def _prune_batches(conn: Any) -> None:
    """Forget batch submissions finished before the retention, with their lines (ADR 0148)."""
    from replayable.stages.embed.batch_files import RETENTION_DAYS, prune_finished_submissions

    pruned = prune_finished_submissions(conn)
    if pruned:
        log.info("forgot %d batch submission(s) finished over %d days ago", pruned, RETENTION_DAYS)


def sweep(
    pipeline_dag_id: str = PIPELINE_DAG_ID,
    postgres_conn_id: str = LEDGER_CONN_ID,
    model_conn_id: str = MODEL_CONN_ID,
) -> list[dict[str, Any]]:
    """Find the failed items runs of ``pipeline_dag_id`` left; return one re-run per stage.

    It also purges what documents retracted over ``mirror.RETENTION_DAYS`` ago alone held
    (ADR 0138).

    The requests are ``TriggerDagRunOperator`` arguments for that pipeline; an empty list
    maps no trigger, so a sweep with nothing to do starts nothing. Items are matched against
    the spec a run with the default settings has now (ADR 0042, 0109).
    """
    from replayable import sweeper

    context = common.get_current_context()
    ti = context["ti"]
    params = context["params"]
    max_attempts = int(params["max_attempts"])
    swept = pipeline_of(pipeline_dag_id)
    settings = PipelineSettings(max_attempts=max_attempts, stages=swept.names)
    hashes = swept.spec_hashes(
        settings, run_models(settings, ModelHook(model_conn_id).get_settings, swept.names)
    )
    dsn = connection_dsn(postgres_conn_id)
    conn = db.connect(dsn)
    try:
        found = sweeper.select_failed(
            conn,
            dag_id=swept.dag_id,
            stages=swept.names,
            spec_hashes=hashes,
            min_age_s=float(params["min_age_minutes"]) * 60,
            max_items=int(params["max_items"]),
            max_attempts=max_attempts,
        )
        if db.fetch_all(conn, "batches/any_submission"):
            _sweep_provider_files(conn, model_conn_id, dsn)
            _prune_batches(conn)
        # The purge writes columns a pipeline's plan migrates in; a sweep may come first.
        db.migrate(conn)
        purged = mirror.purge(conn)
        if purged:
            log.info(
                "purged %d document(s) retracted over %d days ago: what only they held is gone",
                purged,
                mirror.RETENTION_DAYS,
            )
    finally:
        conn.close()
    if not found.items:
        log.info("nothing to sweep: no failed item under the cap is old enough")
        return []
    log.info(
        "sweeping %d item(s), the oldest failed at %s: %s",
        found.items,
        found.oldest,
        {stage: len(docs) for stage, docs in found.by_stage.items()},
    )
    if found.unrun:
        log.info(
            "and re-running from a stage another pipeline finished, whose later stages never"
            " ran here: %s",
            {stage: len(docs) for stage, docs in found.unrun.items()},
        )
    return sweeper.rerun_requests(found, sweep_run_id=ti.run_id, max_attempts=max_attempts)
