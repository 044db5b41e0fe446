"""The read model of the ledger: every read that the CLI and the UI both make, written once.

Each function takes an open connection (read-only is enough), runs queries from
``sql/queries`` with every value bound, and returns plain rows (``dict`` per row, as
:func:`replayable.db.fetch_all` gives them) or small frozen dataclasses. Nothing here
formats, pages by cursor string or knows about HTTP or terminals: the CLI renders tables and
JSON from these, the UI its models and pages. A filter left ``None`` means "any".

Every read here goes through indexes on current state or the counters (ARCHITECTURE.md,
invariant 10), so a person's page or command costs the same at a million documents.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from replayable import db
from replayable.vocabulary import ITEM_STATUSES, OUTBOX_STATUSES, PIPELINE_DAG_ID, STAGES

Row = dict[str, Any]
Moment = datetime | str | None  # a bound of a time filter: a datetime, or ISO 8601 text

# What a partial re-run selects, counted without recording a run (plan/select_rerun_docs
# applies the same filters when the run starts).
RERUN_COUNT = "plan/count_rerun_docs"


# The overview's and `status`'s window of costs when no run is named.
COST_DAYS = 30


@dataclasses.dataclass(frozen=True)
class ModelCost:
    """Answered calls of one model and mode: their tokens, and what they cost in USD at the
    prices of the time (``unpriced_calls`` of them had no price and count 0 in ``usd``)."""

    model: str
    mode: str
    calls: int
    input_tokens: int
    output_tokens: int
    usd: float
    unpriced_calls: int


@dataclasses.dataclass(frozen=True)
class Costs:
    """What model calls cost: in all, the calls no price covered, and by model and mode."""

    usd: float = 0.0
    unpriced_calls: int = 0
    by_model: tuple[ModelCost, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {
            "by_model": [dataclasses.asdict(m) for m in self.by_model]
        }


@dataclasses.dataclass(frozen=True)
class ModelCalls:
    """Billable model calls: all of them, the ones answered ok, and the tokens they used."""

    calls: int = 0
    ok: int = 0
    tokens: int = 0


@dataclasses.dataclass(frozen=True)
class StageSummary:
    """Items of one stage by their current status, and its open dead letters."""

    stage: str
    pending: int = 0
    running: int = 0
    done: int = 0
    failed: int = 0
    dead: int = 0
    total: int = 0
    open_dead_letters: int = 0


@dataclasses.dataclass(frozen=True)
class StageStatus(StageSummary):
    """One stage's items by current status, its open dead letters and its model calls."""

    model_calls: ModelCalls = ModelCalls()


@dataclasses.dataclass(frozen=True)
class Page:
    """Rows of one page, newest first, and how many rows match the filters in all."""

    matched: int
    rows: list[Row]


@dataclasses.dataclass(frozen=True)
class RedriveScope:
    """The open dead letters of one stage that a redrive would take, as the database saw them.

    ``ids`` lists the letters only when the redrive was asked for by id; ``as_of`` is when
    they were counted, which pins the end of a filtered redrive to what was shown;
    ``dag_id`` is the pipeline DAG that redrives them, the one whose run made the newest.
    """

    stage: str
    letters: int
    documents: int
    ids: list[int] | None
    as_of: datetime
    dag_id: str = PIPELINE_DAG_ID


@dataclasses.dataclass(frozen=True)
class OutboxCounts:
    """Outbox events per status (the counters) and the oldest pending one's age (None: none)."""

    pending: int
    published: int
    dead: int
    oldest_pending_age_s: float | None

    def by_status(self) -> dict[str, int]:
        """The counts keyed by status, in :data:`~replayable.vocabulary.OUTBOX_STATUSES` order."""
        return {status: int(getattr(self, status)) for status in OUTBOX_STATUSES}


# ---- helpers the readers share -----------------------------------------------------------


def matched(rows: list[Row]) -> int:
    """Take the ``matched`` window count off every row and return it; it is the same on each.

    The list queries carry the count of every match on each row, so that one query answers
    both the page and "n of m"; no rows means no match.
    """
    counts = [int(row.pop("matched")) for row in rows]
    return counts[0] if counts else 0


def unique(values: Iterable[Any] | None) -> list[Any] | None:
    """``values`` without repeats, in their first order; None for no values (a filter of any)."""
    found = list(dict.fromkeys(values)) if values is not None else []
    return found or None


def stage_order(found: Iterable[str]) -> list[str]:
    """The pipeline's stages in order (even when empty), then any others by name."""
    return [*STAGES, *sorted(set(found) - set(STAGES))]


def known_stages(conn: db.Connection) -> list[str]:
    """Every stage in :func:`stage_order`: the shipped ones, then every stage the ledger has
    items of (a stage of your own appears once a run has planned it)."""
    return stage_order(row["stage"] for row in db.fetch_all(conn, "views/known_stages"))


# ---- status per stage --------------------------------------------------------------------


def items_by_status(conn: db.Connection, run_id: str | None = None) -> dict[str, dict[str, int]]:
    """Per stage that has items: ``{status: n}`` for every item status, plus ``"total"``.

    Without ``run_id`` the counters answer; with it, only the documents that run touched.
    """
    params = {"run_id": run_id, "stages": known_stages(conn) if run_id else list(STAGES)}
    return {
        row["stage"]: {key: int(row[key]) for key in (*ITEM_STATUSES, "total")}
        for row in db.fetch_all(conn, "views/status_stages", params)
    }


def model_calls_by_stage(conn: db.Connection, run_id: str | None = None) -> dict[str, ModelCalls]:
    """Per stage that made any: its billable calls; with ``run_id``, that run's own calls."""
    params = {"run_id": run_id, "stages": list(STAGES)}
    return {
        row["stage"]: ModelCalls(int(row["calls"]), int(row["ok"]), int(row["tokens"] or 0))
        for row in db.fetch_all(conn, "views/status_model_calls", params)
    }


def model_costs(conn: db.Connection, run_id: str | None = None, days: int = COST_DAYS) -> Costs:
    """What answered model calls cost (ADR 0110): those of ``run_id``; without it, those of
    the last ``days`` days, from the counters."""
    by_model = tuple(
        ModelCost(
            model=row["model"],
            mode=row["mode"],
            calls=int(row["calls"]),
            input_tokens=int(row["input_tokens"]),
            output_tokens=int(row["output_tokens"]),
            usd=float(row["usd"]),
            unpriced_calls=int(row["unpriced"]),
        )
        for row in db.fetch_all(conn, "views/model_costs", {"run_id": run_id, "days": days})
    )
    return Costs(
        usd=sum(m.usd for m in by_model),
        unpriced_calls=sum(m.unpriced_calls for m in by_model),
        by_model=by_model,
    )


# The users the overview lists searches for: the costliest, so that a page stays small.
SEARCH_USERS = 20


@dataclasses.dataclass(frozen=True)
class UserSearches:
    """One user's searches in the window, and the paid calls that embedded their questions:
    their tokens and cost in USD (``unpriced_calls`` had no price and count 0). A question
    answered from the ledger's cache is a search and no call."""

    user: str
    searches: int
    paid_calls: int
    input_tokens: int
    output_tokens: int
    usd: float
    unpriced_calls: int


def search_costs(
    conn: db.Connection, days: int = COST_DAYS, limit: int = SEARCH_USERS
) -> list[UserSearches]:
    """Each user's searches in the last ``days`` days and what they cost (ADR 0153), the
    costliest ``limit`` users first, from the per-day counters."""
    return [
        UserSearches(
            user=row["username"],
            searches=int(row["searches"]),
            paid_calls=int(row["paid_calls"]),
            input_tokens=int(row["input_tokens"]),
            output_tokens=int(row["output_tokens"]),
            usd=float(row["usd"]),
            unpriced_calls=int(row["unpriced"]),
        )
        for row in db.fetch_all(conn, "views/search_costs", {"days": days, "limit": limit})
    ]


@dataclasses.dataclass(frozen=True)
class RunCost:
    """A run, newest first: when it was planned, its documents, and its model calls' cost."""

    dag_id: str
    run_id: str
    created_at: datetime
    documents: int
    to_do: int | None
    reported: bool
    usd: float
    unpriced_calls: int


def recent_runs(conn: db.Connection, limit: int = 10) -> list[RunCost]:
    """The ``limit`` newest runs with their cost: reported, or so far (ADR 0110)."""
    return [
        RunCost(**{**row, "unpriced_calls": int(row["unpriced_calls"])})
        for row in db.fetch_all(conn, "views/recent_runs", {"limit": limit})
    ]


def open_dead_letters_by_stage(conn: db.Connection, run_id: str | None = None) -> dict[str, int]:
    """Per stage that has any: its open dead letters; with ``run_id``, the run's documents'."""
    params = {"run_id": run_id, "stages": list(STAGES)}
    return {
        row["stage"]: int(row["n_open"])
        for row in db.fetch_all(conn, "views/status_dead_letters", params)
    }


def stage_summaries(
    conn: db.Connection, run_id: str | None = None, *, also: Iterable[str] = ()
) -> list[StageSummary]:
    """Every stage (in :func:`stage_order`, with ``also``): items by status, open dead letters."""
    items = items_by_status(conn, run_id)
    dead = open_dead_letters_by_stage(conn, run_id)
    return [
        StageSummary(stage=stage, **items.get(stage, {}), open_dead_letters=dead.get(stage, 0))
        for stage in stage_order({*items, *dead, *also})
    ]


def stage_status(
    conn: db.Connection, run_id: str | None = None, *, with_model_calls: bool = True
) -> list[StageStatus]:
    """Every stage (in :func:`stage_order`): items by status, open dead letters, model calls.

    ``run_id`` narrows all three to the documents (and calls) of that run. Without
    ``with_model_calls`` the calls are not read and stay zero.
    """
    calls = model_calls_by_stage(conn, run_id) if with_model_calls else {}
    return [
        StageStatus(**dataclasses.asdict(found), model_calls=calls.get(found.stage, ModelCalls()))
        for found in stage_summaries(conn, run_id, also=calls)
    ]


def run_state(conn: db.Connection, run_id: str | None = None) -> Row | None:
    """The run ``run_id`` (else the newest run) as the ledger records it; None if unknown.

    The row has ``dag_id``, ``run_id``, ``created_at``, ``documents``, ``to_do`` and
    ``reported`` (its report has been written since: the run has ended).
    """
    rows = db.fetch_all(conn, "views/run_state", {"run_id": run_id})
    return rows[0] if rows else None


# ---- failed items and dead letters -------------------------------------------------------


def failed_items(
    conn: db.Connection,
    *,
    stage: str | None = None,
    error_classes: Sequence[str] | None = None,
    limit: int,
    after: tuple[datetime | str, str, str] | None = None,
) -> Page:
    """Items whose current status is failed, newest first, at most ``limit`` of them.

    Each row has the item (stage, item_key, doc_id, the document's uri), its attempts, error
    class and last error, code version, the run and task that last ran it and ``updated_at``.
    ``after`` is the last row's ``(updated_at, stage, doc_id)`` of the page before (keyset
    paging); ``matched`` counts every failed item of the filters, from the counters.
    """
    at, after_stage, after_doc = after if after is not None else (None, None, None)
    params = {
        "stage": stage,
        "error_classes": list(error_classes) if error_classes is not None else None,
        "limit": limit,
        "after_updated_at": at,
        "after_stage": after_stage,
        "after_doc_id": after_doc,
    }
    rows = db.fetch_all(conn, "views/failed_items", params)
    return Page(matched=matched(rows), rows=rows)


def _letter_filters(
    stage: str | None, error_classes: Sequence[str] | None, since: Moment, until: Moment
) -> dict[str, Any]:
    """The dead-letter filters the list and a redrive share, as their queries bind them."""
    classes = list(error_classes) if error_classes is not None else None
    return {"stage": stage, "error_classes": classes, "since": since, "until": until}


def dead_letters(
    conn: db.Connection,
    *,
    stage: str | None = None,
    status: str | None = None,
    error_classes: Sequence[str] | None = None,
    since: Moment = None,
    until: Moment = None,
    limit: int,
    after: tuple[datetime | str, int] | None = None,
) -> Page:
    """Dead letters, newest first, at most ``limit``, with the full error and resolution.

    ``status`` is a dead-letter status, or None or ``"all"`` for any; ``since``/``until``
    bound ``created_at`` (at or after, before). ``after`` is the last row's
    ``(created_at, id)`` of the page before; ``matched`` counts every letter of the filters.
    """
    at, after_id = after if after is not None else (None, None)
    params = {
        **_letter_filters(stage, error_classes, since, until),
        "status": None if status == "all" else status,
        "limit": limit,
        "after_created_at": at,
        "after_id": after_id,
    }
    rows = db.fetch_all(conn, "views/list_dead_letters", params)
    return Page(matched=matched(rows), rows=rows)


def redrive_scope(
    conn: db.Connection,
    *,
    ids: Sequence[int] | None = None,
    stage: str | None = None,
    error_classes: Sequence[str] | None = None,
    since: Moment = None,
    until: Moment = None,
) -> list[RedriveScope]:
    """The open dead letters a redrive would take, one entry per stage, by stage name.

    The filters match as in :func:`dead_letters`; ``ids`` narrows them to the letters a
    person picked. No entry means no open letter matches: there is nothing to redrive.
    """
    params = {
        "ids": list(ids) if ids is not None else None,
        **_letter_filters(stage, error_classes, since, until),
    }
    return [
        RedriveScope(
            stage=row["stage"],
            letters=int(row["letters"]),
            documents=int(row["documents"]),
            ids=[int(i) for i in row["ids"]] if row["ids"] is not None else None,
            as_of=row["as_of"],
            dag_id=row["dag_id"] or PIPELINE_DAG_ID,
        )
        for row in db.fetch_all(conn, "plan/redrive_scope", params)
    ]


# ---- re-runs -----------------------------------------------------------------------------


def count_rerun_documents(conn: db.Connection, params: dict[str, Any]) -> int:
    """How many documents a re-run would select now; nothing is recorded.

    ``params`` are the values :func:`replayable.pipeline.rerun_params` binds for a conf.
    """
    return int(db.fetch_all(conn, RERUN_COUNT, params)[0]["matched"])


def documents_by_prefix(conn: db.Connection, prefix: str) -> list[str]:
    """Document ids that start with ``prefix``, in order; at most two (two = ambiguous)."""
    return [row["doc_id"] for row in db.fetch_all(conn, "views/docs_by_prefix", {"prefix": prefix})]


# ---- outbox ------------------------------------------------------------------------------


def outbox_counts(conn: db.Connection) -> OutboxCounts:
    """The outbox's events per status (the counters) and its oldest pending event's age."""
    counts = {row["status"]: int(row["n"]) for row in db.fetch_all(conn, "metrics/outbox")}
    oldest = db.fetch_all(conn, "outbox/oldest_pending")
    return OutboxCounts(
        pending=counts.get("pending", 0),
        published=counts.get("published", 0),
        dead=counts.get("dead", 0),
        oldest_pending_age_s=float(oldest[0]["age_s"]) if oldest else None,
    )


def outbox_events(conn: db.Connection, status: str, limit: int) -> list[Row]:
    """Outbox events of ``status`` (``pending``: the backlog, or ``dead``), oldest first.

    Each row has ``seq``, ``event_id``, ``event_type``, ``doc_id`` (the aggregate),
    ``status``, ``attempts``, ``error_class``, ``last_error`` and its times.
    """
    return db.fetch_all(conn, "views/outbox_events", {"status": status, "limit": limit})
