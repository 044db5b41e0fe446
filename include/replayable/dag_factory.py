"""``pipeline_dag``: a document pipeline DAG from a list of stages.

Every pipeline has the same shape: ``plan`` (discover, or a re-run's selection, then the
batches with work left), one mapped task group per batch with a task per stage (each after
the stage it reads, ``none_failed``, so a stage a run skips lets its readers run), then
``report`` and the ``publish`` teardown. The pipeline is registered under its DAG id, so each
task finds its stages again when the worker parses the file (:func:`replayable.stage.pipeline_of`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import DAG, dag, task, task_group

from replayable import dag_tasks, sources
from replayable.operators import IdempotentStageOperator
from replayable.params import pipeline_params
from replayable.publisher import PublishEventsOperator
from replayable.settings import TASK_TIMEOUTS
from replayable.stage import Pipeline, Stage, register

LABEL = "{{ task.batch['label'] }}"


def pipeline_dag(
    dag_id: str,
    stages: Sequence[Stage],
    *,
    source: str,
    default_stages: Sequence[str] = (),
    schedule: Any = None,
    retries: int = 4,
    retry_delay: timedelta = timedelta(seconds=5),
    tags: Sequence[str] = ("replayable",),
    doc_md: str | None = None,
    **dag_args: Any,
) -> DAG:
    """Build (and register) the DAG of a pipeline of ``stages``, in order.

    :param source: the default ``source`` param: a folder, file or glob of PDFs inside the
        allowed roots.
    :param default_stages: the stages a run executes when its conf names none (default:
        every stage).
    :param schedule: the DAG's schedule; None: runs are triggered.
    :param dag_args: passed to ``@dag`` (``start_date``, ``max_active_runs``, …).
    """
    pipeline = register(Pipeline(dag_id, tuple(stages), default_stages=tuple(default_stages)))
    # Backstops fixed at parse time; each batch also keeps its run's own deadline (ADR 0012).
    stage_args: dict[str, Any] = {
        "map_index_template": LABEL,
        "execution_timeout": TASK_TIMEOUTS["stage"],
    }
    dag_args.setdefault("catchup", False)

    @dag(
        dag_id=dag_id,
        schedule=schedule,
        params=pipeline_params(
            source,
            sources.allowed_roots(),
            stages=pipeline.names,
            default_stages=pipeline.defaults,
        ),
        render_template_as_native_obj=True,
        default_args={"retries": retries, "retry_delay": retry_delay},
        tags=list(tags),
        doc_md=doc_md,
        **dag_args,
    )
    def build() -> None:
        batches = task(execution_timeout=TASK_TIMEOUTS["plan"])(dag_tasks.plan)()

        @task_group(group_id="batch")
        def process(batch: dict[str, object]) -> None:
            made: dict[str, IdempotentStageOperator] = {}
            for stage in pipeline.stages:
                # A stage that reads another waits for it; a skipped input lets it run.
                rule: dict[str, Any] = {"trigger_rule": "none_failed"} if stage.reads else {}
                made[stage.name] = IdempotentStageOperator(
                    task_id=stage.name,
                    stage=stage.name,
                    batch=batch,
                    pipeline=pipeline,
                    **rule,
                    **stage_args,
                )
                if stage.reads is not None:
                    made[stage.reads] >> made[stage.name]

        done = process.expand(batch=batches)
        report = task(trigger_rule="all_done", execution_timeout=TASK_TIMEOUTS["report"])(
            dag_tasks.report
        )()
        # A teardown runs however the run went, and the run's state stays the report's verdict.
        (
            done
            >> report
            >> PublishEventsOperator(
                task_id="publish", execution_timeout=TASK_TIMEOUTS["report"]
            ).as_teardown()
        )

    return build()
