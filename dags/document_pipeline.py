"""Discover PDFs, plan the batches with work left, extract → chunk → embed (and, when a
run's ``stages`` name it, extract → summarize); report; publish."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from airflow.sdk import dag, task, task_group

from replayable import (
    TASK_TIMEOUTS,
    IdempotentStageOperator,
    PublishEventsOperator,
    dag_tasks,
    pipeline_params,
    sources,
)
from replayable.vocabulary import PIPELINE_DAG_ID

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "samples"
LABEL = "{{ task.batch['label'] }}"
# Backstops fixed at parse time; each batch also keeps its run's own deadline (ADR 0012).
STAGE = {"map_index_template": LABEL, "execution_timeout": TASK_TIMEOUTS["stage"]}


@dag(
    dag_id=PIPELINE_DAG_ID,
    schedule=None,
    catchup=False,
    params=pipeline_params(str(SAMPLES), sources.allowed_roots()),
    render_template_as_native_obj=True,
    default_args={"retries": 4, "retry_delay": timedelta(seconds=5)},
    tags=["replayable"],
    doc_md=__doc__,
)
def document_pipeline() -> None:
    batches = task(dag_tasks.plan, execution_timeout=TASK_TIMEOUTS["plan"])()

    @task_group(group_id="batch")
    def process(batch: dict[str, object]) -> None:
        extract = IdempotentStageOperator(task_id="extract", stage="extract", batch=batch, **STAGE)
        chunk = IdempotentStageOperator(
            task_id="chunk", stage="chunk", batch=batch, trigger_rule="none_failed", **STAGE
        )
        embed = IdempotentStageOperator(
            task_id="embed", stage="embed", batch=batch, trigger_rule="none_failed", **STAGE
        )
        # Reads the extracted text, as chunk does; skipped unless the run's stages name it.
        summarize = IdempotentStageOperator(
            task_id="summarize",
            stage="summarize",
            batch=batch,
            trigger_rule="none_failed",
            **STAGE,
        )
        extract >> chunk >> embed
        extract >> summarize

    done = process.expand(batch=batches)
    report = task(
        dag_tasks.report, trigger_rule="all_done", execution_timeout=TASK_TIMEOUTS["report"]
    )()
    # A teardown runs however the run went, and the run's state stays the report's verdict.
    (
        done
        >> report
        >> PublishEventsOperator(
            task_id="publish", execution_timeout=TASK_TIMEOUTS["report"]
        ).as_teardown()
    )


document_pipeline()
