"""The names every layer shares, defined once: stages, statuses, DAG and connection ids.

Nothing here imports Airflow or the database, so the CLI, the UI, the metrics, the DAG files
and the SQL-facing code all read the same words from one place. The few defaults that more
than one layer states (the two leases, an item's attempt cap) are defined here too.
"""

from __future__ import annotations

# The stages of the document pipeline, in the order they run and are listed.
STAGES = ("extract", "chunk", "embed", "summarize")
# The stage whose output each one reads (None: the document itself). Re-running a stage
# re-runs the stages that read it, and no further (ADR 0107).
STAGE_INPUTS: dict[str, str | None] = {
    "extract": None,
    "chunk": "extract",
    "embed": "chunk",
    "summarize": "extract",
}
# The stages a run executes unless its conf names others: summaries are chat completions,
# many times the price of embeddings, so a run asks for them ("stages": [..., "summarize"]).
DEFAULT_STAGES = ("extract", "chunk", "embed")


def downstream(stage: str) -> tuple[str, ...]:
    """``stage`` and every stage that reads its output, directly or not, in STAGES order."""
    found = {stage}
    for name in STAGES:  # an input always comes before its readers
        if STAGE_INPUTS[name] in found:
            found.add(name)
    return tuple(name for name in STAGES if name in found)


def stage_paths() -> tuple[tuple[str, ...], ...]:
    """Each chain of inputs from a document to a stage no other stage reads, input first."""
    read = {source for source in STAGE_INPUTS.values() if source}
    paths = []
    for leaf in (name for name in STAGES if name not in read):
        path: list[str] = []
        at: str | None = leaf
        while at is not None:
            path.insert(0, at)
            at = STAGE_INPUTS[at]
        paths.append(tuple(path))
    return tuple(paths)


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
# The webhooks: outbox events (replayable.sinks) and dead-letter alerts (notifications).
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
