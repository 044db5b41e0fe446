"""The ``report`` task: the run's counts per stage and status, and whether the run fails."""

from __future__ import annotations

import logging
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from replayable import pipeline
from replayable.airflow.tasks import common
from replayable.pipeline.registry import pipeline_of
from replayable.settings import PipelineSettings
from replayable.vocabulary import LEDGER_CONN_ID

log = logging.getLogger(__name__)


def report(postgres_conn_id: str = LEDGER_CONN_ID) -> dict[str, Any]:
    """Log the run's counts per stage and status; fail the run if any item is left to do, if
    it refused to retract what its source lost (ADR 0138), or if it dead-lettered more of its
    documents than its ``max_dead_fraction``."""
    context = common.get_current_context()
    ti = context["ti"]
    settings = PipelineSettings.from_params(context["params"])
    stages = pipeline_of(ti.dag_id)
    result = common.on_database(
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
