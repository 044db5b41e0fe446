"""Discover PDFs, plan batches, extract → chunk → embed each batch; report; publish events."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from airflow.sdk import dag, task, task_group

from replayable import (
    IdempotentStageOperator,
    PublishEventsOperator,
    dag_tasks,
    pipeline_params,
    sources,
)

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "samples"
LABEL = "{{ task.batch['label'] }}"


@dag(
    schedule=None,
    catchup=False,
    params=pipeline_params(str(SAMPLES), sources.allowed_roots()),
    render_template_as_native_obj=True,
    default_args={"retries": 4, "retry_delay": timedelta(seconds=5)},
    tags=["replayable"],
    doc_md=__doc__,
)
def document_pipeline() -> None:
    discovered = task(dag_tasks.discover)()
    batches = task(dag_tasks.plan)(discovered)

    @task_group(group_id="batch")
    def process(batch: dict[str, object]) -> None:
        extract = IdempotentStageOperator(
            task_id="extract", stage="extract", batch=batch, map_index_template=LABEL
        )
        chunk = IdempotentStageOperator(
            task_id="chunk",
            stage="chunk",
            batch=batch,
            map_index_template=LABEL,
            trigger_rule="none_failed",
        )
        embed = IdempotentStageOperator(
            task_id="embed",
            stage="embed",
            batch=batch,
            map_index_template=LABEL,
            trigger_rule="none_failed",
        )
        extract >> chunk >> embed

    done = process.expand(batch=batches)
    report = task(dag_tasks.report, trigger_rule="all_done")()
    # A teardown runs however the run went, and the run's state stays the report's verdict.
    done >> report >> PublishEventsOperator(task_id="publish").as_teardown()


document_pipeline()
