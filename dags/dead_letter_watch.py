"""Every 15 minutes, watch how fast dead letters arrive and alert on a spike.

The sensor waits for more than `max_new` new dead letters within `window_minutes`; when it
fires, `alert` fails the run with the numbers, and its failure callback posts them to the
webhook of the Airflow connection `replayable_alerts`. A quiet interval ends with the
sensor skipped and the run green; a watch that cannot read the ledger fails the sensor and
posts that instead. See `replayable.airflow.sensors` and `replayable.airflow.notifications`.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from replayable.airflow.notifications import WebhookNotifier
from replayable.airflow.sensors import DeadLetterGrowthSensor, alert
from replayable.vocabulary import DEAD_LETTER_WATCH_DAG_ID, STAGE_NAME_PATTERN, STAGES

INTERVAL_S = 15 * 60


@dag(
    dag_id=DEAD_LETTER_WATCH_DAG_ID,
    schedule="*/15 * * * *",
    catchup=False,
    max_active_runs=1,
    params={
        "window_minutes": Param(60, type="integer", minimum=1, maximum=7 * 24 * 60),
        "max_new": Param(
            10, type="integer", minimum=0, description="Alert above this many new letters."
        ),
        "stage": Param(
            None,
            type=["null", "string"],
            pattern=STAGE_NAME_PATTERN,
            description=f"One stage's letters only: {', '.join(STAGES)} or one of your own.",
        ),
        "poke_interval_s": Param(60, type="integer", minimum=1, maximum=INTERVAL_S),
        # A little under the schedule interval, so the next run finds this one finished.
        "timeout_s": Param(INTERVAL_S - 60, type="integer", minimum=1, maximum=INTERVAL_S),
    },
    render_template_as_native_obj=True,  # a null stage must reach the sensor as None
    tags=["replayable"],
    doc_md=__doc__,
)
def dead_letter_watch() -> None:
    spike = DeadLetterGrowthSensor(
        task_id="wait_for_growth",
        window_minutes="{{ params.window_minutes }}",
        max_new="{{ params.max_new }}",
        stage="{{ params.stage }}",
        mode="reschedule",
        poke_interval="{{ params.poke_interval_s }}",
        timeout="{{ params.timeout_s }}",
        soft_fail=True,
        on_failure_callback=WebhookNotifier(title="Dead-letter watch failed"),
    )
    notify_spike = WebhookNotifier(title="Dead-letter spike")
    task(alert, task_id="alert", on_failure_callback=notify_spike)(spike.output)


dead_letter_watch()
