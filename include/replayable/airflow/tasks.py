"""Task callables of the document pipeline that are not stages: plan (with discover), report.

Each returns a small reference or a count, never a list of documents (ADR 0010): the run's
documents and batches live in the ``run_docs`` table.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from airflow.sdk import TaskGroup, get_current_context
from airflow.sdk.exceptions import AirflowFailException, DownstreamTasksSkipped

from replayable import config, db, mirror, pipeline, sources, stage_identity
from replayable.airflow.context import triggered_by
from replayable.airflow.hooks import ModelHook, connection_dsn
from replayable.models.choice import run_models
from replayable.pipelines import pipeline_of
from replayable.settings import PipelineSettings, check_conf_keys
from replayable.vocabulary import LEDGER_CONN_ID, MODEL_CONN_ID, PIPELINE_DAG_ID

log = logging.getLogger(__name__)

T = TypeVar("T")


def _on_database(conn_id: str, fn: Callable[[db.Connection], T], describe: str) -> T:
    """Run ``fn`` on the replayable database and commit, waiting out a restart (ADR 13).

    A task that starts while Postgres restarts waits for it instead of failing a try; ``fn``
    may run again after a lost connection, which each of these steps allows, as a task
    retry would.
    """
    database = db.Database(connection_dsn(conn_id))
    try:
        return database.transaction(fn, describe=describe)
    finally:
        database.close()


def plan(
    postgres_conn_id: str = LEDGER_CONN_ID, model_conn_id: str = MODEL_CONN_ID
) -> list[dict[str, Any]]:
    """Record the run's documents, then map the ones with work left into batches.

    A plain run lists ``source`` (inside the allowed roots) and reads only new or changed
    files; a ``rerun`` or ``redrive`` run picks its documents with a query over the ledger.
    Then one statement decides which have work left under the current keys; their batches
    (never more than ``[core] max_map_length``) are what the mapped task group expands over.
    Discovering and planning are one task: a run with nothing to do costs as few task
    instances as it can (B1 in bench/).
    """
    context = get_current_context()
    ti = context["ti"]
    # Airflow takes any key into a run's conf; one no param has is refused here, before the
    # run does anything on defaults the caller did not mean (ADR 0077).
    try:
        check_conf_keys(getattr(context.get("dag_run"), "conf", None) or {})
    except ValueError as error:
        raise AirflowFailException(str(error)) from None
    settings = PipelineSettings.from_params(context["params"])
    stages = pipeline_of(ti.dag_id)
    try:
        stages.check(settings)
    except ValueError as error:
        raise AirflowFailException(str(error)) from None
    try:
        models = run_models(
            settings, ModelHook(model_conn_id).get_settings, stages.effective_stages(settings)
        )
    except ValueError as error:  # a setting the model connection does not allow
        raise AirflowFailException(str(error)) from None
    hashes = stages.spec_hashes(settings, models)
    max_map_length = config.max_map_length()
    slots = config.batch_slots()
    found = stage_identity.identities(stages, settings, models)

    def record_identities(conn: db.Connection) -> None:
        db.migrate(conn)
        stage_identity.record(conn, found, dag_id=ti.dag_id)

    # Its own short transaction: the rows it locks are every pipeline's (ADR 0140).
    try:
        _on_database(postgres_conn_id, record_identities, "stage identities")
    except stage_identity.StageIdentityError as error:
        raise AirflowFailException(str(error)) from None

    def record_and_plan(conn: db.Connection) -> tuple[int, list[dict[str, Any]]]:
        documents = _record_documents(conn, settings, context)
        pipeline.record_run_settings(
            conn, dag_id=ti.dag_id, run_id=ti.run_id, params=dict(context["params"])
        )
        pipeline.record_embed_mode(conn, settings, dag_id=ti.dag_id, run_id=ti.run_id)
        batches = pipeline.plan_batches(
            conn,
            settings,
            dag_id=ti.dag_id,
            run_id=ti.run_id,
            spec_hashes=hashes,
            stages=stages,
            max_map_length=max_map_length,
            slots=slots,
            revived_by=triggered_by(context),
        )
        return documents, batches

    documents, batches = _on_database(postgres_conn_id, record_and_plan, "plan")
    to_do = sum(batch["size"] for batch in batches)
    log.info("%d documents, %d with work left, in %d batches", documents, to_do, len(batches))
    return batches


def plan_task(
    postgres_conn_id: str = LEDGER_CONN_ID, model_conn_id: str = MODEL_CONN_ID
) -> list[dict[str, Any]]:
    """The ``plan`` task: :func:`plan`, and with no batch, skip the batch tasks itself.

    Tasks mapped over no batch end skipped in any case; Airflow's scheduler finds that out one
    stage per loop, a stage after the one it reads, which was most of an identical re-run's
    time (B1 in bench/). Here they end skipped with the plan, so ``report`` is due at once
    (ADR 0124). The empty list is still pushed as the mapped length a cleared batch task
    expands over (to none, so skipped again), as Airflow records it for a returned value.
    """
    batches = plan(postgres_conn_id, model_conn_id)
    if batches:
        return batches
    from airflow.sdk.execution_time.xcom import XCom  # the configured XCom backend

    context = get_current_context()
    ti = context["ti"]
    XCom.set(
        XCom.XCOM_RETURN_KEY,
        batches,
        dag_id=ti.dag_id,
        task_id=ti.task_id,
        run_id=ti.run_id,
        map_index=ti.map_index,
        _mapped_length=0,
    )
    mapped = [
        task
        for node in context["task"].iter_mapped_dependants()
        for task in (node.iter_tasks() if isinstance(node, TaskGroup) else (node,))
    ]
    skipped = sorted(task.task_id for task in mapped)
    # The Task SDK 3.3 declares this exception's __init__ without types.
    raise DownstreamTasksSkipped(tasks=skipped)  # type: ignore[no-untyped-call]


def _record_documents(conn: db.Connection, settings: PipelineSettings, context: Any) -> int:
    ti = context["ti"]
    if settings.rerun or settings.redrive:
        documents = pipeline.select_documents(conn, settings, dag_id=ti.dag_id, run_id=ti.run_id)
        what = "rerun" if settings.rerun else "redrive"
        log.info(
            "%s selected %d documents: %s", what, documents, settings.rerun or settings.redrive
        )
        return documents
    try:
        documents = pipeline.discover(
            conn,
            settings.source,
            dag_id=ti.dag_id,
            run_id=ti.run_id,
            roots=sources.allowed_roots(),
            max_bytes=settings.max_bytes,
            policy=mirror.Policy(settings.max_retract_fraction, settings.confirm_retract),
        )
    except sources.SourceError as error:
        raise AirflowFailException(str(error)) from error
    log.info("discovered %d documents in %s", documents, settings.source)
    return documents


def report(postgres_conn_id: str = LEDGER_CONN_ID) -> dict[str, Any]:
    """Log the run's counts per stage and status; fail the run if any item is left to do, if
    it refused to retract what its source lost (ADR 0138), or if it dead-lettered more of its
    documents than its ``max_dead_fraction``."""
    context = get_current_context()
    ti = context["ti"]
    settings = PipelineSettings.from_params(context["params"])
    stages = pipeline_of(ti.dag_id)
    result = _on_database(
        postgres_conn_id,
        lambda conn: pipeline.build_report(
            conn,
            dag_id=ti.dag_id,
            run_id=ti.run_id,
            stages_run=stages.effective_stages(settings),
            pipeline_stages=stages.names,
        ),
        "report",
    )
    log.info("run report\n%s", pipeline.format_report(result))
    unfinished = {
        stage: entry.get("failed", 0) + entry.get("running", 0) + entry.get("pending", 0)
        for stage, entry in result["stages"].items()
    }
    if any(unfinished.values()):
        raise AirflowFailException(f"items left to do after this run: {unfinished}")
    if (result.get("mirror") or {}).get("refused"):
        raise AirflowFailException(result["mirror"]["refused"])
    too_many = pipeline.over_dead_fraction(result, settings.max_dead_fraction)
    if too_many is not None:
        raise AirflowFailException(too_many)
    return result


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

    context = get_current_context()
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
