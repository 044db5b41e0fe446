"""The ``plan`` task: discover (or select) the run's documents, then batch those with work.

It returns the batches' references, never a list of documents (ADR 0010).
"""

from __future__ import annotations

import logging
from typing import Any

from airflow.sdk import TaskGroup
from airflow.sdk.exceptions import AirflowFailException, DownstreamTasksSkipped

from replayable import config, db, mirror, pipeline, sources, stage_identity
from replayable.airflow.context import triggered_by
from replayable.airflow.hooks import ModelHook
from replayable.airflow.tasks import common
from replayable.models.choice import run_models
from replayable.pipeline.registry import pipeline_of
from replayable.settings import PipelineSettings, check_conf_keys
from replayable.vocabulary import LEDGER_CONN_ID, MODEL_CONN_ID

log = logging.getLogger(__name__)


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
    context = common.get_current_context()
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
        common.on_database(postgres_conn_id, record_identities, "stage identities")
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

    documents, batches = common.on_database(postgres_conn_id, record_and_plan, "plan")
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

    context = common.get_current_context()
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
