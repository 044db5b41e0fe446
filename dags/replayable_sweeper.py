"""Hourly, re-run the items that runs left failed under their attempt cap.

`sweep` selects at most `max_items` failed items older than `min_age_minutes` (so a live
run's own retries are not raced) and asks for one `document_pipeline` re-run per stage;
with nothing to sweep it asks for none and nothing is triggered. Each trigger waits (deferred,
no worker slot) until its re-run ends, so with `max_active_runs=1` no later sweep starts
while a re-run it would sweep again is unfinished. See `replayable.sweeper`, ADR 0042 and
ADR 0076.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import Param, dag, task

from replayable import PipelineSettings, config, dag_tasks
from replayable.vocabulary import PIPELINE_DAG_ID, SWEEPER_DAG_ID


@dag(
    dag_id=SWEEPER_DAG_ID,
    schedule="@hourly",
    catchup=False,
    max_active_runs=1,
    params={
        "min_age_minutes": Param(30, type="number", minimum=0, maximum=7 * 24 * 60),
        "max_items": Param(500, type="integer", minimum=1, maximum=5000),
        "max_attempts": Param(
            PipelineSettings().max_attempts,
            type="integer",
            minimum=1,
            maximum=20,
            description="Items at this many attempts are left alone; the re-run uses it too.",
        ),
    },
    tags=["replayable"],
    doc_md=__doc__,
)
def replayable_sweeper() -> None:
    reruns = task(dag_tasks.sweep)()
    TriggerDagRunOperator.partial(
        task_id="trigger_rerun",
        trigger_dag_id=PIPELINE_DAG_ID,
        logical_date=None,
        skip_when_already_exists=True,
        wait_for_completion=True,
        deferrable=True,
        poke_interval=config.sweeper_poke_interval_s(),
        # A re-run that never ends (its DAG paused for good) holds sweeping up this long.
        execution_timeout=timedelta(hours=12),
        openlineage_inject_parent_info=False,
        map_index_template="{{ task.conf['rerun']['stage'] }}",
    ).expand_kwargs(reruns)


replayable_sweeper()
