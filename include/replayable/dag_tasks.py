"""Task callables of the document pipeline that are not stages: discover, plan, report."""

from __future__ import annotations

import logging
from typing import Any

from airflow.configuration import conf
from airflow.sdk import get_current_context
from airflow.sdk.exceptions import AirflowFailException

from replayable import db, pipeline
from replayable.operators import connection_dsn, triggered_by
from replayable.settings import PipelineSettings

log = logging.getLogger(__name__)


def discover(postgres_conn_id: str = "replayable_db") -> list[str]:
    """Apply migrations, then choose the run's documents and return their ids.

    A plain run hashes and records every PDF of ``source``. A ``rerun`` or ``redrive``
    run picks its documents with a query over the ledger instead of listing the source.
    """
    context = get_current_context()
    settings = PipelineSettings.from_params(context["params"])
    conn = db.connect(connection_dsn(postgres_conn_id))
    try:
        db.migrate(conn)
        if settings.rerun or settings.redrive:
            doc_ids = pipeline.select_documents(conn, settings, by=triggered_by(context))
            what = "rerun" if settings.rerun else "redrive"
            log.info(
                "%s selected %d documents: %s",
                what,
                len(doc_ids),
                settings.rerun or settings.redrive,
            )
        else:
            doc_ids = pipeline.discover(conn, settings.source)
            log.info("discovered %d documents in %s", len(doc_ids), settings.source)
    finally:
        conn.close()
    return doc_ids


def plan(doc_ids: list[str]) -> list[dict[str, Any]]:
    """Split the documents into batches, never more than ``[core] max_map_length``."""
    params = get_current_context()["params"]
    batches = pipeline.plan_batches(
        doc_ids, params["batch_size"], conf.getint("core", "max_map_length", fallback=1024)
    )
    log.info("%d documents in %d batches", len(doc_ids), len(batches))
    return batches


def report(doc_ids: list[str], postgres_conn_id: str = "replayable_db") -> dict[str, Any]:
    """Log the run's counts per stage and status; fail the run if any item is left to do."""
    ti = get_current_context()["ti"]
    conn = db.connect(connection_dsn(postgres_conn_id))
    try:
        result = pipeline.build_report(conn, dag_id=ti.dag_id, run_id=ti.run_id, doc_ids=doc_ids)
    finally:
        conn.close()
    log.info("run report\n%s", pipeline.format_report(result))
    unfinished = {
        stage: entry.get("failed", 0) + entry.get("running", 0) + entry.get("pending", 0)
        for stage, entry in result["stages"].items()
    }
    if any(unfinished.values()):
        raise AirflowFailException(f"items left to do after this run: {unfinished}")
    return result
