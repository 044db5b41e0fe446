"""One call of a stage's ``process``: the :class:`BatchIO` it reports to, flushed in groups.

Outcomes are flushed in groups: the items' outputs (keyed, ``ON CONFLICT DO NOTHING``) and
their new states go in one transaction. A failure is classified here: retryable (failed, or
dead at the attempt cap), terminal (dead at once) or systemic (the batch stops and the items
keep their attempts). The batch's deadline stops the stage the way a systemic failure does.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from replayable.db import Connection, values_statement
from replayable.ledger import ItemState, Outcome
from replayable.retry import Classified, ErrorKind, classify
from replayable.runner.protocol import (
    DEADLINE,
    BatchIO,
    RunningBatch,
    SystemicStopError,
    WorkItem,
    Write,
)

log = logging.getLogger(__name__)


class Processing(BatchIO):
    """One call of ``spec.process`` over claimed items, with grouped flushes of outcomes."""

    def __init__(
        self, batch: RunningBatch, items: list[WorkItem], attempts: dict[str, int]
    ) -> None:
        self.batch = batch
        self.items = {item.item_key: item for item in items}
        self._attempts = attempts
        self._reported: set[str] = set()
        self._pending: list[tuple[WorkItem, Outcome, Sequence[Write]]] = []
        self._pending_bytes = 0
        self._pending_since: float | None = None
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._stop: Classified | None = None
        self.lost_to_peers: list[WorkItem] = []

    # -- BatchIO -------------------------------------------------------------------------

    def done(self, item: WorkItem, writes: Sequence[Write] = ()) -> None:
        self._report(item, Outcome.done(item.item_key), writes)

    def failed(self, item: WorkItem, error: BaseException) -> None:
        classified = classify(error)
        tb = "".join(traceback.format_exception(error))
        if classified.kind is ErrorKind.SYSTEMIC:
            log.error(
                "%s: systemic failure on %s (%s); stopping the batch",
                self.batch.spec.name,
                item.item_key,
                classified.error_class,
            )
            self.stop(classified)
            self._report(item, Outcome(item.item_key, "release", classified, tb), ())
            return
        log.warning(
            "%s: %s failed (%s): %s",
            self.batch.spec.name,
            item.item_key,
            classified.error_class,
            classified.message,
        )
        if classified.retry_after_s is not None:
            with self._lock:
                current = self.batch.result.retry_after_s or 0.0
                self.batch.result.retry_after_s = max(current, classified.retry_after_s)
        self._report(item, Outcome(item.item_key, "failed", classified, tb), ())

    def holds(self, item: WorkItem) -> bool:
        return self.batch.leases.holds(item.item_key)

    def lease_valid_until(self) -> float:
        return self.batch.leases.valid_until()

    def attempt(self, item: WorkItem) -> int:
        return self._attempts.get(item.item_key, 1)

    @property
    def stopping(self) -> bool:
        return self._stop is not None

    def stop(self, error: Classified) -> None:
        with self._lock:
            if self._stop is None:
                self._stop = error

    # -- running -------------------------------------------------------------------------

    def run(self) -> list[WorkItem]:
        batch = self.batch
        batch.leases.hold(list(self.items))
        try:
            with self._deadline():
                batch.spec.process(list(self.items.values()), self)
        except SystemicStopError as stop:
            self.stop(stop.error)
        except Exception as error:
            # A stage bug or an outage outside any one item: every unreported item fails with it.
            classified = classify(error)
            if classified.kind is ErrorKind.SYSTEMIC:
                self.stop(classified)
            else:
                for item in self._unreported():
                    self.failed(item, error)
        if self._stop is not None:
            batch.result.systemic = self._stop
            for item in self._unreported():
                self._report(item, Outcome(item.item_key, "release", self._stop, None), ())
        unreported = self._unreported()
        if unreported:
            raise RuntimeError(
                f"{batch.spec.name}: the stage reported no outcome for {len(unreported)} item(s)"
            )
        self._flush(force=True)
        return self.lost_to_peers

    @contextmanager
    def _deadline(self) -> Iterator[None]:
        """Stop the batch at its deadline while the stage processes: nothing new starts then.

        Items already in flight finish (each is bounded by its own item timeout or request
        timeout); the rest are released without spending an attempt, like any systemic stop.
        """
        ends, seconds = self.batch.ends, self.batch.limits.deadline_s
        if ends is None or seconds is None:
            yield
            return
        error = Classified(
            DEADLINE,
            ErrorKind.SYSTEMIC,
            f"the batch ran past this run's deadline of {seconds:.0f} s; its unfinished "
            "items were released for the next try",
        )
        remaining = ends - time.monotonic()
        if remaining <= 0:
            self.stop(error)  # before the stage starts anything
        timer = threading.Timer(max(remaining, 0.0), self.stop, (error,))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def _unreported(self) -> list[WorkItem]:
        with self._lock:
            return [item for key, item in self.items.items() if key not in self._reported]

    def _report(self, item: WorkItem, outcome: Outcome, writes: Sequence[Write]) -> None:
        with self._lock:
            if item.item_key in self._reported:
                return
            self._reported.add(item.item_key)
            self._pending.append((item, outcome, writes))
            self._pending_bytes += sum(w.size for w in writes)
            if self._pending_since is None:
                self._pending_since = time.monotonic()
        self._flush(force=False)

    def _flush(self, *, force: bool) -> None:
        limits = self.batch.limits
        with self._flush_lock:
            with self._lock:
                due = self._pending and (
                    force
                    or len(self._pending) >= limits.flush_items
                    or self._pending_bytes >= limits.flush_bytes
                    or time.monotonic() - (self._pending_since or 0.0) >= limits.flush_after_s
                )
                if not due:
                    return
                pending, self._pending = self._pending, []
                self._pending_bytes, self._pending_since = 0, None
            self._write(pending)

    def _write(self, pending: list[tuple[WorkItem, Outcome, Sequence[Write]]]) -> None:
        """Store a group's outputs and outcomes in one transaction (retried if the link drops)."""
        batch = self.batch
        merged: dict[tuple[str, str | None], list[tuple[Any, ...]]] = {}
        for _, _, writes in pending:
            for write in writes:
                merged.setdefault((write.query, write.template), []).extend(write.rows)

        def store(conn: Connection) -> dict[str, ItemState]:
            outputs = [
                values_statement(conn, query, rows, template)
                for (query, template), rows in merged.items()
                if rows
            ]
            return batch.ledger.finish(
                conn, [outcome for _, outcome, _ in pending], outputs=outputs
            )

        states = batch.work.transaction(store, describe=f"{batch.spec.name}: finish")
        batch.leases.release([item.item_key for item, _, _ in pending])
        result = batch.result
        with self._lock:
            for item, outcome, _ in pending:
                state = states.get(item.item_key)
                if state is None or state.status in ("running", "pending"):
                    # Our lease was taken over: the new owner's outcome will stand.
                    self.lost_to_peers.append(item)
                    continue
                getattr(result, state.status).append(item.doc_id)
                if outcome.error is not None and state.status != "done":
                    name = outcome.error.error_class
                    result.errors[name] = result.errors.get(name, 0) + 1
