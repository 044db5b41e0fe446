"""Task callables of the document pipeline that are not stages: discover, plan, report.

Each returns a small reference or a count, never a list of documents (ADR 0010): the run's
documents and batches live in the ``run_docs`` table.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from airflow.configuration import conf
from airflow.sdk import get_current_context
from airflow.sdk.exceptions import AirflowFailException

from replayable import db, pipeline, sources
from replayable.operators import connection_dsn, model_choice, triggered_by
from replayable.settings import PipelineSettings

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


def discover(postgres_conn_id: str = "replayable_db") -> dict[str, Any]:
    """Apply migrations, then record the run's documents; return how many there are.

    A plain run lists ``source`` (inside the allowed roots) and reads only new or changed
    files. A ``rerun`` or ``redrive`` run picks its documents with a query over the ledger.
    """
    context = get_current_context()
    ti = context["ti"]
    settings = PipelineSettings.from_params(context["params"])

    def record(conn: db.Connection) -> int:
        db.migrate(conn)
        if settings.rerun or settings.redrive:
            documents = pipeline.select_documents(
                conn, settings, dag_id=ti.dag_id, run_id=ti.run_id, by=triggered_by(context)
            )
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
            )
        except sources.SourceError as error:
            raise AirflowFailException(str(error)) from error
        log.info("discovered %d documents in %s", documents, settings.source)
        return documents

    documents = _on_database(postgres_conn_id, record, "discover")
    return {"documents": documents}


def plan(
    discovered: dict[str, Any],
    postgres_conn_id: str = "replayable_db",
    model_conn_id: str = "replayable_model",
) -> list[dict[str, Any]]:
    """Map only the documents with work left, in batches of at most ``[core] max_map_length``."""
    from replayable.specs import spec_hashes

    context = get_current_context()
    ti = context["ti"]
    settings = PipelineSettings.from_params(context["params"])
    if "embed" in settings.effective_stages:
        choice = model_choice(settings, model_conn_id)
        model, dimensions = choice.model, choice.dimensions
    else:
        model, dimensions = settings.model or "", settings.dimensions
    hashes = spec_hashes(settings.chunk_config, model, dimensions)
    max_map_length = conf.getint("core", "max_map_length", fallback=1024)
    batches = _on_database(
        postgres_conn_id,
        lambda conn: pipeline.plan_batches(
            conn,
            settings,
            dag_id=ti.dag_id,
            run_id=ti.run_id,
            spec_hashes=hashes,
            max_map_length=max_map_length,
        ),
        "plan",
    )
    to_do = sum(batch["size"] for batch in batches)
    log.info(
        "%d documents, %d with work left, in %d batches",
        discovered.get("documents", 0),
        to_do,
        len(batches),
    )
    return batches


def report(postgres_conn_id: str = "replayable_db") -> dict[str, Any]:
    """Log the run's counts per stage and status; fail the run if any item is left to do."""
    ti = get_current_context()["ti"]
    result = _on_database(
        postgres_conn_id,
        lambda conn: pipeline.build_report(conn, dag_id=ti.dag_id, run_id=ti.run_id),
        "report",
    )
    log.info("run report\n%s", pipeline.format_report(result))
    unfinished = {
        stage: entry.get("failed", 0) + entry.get("running", 0) + entry.get("pending", 0)
        for stage, entry in result["stages"].items()
    }
    if any(unfinished.values()):
        raise AirflowFailException(f"items left to do after this run: {unfinished}")
    return result
