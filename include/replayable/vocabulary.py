"""The names every layer shares, defined once: stages, statuses, DAG and connection ids.

Nothing here imports Airflow or the database, so the CLI, the UI, the metrics, the DAG files
and the SQL-facing code all read the same words from one place. The few defaults that more
than one layer states (the two leases, an item's attempt cap) are defined here too.
"""

from __future__ import annotations

import re

# The stages of the document pipeline, in the order they run and are listed; which one reads
# which is their definition's (replayable.stages.builtin).
STAGES = ("extract", "chunk", "embed", "summarize")
# The stages a run executes unless its conf names others: summaries are chat completions,
# many times the price of embeddings, so a run asks for them ("stages": [..., "summarize"]).
DEFAULT_STAGES = ("extract", "chunk", "embed")
# A stage's name, the shipped ones' and your own (replayable.stage): its identity in the
# ledger, a metrics label, a URL filter and a SQL value alike.
STAGE_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,39}$"


def is_stage_name(value: object) -> bool:
    """Whether ``value`` can name a stage (:data:`STAGE_NAME_PATTERN`)."""
    return isinstance(value, str) and re.match(STAGE_NAME_PATTERN, value) is not None


# An item's life in stage_runs (ARCHITECTURE.md, data model).
ITEM_STATUSES = ("pending", "running", "done", "failed", "dead")
# A dead letter's work-list state.
DEAD_LETTER_STATUSES = ("open", "redriven", "ignored")
# An outbox event's delivery state.
OUTBOX_STATUSES = ("pending", "published", "dead")

# The DAGs this package ships in dags/.
PIPELINE_DAG_ID = "document_pipeline"
SWEEPER_DAG_ID = "replayable_sweeper"
OUTBOX_PUBLISHER_DAG_ID = "outbox_publisher"
DEAD_LETTER_WATCH_DAG_ID = "dead_letter_watch"

# The Airflow connections the hooks read.
LEDGER_CONN_ID = "replayable_db"
MODEL_CONN_ID = "replayable_model"
# The webhooks: outbox events (replayable.airflow.sinks) and dead-letter alerts (notifications).
EVENTS_CONN_ID = "replayable_events"
ALERTS_CONN_ID = "replayable_alerts"

# The environment variable the CLI reads for the ledger's libpq URI.
DATABASE_URL_ENV = "REPLAYABLE_DATABASE_URL"

# ---- defaults more than one layer states (ADR 0098) ----------------------------------------

# How long a claim on an item in stage_runs lasts: the `lease_s` param of document_pipeline,
# and the ledger's own default. (An outbox event's claim is another lease, with its default
# in replayable.outbox.PublishLimits.)
ITEM_LEASE_S = 600.0
# Attempts an item gets in a stage before it is dead-lettered (the `max_attempts` param).
ITEM_MAX_ATTEMPTS = 3
