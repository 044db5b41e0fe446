"""The transactional outbox: claim due events, deliver them to a sink, record each outcome.

Events are written by the ledger's finish, in the transaction of the state they announce
(ADR 0040). A publisher (ADR 0041) claims a group of due events with ``FOR UPDATE SKIP
LOCKED`` and a lease, so that two publishers never hold the same row; delivers each one to
the sink, starting a delivery only while its lease is sure to outlast it; and settles the
group in one statement: ``published`` once the sink acknowledged the event, ``pending``
again after a retryable failure (due after a full-jitter backoff, or the receiver's
Retry-After), ``dead`` at once after a terminal failure or at the attempt cap, and handed
back without spending an attempt when the sink fails systemically (401/403). A publisher
that dies between a delivery and its settle leaves the row leased: it is due again when the
lease ends and is delivered again under the same event id, which the receiver de-duplicates.
Nothing here imports Airflow.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from replayable.db import Connection, Database, fetch_all
from replayable.retry import Classified, ErrorKind, classify, full_jitter

log = logging.getLogger(__name__)

READY = "document.ready"
FAILED = "document.failed"


@dataclass(frozen=True)
class Event:
    """One outbox row as a publisher claimed it."""

    event_id: str
    seq: int
    event_type: str
    aggregate_type: str
    aggregate_id: str
    payload: dict[str, Any]
    attempts: int
    created_at: datetime

    def envelope(self) -> dict[str, Any]:
        """What a sink delivers; the same on every delivery, so a receiver may compare them."""
        return {
            "id": self.event_id,
            "type": self.event_type,
            "aggregate": {"type": self.aggregate_type, "id": self.aggregate_id},
            "created_at": self.created_at.isoformat(),
            "data": self.payload,
        }


class Sink(Protocol):
    """Where events go. ``deliver`` returns only once the receiver acknowledged the event."""

    @property
    def max_send_s(self) -> float:
        """The longest one ``deliver`` call can take, its own retries included."""
        ...

    def deliver(self, event: Event) -> None:
        """Deliver ``event``, keyed by its id; raise (a classifiable error) if it was not."""
        ...


@dataclass(frozen=True)
class PublishLimits:
    """How much one publisher does per call, and how failed deliveries are retried."""

    batch_size: int = 50  # events claimed per round trip
    lease_s: float = 300.0
    max_attempts: int = 8
    max_events: int = 10_000  # claimed per call at most
    backoff_base_s: float = 60.0
    backoff_cap_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.max_events < 1 or self.max_attempts < 1:
            raise ValueError("batch_size, max_events and max_attempts must be at least 1")
        if self.lease_s <= 0:
            raise ValueError(f"lease_s must be positive, got {self.lease_s}")


@dataclass
class PublishResult:
    """What one publisher call did, in counts (its XCom stays small)."""

    claimed: int = 0
    published: int = 0
    ready: int = 0  # document.ready events among the published
    retrying: int = 0
    dead: int = 0
    released: int = 0
    lost: int = 0  # settled by nobody here: the lease was taken over meanwhile
    errors: dict[str, int] = field(default_factory=dict)
    systemic: Classified | None = None

    def summary(self) -> dict[str, Any]:
        return {
            "claimed": self.claimed,
            "published": self.published,
            "ready": self.ready,
            "retrying": self.retrying,
            "dead": self.dead,
            "released": self.released,
            "lost": self.lost,
            "errors": dict(self.errors),
            "systemic": self.systemic.error_class if self.systemic else None,
        }


@dataclass(frozen=True)
class _Settle:
    event_id: str
    outcome: str  # published | failed | release
    error: Classified | None = None
    delay_s: float = 0.0


@dataclass(frozen=True)
class Claim:
    """Events leased to one publisher, oldest first, and the database time of the claim."""

    events: list[Event]
    at: datetime | None


def claim(
    conn: Connection,
    *,
    owner: str,
    limit: int,
    lease_s: float,
    due_by: datetime | None = None,
) -> Claim:
    """Lease up to ``limit`` events due by ``due_by`` (default: now) to ``owner``.

    Each claim counts one attempt of each event.
    """
    params = {"owner": owner, "limit": limit, "lease_s": float(lease_s), "due_by": due_by}
    rows = fetch_all(conn, "claim_outbox", params)
    events = [
        Event(
            event_id=row["event_id"],
            seq=int(row["seq"]),
            event_type=row["event_type"],
            aggregate_type=row["aggregate_type"],
            aggregate_id=row["aggregate_id"],
            payload=dict(row["payload"]),
            attempts=int(row["attempts"]),
            created_at=row["created_at"],
        )
        for row in rows
    ]
    return Claim(
        sorted(events, key=lambda event: event.seq), rows[0]["claimed_at"] if rows else None
    )


def _settle(
    conn: Connection,
    outcomes: Sequence[_Settle],
    *,
    owner: str,
    publication: str,
    max_attempts: int,
) -> dict[str, tuple[str, str]]:
    errors = [o.error for o in outcomes]
    params = {
        "owner": owner,
        "publication": publication,
        "max_attempts": max_attempts,
        "event_ids": [o.event_id for o in outcomes],
        "outcomes": [o.outcome for o in outcomes],
        "error_classes": [e.error_class if e else None for e in errors],
        "error_kinds": [e.kind.value if e else None for e in errors],
        "errors": [e.message[:2000] if e else None for e in errors],
        "delays_s": [o.delay_s for o in outcomes],
    }
    rows = fetch_all(conn, "settle_outbox", params)
    return {row["event_id"]: (row["status"], row["event_type"]) for row in rows}


def publish(
    db: Database,
    sink: Sink | None,
    *,
    owner: str,
    publication: str,
    limits: PublishLimits = PublishLimits(),
) -> PublishResult:
    """Deliver due events until none is left, ``limits.max_events`` were claimed, or the sink
    fails systemically. With no sink, events are marked published as claimed (the caller
    announces them another way, e.g. as an Airflow asset event).

    :param owner: this publisher's lease owner name (unique per process and try).
    :param publication: recorded on every event this call publishes (``published_by``), so
        that whoever announces the call's work can read it back.
    """
    if sink is not None and sink.max_send_s >= limits.lease_s:
        raise ValueError(
            f"lease_s ({limits.lease_s:g}) must be longer than one delivery can take "
            f"({sink.max_send_s:g} s with its retries), or a lease could end mid-delivery"
        )
    result = PublishResult()
    # Events due when the call began, never ones it failed or handed back itself: those wait
    # for their backoff and the next call.
    due_by: datetime | None = None
    while result.claimed < limits.max_events and result.systemic is None:
        limit = min(limits.batch_size, limits.max_events - result.claimed)
        claimed = _round(
            db, sink, result, limit, due_by, owner=owner, publication=publication, limits=limits
        )
        if claimed is None:
            break
        due_by = due_by or claimed
    log.info("outbox: %s", result.summary())
    return result


def _round(
    db: Database,
    sink: Sink | None,
    result: PublishResult,
    limit: int,
    due_by: datetime | None,
    *,
    owner: str,
    publication: str,
    limits: PublishLimits,
) -> datetime | None:
    """Claim, deliver and settle one group of events; return the claim's time (None: none)."""
    started = time.monotonic()  # before the claim: the lease ends no earlier than this
    claimed = db.transaction(
        functools.partial(claim, owner=owner, limit=limit, lease_s=limits.lease_s, due_by=due_by),
        describe="outbox: claim",
    )
    events = claimed.events
    if not events:
        return None
    result.claimed += len(events)
    lease_ends = started + limits.lease_s
    outcomes = [_deliver(event, sink, result, lease_ends, limits) for event in events]
    states = db.transaction(
        functools.partial(
            _settle,
            outcomes=outcomes,
            owner=owner,
            publication=publication,
            max_attempts=limits.max_attempts,
        ),
        describe="outbox: settle",
    )
    _tally(result, outcomes, states)
    return claimed.at


def _deliver(
    event: Event, sink: Sink | None, result: PublishResult, lease_ends: float, limits: PublishLimits
) -> _Settle:
    if result.systemic is not None:
        return _Settle(event.event_id, "release", result.systemic)
    if sink is None:
        return _Settle(event.event_id, "published")
    if time.monotonic() + sink.max_send_s >= lease_ends:
        # Another publisher may take the row once the lease ends: never be mid-delivery then.
        return _Settle(event.event_id, "release")
    try:
        sink.deliver(event)
    except Exception as error:
        classified = classify(error)
        log.warning(
            "outbox: %s %s not delivered (%s): %s",
            event.event_type,
            event.event_id,
            classified.error_class,
            classified.message,
        )
        if classified.kind is ErrorKind.SYSTEMIC:
            result.systemic = classified
            return _Settle(event.event_id, "release", classified)
        delay = classified.retry_after_s
        if delay is None:
            delay = full_jitter(
                max(event.attempts - 1, 0), base_s=limits.backoff_base_s, cap_s=limits.backoff_cap_s
            )
        return _Settle(event.event_id, "failed", classified, delay)
    return _Settle(event.event_id, "published")


def _tally(
    result: PublishResult, outcomes: Sequence[_Settle], states: dict[str, tuple[str, str]]
) -> None:
    for outcome in outcomes:
        state = states.get(outcome.event_id)
        if state is None:
            result.lost += 1
            continue
        status, event_type = state
        if outcome.error is not None and outcome.outcome == "failed":
            name = outcome.error.error_class
            result.errors[name] = result.errors.get(name, 0) + 1
        if status == "published":
            result.published += 1
            if event_type == READY:
                result.ready += 1
        elif status == "dead":
            result.dead += 1
        elif outcome.outcome == "release":
            result.released += 1
        else:
            result.retrying += 1


def publication_counts(conn: Connection, publication: str) -> dict[str, int]:
    """How many events, and ``document.ready`` events, ``publication`` has published."""
    row = fetch_all(conn, "outbox_publication_counts", {"publication": publication})[0]
    return {"events": int(row["events"]), "ready": int(row["ready"])}


def published_in(
    conn: Connection, publication: str, *, after_seq: int = 0, limit: int = 1000
) -> list[dict[str, Any]]:
    """The events ``publication`` published, in order, one keyset page at a time.

    For a DAG scheduled on the documents-ready asset: the asset event's extra names the
    publication; pass the last row's ``seq`` as ``after_seq`` for the next page.
    """
    params = {"publication": publication, "after_seq": after_seq, "limit": limit}
    return fetch_all(conn, "outbox_published_in", params)
