"""``pipeline_dag``: a document pipeline DAG from a list of stages.

Every pipeline has the same shape: ``plan`` (discover, or a re-run's selection, then the
batches with work left), one mapped task group per batch with a task per stage (each after
the stage it reads, ``none_failed``, so a stage a run skips lets its readers run), then
``report`` and the ``publish`` teardown. The pipeline is registered under its DAG id, so
each task finds its stages again when the worker parses the file
(:func:`replayable.pipeline.registry.pipeline_of`).

Beside it, in the same file, the pipeline gets its sweeper DAG (ADR 0042, 0109), so the
sweep's task finds the same stages when its worker parses that file.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import DAG, Param, dag, task, task_group

from replayable import config, sources
from replayable.airflow import tasks
from replayable.airflow.operators import IdempotentStageOperator
from replayable.airflow.params import pipeline_params
from replayable.airflow.publisher import PublishEventsOperator
from replayable.knobs import KNOB
from replayable.pipeline.registry import register
from replayable.settings import TASK_TIMEOUTS
from replayable.stage import Pipeline, Stage

LABEL = "{{ task.batch['label'] }}"


def pipeline_dag(
    dag_id: str,
    stages: Sequence[Stage],
    *,
    source: str,
    default_stages: Sequence[str] = (),
    schedule: Any = None,
    sweeper: str | bool = True,
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
    :param sweeper: the id of the pipeline's hourly sweeper DAG (True: ``<dag_id>_sweeper``;
        False: none), which re-runs the items the pipeline's runs left failed under their
        attempt cap.
    :param dag_args: passed to ``@dag`` (``start_date``, ``max_active_runs``, …).
    """
    pipeline = register(Pipeline(dag_id, tuple(stages), default_stages=tuple(default_stages)))
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
        batches = task(task_id="plan", execution_timeout=TASK_TIMEOUTS["plan"])(tasks.plan_task)()

        @task_group(group_id="batch")
        def process(batch: dict[str, object]) -> None:
            _stage_tasks(pipeline, batch)

        done = process.expand(batch=batches)
        report = task(trigger_rule="all_done", execution_timeout=TASK_TIMEOUTS["report"])(
            tasks.report
        )()
        # A teardown runs however the run went, and the run's state stays the report's verdict.
        (
            done
            >> report
            >> PublishEventsOperator(
                task_id="publish", execution_timeout=TASK_TIMEOUTS["report"]
            ).as_teardown()
        )

    if sweeper:
        sweeper_dag(pipeline, f"{dag_id}_sweeper" if sweeper is True else sweeper)
    return build()


def _stage_tasks(pipeline: Pipeline, batch: dict[str, object]) -> None:
    """One operator per stage over ``batch``, each after the stage it reads."""
    made: dict[str, IdempotentStageOperator] = {}
    for stage in pipeline.stages:
        # A stage that reads another waits for it; a skipped input lets it run.
        rule: dict[str, Any] = {"trigger_rule": "none_failed"} if stage.reads else {}
        made[stage.name] = IdempotentStageOperator(
            task_id=stage.name,
            stage=stage.name,
            batch=batch,
            pipeline=pipeline,
            map_index_template=LABEL,
            # A backstop fixed at parse time; each batch also keeps its run's own deadline
            # (ADR 0012).
            execution_timeout=TASK_TIMEOUTS["stage"],
            **rule,
        )
        if stage.reads is not None:
            made[stage.reads] >> made[stage.name]


SWEEPER_DOC = """Hourly, re-run the items `{pipeline}`'s runs left failed under their cap.

`sweep` selects at most `max_items` items that runs of `{pipeline}` left failed, older than
`min_age_minutes` (so a live run's own retries are not raced) and past any Retry-After, and
asks for one `{pipeline}` re-run per stage (and per settings, for items failed under a run's
own); with nothing to sweep it asks for none and nothing is triggered. Each
trigger waits (deferred, no worker slot) until its re-run ends, so with `max_active_runs=1`
no later sweep starts while a re-run it would sweep again is unfinished. See
`replayable.sweeper`, ADR 0042, 0076 and 0109.
"""


def sweeper_dag(pipeline: Pipeline, dag_id: str) -> DAG:
    """The sweeper DAG of ``pipeline``: an hourly sweep, then one mapped re-run per stage."""

    @dag(
        dag_id=dag_id,
        schedule="@hourly",
        catchup=False,
        max_active_runs=1,
        params={
            "min_age_minutes": Param(30, type="number", minimum=0, maximum=7 * 24 * 60),
            "max_items": Param(500, type="integer", minimum=1, maximum=5000),
            "max_attempts": Param(
                KNOB["max_attempts"].default,
                **KNOB["max_attempts"].json_schema(),
                description="Items at this many attempts are left alone; the re-run uses it too.",
            ),
        },
        tags=["replayable"],
        doc_md=SWEEPER_DOC.format(pipeline=pipeline.dag_id),
    )
    def build() -> None:
        reruns = task(tasks.sweep)(pipeline.dag_id)
        TriggerDagRunOperator.partial(
            task_id="trigger_rerun",
            trigger_dag_id=pipeline.dag_id,
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

    return build()
