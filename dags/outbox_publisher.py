"""Every 10 minutes, deliver the outbox events that no pipeline run delivered.

Each run of document_pipeline publishes at its end; this DAG picks up what is left: events
whose delivery failed and is due again, and events of runs whose publish task did not run.
See `replayable.airflow.publisher` and ADR 0041.
"""

from __future__ import annotations

from airflow.sdk import Param, dag

from replayable import PublishEventsOperator
from replayable.outbox import PublishLimits
from replayable.vocabulary import OUTBOX_PUBLISHER_DAG_ID

DEFAULTS = PublishLimits()


@dag(
    dag_id=OUTBOX_PUBLISHER_DAG_ID,
    schedule="*/10 * * * *",
    catchup=False,
    max_active_runs=1,
    params={
        "max_events": Param(DEFAULTS.max_events, type="integer", minimum=1, maximum=1_000_000),
        "batch_size": Param(DEFAULTS.claim_size, type="integer", minimum=1, maximum=1000),
        "lease_s": Param(DEFAULTS.lease_s, type="number", minimum=60, maximum=3600),
        "max_attempts": Param(DEFAULTS.max_attempts, type="integer", minimum=1, maximum=20),
    },
    render_template_as_native_obj=True,
    tags=["replayable"],
    doc_md=__doc__,
)
def outbox_publisher() -> None:
    PublishEventsOperator(
        task_id="publish",
        max_events="{{ params.max_events }}",
        batch_size="{{ params.batch_size }}",
        lease_s="{{ params.lease_s }}",
        max_attempts="{{ params.max_attempts }}",
    )


outbox_publisher()
