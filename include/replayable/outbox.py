"""The transactional outbox: claim due events, deliver them to a sink, record each outcome.

Events are written by the ledger's finish, in the transaction of the state they announce
(ADR 0040). A publisher (ADR 0041) claims a group of due events with ``FOR UPDATE SKIP
LOCKED`` and a lease, so that two publishers never hold the same row; delivers each one to
the sink, starting a delivery only while its lease is sure to outlast it; and settles the
group in one statement: ``published`` once the sink acknowledged the event, ``pending``
again after a retryable failure (due after a full-jitter backoff, or the receiver's
Retry-After), ``dead`` at once after a terminal failure or at the attempt cap, and handed
back without spending an attempt when the sink fails systemically. A publisher that dies
between a delivery and its settle leaves the row leased: it is due again when the lease
ends and is delivered again under the same event id, which the receiver de-duplicates.

A receiver that is down is no event's fault (ADR 0070): 401/403 (refused credentials),
404/410 (no such endpoint), a refused connection, and ``systemic_after`` retryable failures
in a row stop the call, and every event it holds, the failed ones of that streak included,
is handed back with its attempt given back. A call also ends within its time budget
(``max_s``): it starts no delivery that could end past it. Nothing here imports Airflow.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from replayable.db import Connection, Database, fetch_all
from replayable.retry import Classified, ErrorKind, classify, full_jitter

log = logging.getLogger(__name__)

READY = "document.ready"
FAILED = "document.failed"
# A whole source's listing lost the document, or a path of it holds other bytes now; a
# retracted document found again (ADR 0138).
DELETED = "document.deleted"
UPDATED = "document.updated"
RESTORED = "document.restored"
# Answers that say the endpoint itself is missing or misconfigured, not that one event is bad:
# 404/410 for a receiver's URL is a moved or deleted hook, and every event would get it.
_MISSING_ENDPOINT = frozenset({"http_404", "http_410"})
# No event can cause a refused connection: the receiver is unreachable for all of them.
_UNREACHABLE = frozenset({"connect_error"})


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

    # Events claimed per round trip: outbox_publisher's `batch_size` param, not a run's.
    claim_size: int = 50
    # How long a claim on events lasts: not the item lease of stage_runs (ADR 0098).
    lease_s: float = 300.0
    max_attempts: int = 8
    max_events: int = 10_000  # claimed per call at most
    backoff_base_s: float = 60.0
    backoff_cap_s: float = 3600.0
    # Retryable failures in a row that mean the receiver is down, not the events bad.
    systemic_after: int = 5
    # One call's time budget: no delivery starts that could end past it. Shorter than the
    # publish task's execution_timeout (30 min), so the call ends before Airflow kills it.
    max_s: float = 1200.0

    def __post_init__(self) -> None:
        if (
            self.claim_size < 1
            or self.max_events < 1
            or self.max_attempts < 1
            or self.systemic_after < 1
        ):
            raise ValueError(
                "claim_size, max_events, max_attempts and systemic_after must be at least 1"
            )
        if self.lease_s <= 0:
            raise ValueError(f"lease_s must be positive, got {self.lease_s}")
        if self.max_s <= 0:
            raise ValueError(f"max_s must be positive, got {self.max_s}")


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
    out_of_time: bool = False  # the call stopped at its time budget (events may be due)

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
            "out_of_time": self.out_of_time,
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
    rows = fetch_all(conn, "outbox/claim", params)
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
    rows = fetch_all(conn, "outbox/settle", params)
    return {row["event_id"]: (row["status"], row["event_type"]) for row in rows}


def publish(
    db: Database,
    sink: Sink | None,
    *,
    owner: str,
    publication: str,
    limits: PublishLimits = PublishLimits(),
    clock: Callable[[], float] = time.monotonic,
) -> PublishResult:
    """Deliver due events until none is left, ``limits.max_events`` were claimed, the time
    budget ``limits.max_s`` is spent, or the sink fails systemically. With no sink, events
    are marked published as claimed (the caller announces them another way, e.g. as an
    Airflow asset event).

    :param owner: this publisher's lease owner name (unique per process and try).
    :param publication: recorded on every event this call publishes (``published_by``), so
        that whoever announces the call's work can read it back.
    :param clock: monotonic seconds; the lease and the time budget are measured on it.
    """
    if sink is not None and sink.max_send_s >= limits.lease_s:
        raise ValueError(
            f"lease_s ({limits.lease_s:g}) must be longer than one delivery can take "
            f"({sink.max_send_s:g} s with its retries), or a lease could end mid-delivery"
        )
    call = _Call(db, sink, limits, clock, owner=owner, publication=publication)
    # Events due when the call began, never ones it failed or handed back itself: those wait
    # for their backoff and the next call.
    due_by: datetime | None = None
    result = call.result
    while result.claimed < limits.max_events and result.systemic is None:
        if not call.may_start():
            result.out_of_time = True
            break
        limit = min(limits.claim_size, limits.max_events - result.claimed)
        claimed = call.round(limit, due_by)
        if claimed is None:
            break
        due_by = due_by or claimed
    log.info("outbox: %s", result.summary())
    return result


class _Call:
    """One :func:`publish` call: its counts, its deadline and the failures in a row so far."""

    def __init__(
        self,
        db: Database,
        sink: Sink | None,
        limits: PublishLimits,
        clock: Callable[[], float],
        *,
        owner: str,
        publication: str,
    ) -> None:
        self.db, self.sink, self.limits, self.clock = db, sink, limits, clock
        self.owner, self.publication = owner, publication
        self.result = PublishResult()
        self.deadline = clock() + limits.max_s
        self.failed_in_a_row = 0

    @property
    def _send_s(self) -> float:
        return self.sink.max_send_s if self.sink is not None else 0.0

    def may_start(self, lease_ends: float | None = None) -> bool:
        """Whether a delivery started now ends before the time budget (and the lease)."""
        ends = self.deadline if lease_ends is None else min(self.deadline, lease_ends)
        return self.clock() + self._send_s < ends

    def round(self, limit: int, due_by: datetime | None) -> datetime | None:
        """Claim, deliver and settle one group of events; return the claim's time (None: none)."""
        started = self.clock()  # before the claim: the lease ends no earlier than this
        claimed = self.db.transaction(
            functools.partial(
                claim, owner=self.owner, limit=limit, lease_s=self.limits.lease_s, due_by=due_by
            ),
            describe="outbox: claim",
        )
        events = claimed.events
        if not events:
            return None
        self.result.claimed += len(events)
        lease_ends = started + self.limits.lease_s
        outcomes: list[_Settle] = []
        streak: list[int] = []  # this group's failed deliveries since the last answer
        for event in events:
            outcome = self._deliver(event, lease_ends)
            if outcome.outcome == "failed" and outcome.error and outcome.error.retryable:
                streak.append(len(outcomes))
            elif outcome.outcome in ("published", "failed"):
                streak.clear()  # the receiver answered
            outcomes.append(outcome)
            if self.result.systemic is not None and streak:
                # The streak was the receiver's fault, not its events': give their attempts
                # back too. (Failures of an earlier group in the streak are settled already.)
                for index in streak:
                    outcomes[index] = _Settle(outcomes[index].event_id, "release", outcome.error)
                streak.clear()
        states = self.db.transaction(
            functools.partial(
                _settle,
                outcomes=outcomes,
                owner=self.owner,
                publication=self.publication,
                max_attempts=self.limits.max_attempts,
            ),
            describe="outbox: settle",
        )
        _tally(self.result, outcomes, states)
        return claimed.at

    def _deliver(self, event: Event, lease_ends: float) -> _Settle:
        result, sink = self.result, self.sink
        if result.systemic is not None:
            return _Settle(event.event_id, "release", result.systemic)
        if sink is None:
            return _Settle(event.event_id, "published")
        if not self.may_start(lease_ends):
            # Another publisher may take the row once the lease ends, and the task may be
            # killed once the budget ends: never be mid-delivery then.
            result.out_of_time = result.out_of_time or not self.may_start()
            return _Settle(event.event_id, "release")
        try:
            sink.deliver(event)
        except Exception as error:
            classified = _judge(classify(error))
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
            if classified.retryable:
                self.failed_in_a_row += 1
                if self.failed_in_a_row >= self.limits.systemic_after:
                    result.systemic = Classified(
                        "receiver_unavailable",
                        ErrorKind.SYSTEMIC,
                        f"{self.failed_in_a_row} deliveries in a row failed; "
                        f"last: {classified.message}",
                        classified.retry_after_s,
                    )
                    log.warning("outbox: %s; stopping", result.systemic.message)
                    return _Settle(event.event_id, "release", classified)
            else:
                self.failed_in_a_row = 0  # a terminal answer: the receiver is up
            delay = classified.retry_after_s
            if delay is None:
                delay = full_jitter(
                    max(event.attempts - 1, 0),
                    base_s=self.limits.backoff_base_s,
                    cap_s=self.limits.backoff_cap_s,
                )
            return _Settle(event.event_id, "failed", classified, delay)
        self.failed_in_a_row = 0
        return _Settle(event.event_id, "published")


def _judge(error: Classified) -> Classified:
    """The outbox's view of a delivery error: a missing or unreachable receiver is systemic."""
    if error.error_class in _MISSING_ENDPOINT | _UNREACHABLE:
        return Classified(error.error_class, ErrorKind.SYSTEMIC, error.message, error.retry_after_s)
    return error


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
    """How many events ``publication`` has published: in all, ``document.ready`` ones, and
    ones of documents that left the index (``retracted``)."""
    row = fetch_all(conn, "outbox/publication_counts", {"publication": publication})[0]
    return {
        "events": int(row["events"]),
        "ready": int(row["ready"]),
        "retracted": int(row["retracted"]),
    }


def published_in(
    conn: Connection, publication: str, *, after_seq: int = 0, limit: int = 1000
) -> list[dict[str, Any]]:
    """The events ``publication`` published, in order, one keyset page at a time.

    For a DAG scheduled on the documents-ready asset: the asset event's extra names the
    publication; pass the last row's ``seq`` as ``after_seq`` for the next page.
    """
    params = {"publication": publication, "after_seq": after_seq, "limit": limit}
    return fetch_all(conn, "outbox/published_in", params)
