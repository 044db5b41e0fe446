"""What a stage that pays for model calls does around them, whichever model it calls.

- :class:`Sessions`: one database session per sender thread, each call's transaction on
  its own, closed together when the batch ends;
- :func:`record_calls`: every request, failed ones too, as a ``model_calls`` row with the
  items whose inputs it carried;
- :func:`correct_tokens`: the token budget corrected from what the provider counted;
- :class:`FailureStreak`: the batch stops (systemic) on a systemic error, or when request
  after request fails at the provider.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence

from replayable.budget import RequestBudget
from replayable.db import Connection, Database, execute
from replayable.models.http import CallRecord
from replayable.retry import Classified, ErrorKind, classify

log = logging.getLogger(__name__)


class Sessions:
    """A database session per thread, from ``connect``; :meth:`close` closes them all."""

    def __init__(self, connect: Callable[[], Database]) -> None:
        self._connect = connect
        self._local = threading.local()
        self._lock = threading.Lock()
        self._opened: list[Database] = []

    def get(self) -> Database:
        database: Database | None = getattr(self._local, "database", None)
        if database is None:
            database = self._connect()
            self._local.database = database
            with self._lock:
                self._opened.append(database)
        return database

    def close(self) -> None:
        with self._lock:
            opened, self._opened = self._opened, []
        for database in opened:
            database.close()


def record_calls(
    conn: Connection,
    calls: Sequence[CallRecord],
    *,
    stage: str,
    run_id: str | None,
    attempt: int,
    share: Mapping[str, int],
    searched_by: str | None = None,
) -> None:
    """Store each call with the items whose inputs it carried: ``share`` is each item key's
    number of inputs in it (each input counted once), and its tokens are split by it.
    ``searched_by`` is the user whose search question a call embedded (ADR 0153)."""
    keys = sorted(share)
    only = keys[0] if len(keys) == 1 else None
    for call in calls:
        total = max(call.n_inputs, 1)
        execute(
            conn,
            "stages/insert_model_call",
            {
                "stage": stage,
                "item_key": only,
                "attempt": attempt,
                "call_try": call.attempt,
                "status": call.status,
                "http_status": call.http_status,
                "latency_ms": call.latency_ms,
                "n_inputs": call.n_inputs,
                "tokens": call.tokens,
                "idempotency_key": call.idempotency_key,
                "run_id": run_id,
                "model": call.model or None,
                "output_tokens": call.output_tokens,
                "cost_usd": call.cost_usd,
                "mode": call.mode,
                "searched_by": searched_by,
                "item_keys": keys,
                "item_inputs": [share[k] for k in keys],
                "item_tokens": [call.tokens * share[k] // total for k in keys],
            },
        )


def correct_tokens(
    budget: RequestBudget, estimate: int, calls: Sequence[CallRecord], stage: str
) -> None:
    """Correct the token budget from what the provider counted (every try reserved
    ``estimate``). Best effort: an answer already paid for must not be lost to the budget's
    own connection, and a correction missed leaves the estimate spent (ADR 0106)."""
    try:
        budget.refund(estimate * len(calls), sum(c.tokens for c in calls))
    except Exception:
        log.warning("%s: the token budget was not corrected", stage, exc_info=True)


class FailureStreak:
    """Counts requests that failed in a row at the provider; says when the batch stops."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._in_a_row = 0
        self._lock = threading.Lock()

    def succeeded(self) -> None:
        with self._lock:
            self._in_a_row = 0

    def failed(self, error: BaseException) -> Classified | None:
        """The systemic error to stop the batch with, if ``error`` is one or ends a streak
        of ``limit`` retryable failures in a row; None otherwise."""
        found = classify(error)
        if found.kind is ErrorKind.SYSTEMIC:
            return found
        if found.kind is not ErrorKind.RETRYABLE or found.error_class in (
            "not_attempted",
            "lease_lost",
        ):
            return None
        with self._lock:
            self._in_a_row += 1
            in_a_row = self._in_a_row
        if in_a_row < self.limit:
            return None
        return Classified(
            "provider_unavailable",
            ErrorKind.SYSTEMIC,
            f"{in_a_row} requests in a row failed at the provider; last: {found.message}",
            found.retry_after_s,
        )
