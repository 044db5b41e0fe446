"""Run one stage over one batch of documents, with the effect of running it once.

Per batch: plan the items (one key per document for this stage), then claim them all in
one round trip (registering new ones); items that are done, dead, or leased by another
worker are not processed. The stage processes the claimed items however suits it (the
extract stage on a pool of guarded processes, the embed stage as packed requests in
flight at once) and reports each item's outcome to a :class:`BatchIO`. Outcomes are
flushed in groups: the items' outputs (keyed, ``ON CONFLICT DO NOTHING``) and their new
states go in one transaction. A failure is classified: retryable (failed, or dead at the
attempt cap), terminal (dead at once) or systemic (the batch stops and the items keep their
attempts). A thread renews the leases of the items still in progress and tells the stage
which ones were lost, so that it stops paying for them. Nothing here imports Airflow.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from replayable.db import Connection, Database, values_statement
from replayable.keys import config_hash
from replayable.ledger import ItemState, Ledger, Outcome, Revival, RunContext
from replayable.retry import Classified, ErrorKind, classify

log = logging.getLogger(__name__)

# The error class of a batch stopped at its run's deadline (see ``replayable.deadline``).
DEADLINE = "deadline"

__all__ = [
    "BatchIO",
    "BatchResult",
    "Limits",
    "Revival",
    "StageSpec",
    "SystemicStopError",
    "WorkItem",
    "Write",
    "run_batch",
]


@dataclass(frozen=True)
class WorkItem:
    """One document's unit of work in one stage."""

    doc_id: str
    item_key: str
    payload: Any = None


@dataclass(frozen=True)
class Write:
    """Rows of one output, written with a named ``INSERT … VALUES %s … ON CONFLICT`` query."""

    query: str
    rows: list[tuple[Any, ...]]
    template: str | None = None
    size: int = 0  # bytes it holds, so that large outputs are flushed early


class SystemicStopError(Exception):
    """Raised by a stage to stop the batch for a reason that is no item's fault."""

    def __init__(self, error: Classified) -> None:
        super().__init__(f"{error.error_class}: {error.message}")
        self.error = error


class BatchIO(Protocol):
    """What a stage reports to while it processes a batch; every method is thread-safe."""

    def done(self, item: WorkItem, writes: Sequence[Write] = ()) -> None:
        """``item`` succeeded; ``writes`` are its outputs, stored with its done state."""
        ...

    def failed(self, item: WorkItem, error: BaseException) -> None:
        """``item`` failed with ``error`` (classified here; call from the except block)."""
        ...

    def holds(self, item: WorkItem) -> bool:
        """Whether this worker still holds ``item``'s lease (False: stop paying for it)."""
        ...

    def attempt(self, item: WorkItem) -> int:
        """The attempt number of ``item`` in this stage (1 for its first)."""
        ...

    @property
    def stopping(self) -> bool:
        """True once the batch is stopping (a systemic failure): start no new work."""
        ...

    def stop(self, error: Classified) -> None:
        """Stop the batch for a systemic reason: no item's fault, no attempt spent."""
        ...


class StageSpec(Protocol):
    """How one stage plans, keys and processes items; see ``replayable.specs``.

    A spec of a document's last stage also sets ``last_stage = True`` (optional, read with
    ``getattr``): its items ending done announce ``document.ready`` (ADR 0040). A spec whose
    items cannot kill the task sets ``start_takeovers_together = True`` (optional): items
    taken over from a holder that is gone are then started together, not one at a time
    (ADR 0084).
    """

    name: str
    code_version: str

    def key_config(self) -> dict[str, Any]:
        """The config that shapes this stage's output (part of every item key)."""
        ...

    def lineage(self) -> dict[str, Any]:
        """Key config plus the versions of the stages whose outputs this one reads."""
        ...

    def plan(self, conn: Connection, doc_ids: Sequence[str]) -> list[WorkItem]:
        """Key the documents whose input for this stage exists; leave out the rest."""
        ...

    def process(self, items: Sequence[WorkItem], io: BatchIO) -> None:
        """Process claimed items, reporting each one's outcome to ``io`` exactly once."""
        ...


@dataclass(frozen=True)
class Limits:
    """Per-batch bounds: lease length, attempt cap, polling, and how outcomes are flushed."""

    lease_s: float = 300.0
    max_attempts: int = 3
    wait_poll_s: float = 1.0
    # Outcomes are written when 1,000 are pending, or 32 MiB of output, or 2 s after the
    # first: the time bound caps the work a killed task loses, the others the size of one
    # statement. A batch that finishes within 2 s is finished in one statement.
    flush_items: int = 1000
    flush_bytes: int = 32 * 2**20
    flush_after_s: float = 2.0
    db_outage_s: float = 300.0
    # The run's deadline for this batch, from its start (None: none). Waiting for items that
    # another worker holds ends there too, not when their leases would have expired.
    deadline_s: float | None = None


@dataclass
class BatchResult:
    """Where every document of the batch ended in this stage."""

    stage: str
    done: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)
    not_entered: list[str] = field(default_factory=list)
    processed: int = 0
    skipped_done: int = 0
    retry_after_s: float | None = None
    systemic: Classified | None = None
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def entered(self) -> int:
        return len(self.done) + len(self.failed) + len(self.dead)

    def summary(self) -> dict[str, Any]:
        """Counts only: XComs stay the same size whatever the batch holds (ADR 0010)."""
        return {
            "stage": self.stage,
            "done": len(self.done),
            "failed": len(self.failed),
            "dead": len(self.dead),
            "not_entered": len(self.not_entered),
            "processed": self.processed,
            "skipped_done": self.skipped_done,
            "errors": dict(self.errors),
        }


def spec_hash(spec: StageSpec) -> str:
    """The hash a current row carries when it is done under the keys this spec derives."""
    return spec_hash_of(spec.name, spec.code_version, spec.lineage())


def spec_hash_of(stage: str, code_version: str, lineage: dict[str, Any]) -> str:
    """:func:`spec_hash` from its parts, for planners that do not build the specs."""
    return config_hash({"stage": stage, "version": code_version, **lineage})


def ready_versions(spec: StageSpec) -> dict[str, Any] | None:
    """What a ``document.ready`` event of ``spec`` names; None unless it is the last stage."""
    if not getattr(spec, "last_stage", False):
        return None
    return {"stage": spec.name, "code_version": spec.code_version, **spec.lineage()}


def run_batch(
    spec: StageSpec,
    doc_ids: Sequence[str],
    *,
    connect: Callable[[], Database],
    ctx: RunContext,
    limits: Limits = Limits(),
    revive: Revival | None = None,
) -> BatchResult:
    """Process ``doc_ids`` through ``spec``; each document that enters ends done, failed or dead."""
    batch = _Batch(spec, connect, ctx, limits, revive)
    try:
        return batch.run(doc_ids)
    finally:
        batch.close()


class _LeaseKeeper:
    """Renews the leases of the items in progress from a thread; records the ones lost.

    It survives database errors: a failed renewal is logged and tried again at the next
    tick. If no renewal has succeeded for a whole lease, every lease is taken as lost,
    because another worker may have taken the items over by then.
    """

    def __init__(self, ledger: Ledger, every_s: float) -> None:
        self._ledger = ledger
        self._every_s = every_s
        self._held: set[str] = set()
        self.lost: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_ok = time.monotonic()

    def hold(self, keys: Sequence[str]) -> None:
        with self._lock:
            self._held.update(keys)
            self.lost.difference_update(keys)
            self._last_ok = time.monotonic()
        if self._thread is None and keys:
            self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)
            self._thread.start()

    def release(self, keys: Sequence[str]) -> None:
        with self._lock:
            self._held.difference_update(keys)

    def holds(self, key: str) -> bool:
        with self._lock:
            return key not in self.lost

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            with self._lock:
                keys = sorted(self._held)
            if not keys:
                continue
            try:
                kept = self._ledger.renew(keys)
            except Exception as error:  # never let the keeper die: leases would silently lapse
                log.warning("lease renewal failed (%s: %s)", type(error).__name__, error)
                with self._lock:
                    if time.monotonic() - self._last_ok > self._ledger.lease_s:
                        self.lost.update(self._held)
                continue
            with self._lock:
                self._last_ok = time.monotonic()
                gone = [key for key in keys if key not in kept and key in self._held]
                self.lost.update(gone)
            for key in gone:
                log.warning("%s: lost the lease on %s", self._ledger.stage, key)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


class _Batch:
    def __init__(
        self,
        spec: StageSpec,
        connect: Callable[[], Database],
        ctx: RunContext,
        limits: Limits,
        revive: Revival | None,
    ) -> None:
        self.spec = spec
        self.limits = limits
        self.revive = revive
        # One round trip per statement: each bookkeeping query is its own transaction, and a
        # flush sends its outputs and outcomes as one script (ADR 9).
        self.work = connect()
        self.control = connect()
        self.work.autocommit = self.control.autocommit = True
        self.ledger = Ledger(
            self.control,
            spec.name,
            spec.code_version,
            config_hash(spec.key_config()),
            spec_hash(spec),
            ctx,
            lease_s=limits.lease_s,
            max_attempts=limits.max_attempts,
            announce_ready=ready_versions(spec),
        )
        keeper_db = connect()
        keeper_db.autocommit = True
        keeper_db.outage_s = min(keeper_db.outage_s, limits.lease_s / 3)
        self.leases = _LeaseKeeper(
            Ledger(
                keeper_db,
                spec.name,
                spec.code_version,
                self.ledger.config_hash,
                self.ledger.spec_hash,
                ctx,
                lease_s=limits.lease_s,
                max_attempts=limits.max_attempts,
            ),
            every_s=max(limits.lease_s / 3, 0.2),
        )
        self._keeper_db = keeper_db
        self.result = BatchResult(spec.name)

    def close(self) -> None:
        self.leases.close()
        for database in (self.work, self.control, self._keeper_db):
            database.close()

    def run(self, doc_ids: Sequence[str]) -> BatchResult:
        ends = None if self.limits.deadline_s is None else time.monotonic() + self.limits.deadline_s
        items = self.work.transaction(
            lambda conn: self.spec.plan(conn, doc_ids), describe=f"{self.spec.name}: plan"
        )
        planned = {item.doc_id for item in items}
        self.result.not_entered = [d for d in doc_ids if d not in planned]
        states = self.ledger.claim(((i.item_key, i.doc_id) for i in items), revive=self.revive)
        waiting = self._take(items, states, first=True)
        log.info(
            "%s: %d documents, %d already done, %d dead, %d to do, %d leased elsewhere, "
            "%d without input",
            self.spec.name,
            len(doc_ids),
            self.result.skipped_done,
            len(self.result.dead),
            self.result.processed,
            len(waiting),
            len(self.result.not_entered),
        )
        while waiting and self.result.systemic is None:
            if ends is not None and time.monotonic() >= ends:
                # Their holders finish them, or a later try takes them over: nothing of
                # ours to release, and the task is retried like any deadline stop.
                self.result.systemic = Classified(
                    DEADLINE,
                    ErrorKind.SYSTEMIC,
                    f"the batch ran past this run's deadline of {self.limits.deadline_s:.0f} s "
                    f"waiting for {len(waiting)} item(s) another worker holds",
                )
                break
            left = float("inf") if ends is None else max(0.0, ends - time.monotonic())
            time.sleep(min(self.limits.wait_poll_s, left))
            states = self.ledger.states([item.item_key for item in waiting])
            expired = [
                item
                for item in waiting
                if item.item_key not in states
                or not (states[item.item_key].settled or states[item.item_key].lease_live)
            ]
            if expired:
                claimed = self.ledger.claim((i.item_key, i.doc_id) for i in expired)
                states = {**states, **claimed}
            waiting = self._take(waiting, states, first=False)
        return self.result

    def _take(
        self, items: Sequence[WorkItem], states: dict[str, ItemState], *, first: bool
    ) -> list[WorkItem]:
        """Process the items this worker holds, settle the rest; return the ones held elsewhere."""
        mine: list[WorkItem] = []
        orphans: list[WorkItem] = []
        waiting: list[WorkItem] = []
        for item in items:
            state = states.get(item.item_key)
            if state is None or (state.status == "running" and not state.mine):
                waiting.append(item)
            elif state.mine:
                (orphans if state.unstarted else mine).append(item)
            else:
                self._settle(item, state.status)
                if first and state.status == "done":
                    self.result.skipped_done += 1
        if mine:
            self.result.processed += len(mine)
            attempts = {item.item_key: states[item.item_key].attempts for item in mine}
            waiting += _Processing(self, mine, attempts).run()
        if orphans and getattr(self.spec, "start_takeovers_together", False):
            waiting += self._start(orphans)
        else:
            for n, item in enumerate(orphans):
                if self.result.systemic is not None:
                    self._release(orphans[n:], self.result.systemic)
                    break
                waiting += self._start([item])
        return waiting

    def _start(self, items: list[WorkItem]) -> list[WorkItem]:
        """Start items taken over unstarted and process them; return the ones held elsewhere.

        Their attempts are spent and committed just before the work, and their outcomes are
        stored when it ends (ADR 0084). Items are started one at a time, so that a task killed
        again loses only the item it was in, unless the stage starts its takeovers together
        (embed: a replayed request must be packed as the one in flight at the kill was).
        """
        started = self.ledger.start([item.item_key for item in items])
        mine = [item for item in items if item.item_key in started]
        waiting = [item for item in items if item.item_key not in started]  # taken in turn
        if mine:
            self.result.processed += len(mine)
            waiting += _Processing(self, mine, started).run()
        return waiting

    def _release(self, items: Sequence[WorkItem], error: Classified) -> None:
        """Give back items this worker holds and has not started: failed, no attempt spent."""
        outcomes = [Outcome(item.item_key, "release", error, None) for item in items]
        states = self.work.transaction(
            lambda conn: self.ledger.finish(conn, outcomes), describe=f"{self.spec.name}: release"
        )
        for item in items:
            state = states.get(item.item_key)
            if state is not None:
                self._settle(item, state.status)

    def _settle(self, item: WorkItem, status: str) -> None:
        if status in ("done", "failed", "dead"):
            getattr(self.result, status).append(item.doc_id)


class _Processing(BatchIO):
    """One call of ``spec.process`` over claimed items, with grouped flushes of outcomes."""

    def __init__(self, batch: _Batch, items: list[WorkItem], attempts: dict[str, int]) -> None:
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
