"""Run one stage over one batch of documents, with the effect of running it once.

Per batch: plan the items (one key per document for this stage), register them, read
every item's state in one query, and process only what is not done or dead. Each item is
claimed with a lease before the expensive work, its output is written with
``ON CONFLICT DO NOTHING`` in the same transaction that marks it done, and a failure is
classified: retryable (failed, or dead at the attempt cap), terminal (dead at once) or
systemic (the batch stops and the items keep their attempts). Nothing here imports Airflow.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from replayable.db import Connection, execute
from replayable.keys import config_hash
from replayable.ledger import ItemState, Ledger, RunContext
from replayable.retry import Classified, ErrorKind, classify
from replayable.stages.embed import CallRecord

log = logging.getLogger(__name__)

# Error classes that mean "the provider is struggling", not "this item is bad".
PROVIDER_CLASSES = frozenset(
    {
        "http_408",
        "http_429",
        "http_500",
        "http_502",
        "http_503",
        "http_504",
        "connect_error",
        "read_timeout",
        "connection_reset",
    }
)


@dataclass(frozen=True)
class WorkItem:
    """One document's unit of work in one stage."""

    doc_id: str
    item_key: str
    payload: Any = None


CallSink = Callable[[CallRecord], None]


class StageSpec(Protocol):
    """How one stage plans, keys and processes items; see ``replayable.specs``."""

    name: str
    code_version: str

    def key_config(self) -> dict[str, Any]:
        """The config that shapes this stage's output (part of every item key)."""
        ...

    def plan(self, conn: Connection, doc_ids: Sequence[str]) -> list[WorkItem]:
        """Key the documents whose input for this stage exists; leave out the rest."""
        ...

    def process(self, conn: Connection, item: WorkItem, calls: CallSink) -> None:
        """Do the work for ``item`` and write its outputs on ``conn`` without committing."""
        ...


@dataclass(frozen=True)
class Limits:
    """Per-batch bounds: lease length, attempt cap, and when a provider counts as down."""

    lease_s: float = 300.0
    max_attempts: int = 3
    systemic_after: int = 5
    wait_poll_s: float = 1.0


@dataclass(frozen=True)
class Revival:
    """A re-run asked for dead items: who asked and why, recorded on their dead letters."""

    by: str
    reason: str


@dataclass
class BatchResult:
    """Where every document of the batch ended in this stage (ids only)."""

    stage: str
    done: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)
    not_entered: list[str] = field(default_factory=list)
    processed: int = 0
    skipped_done: int = 0
    retry_after_s: float | None = None
    systemic: Classified | None = None

    @property
    def entered(self) -> int:
        return len(self.done) + len(self.failed) + len(self.dead)

    def summary(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "done": self.done,
            "failed": self.failed,
            "dead": self.dead,
            "not_entered": self.not_entered,
            "processed": self.processed,
            "skipped_done": self.skipped_done,
        }


class _LeaseKeeper:
    """Renews the lease on the current item from a thread, so long items keep it."""

    def __init__(
        self,
        connect: Callable[[], Connection],
        make_ledger: Callable[[Connection], Ledger],
        every_s: float,
    ) -> None:
        self._connect = connect
        self._make_ledger = make_ledger
        self._every_s = every_s
        self._key: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, key: str | None) -> None:
        with self._lock:
            self._key = key
        if key is not None and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        conn = self._connect()
        ledger = self._make_ledger(conn)
        try:
            while not self._stop.wait(self._every_s):
                with self._lock:
                    key = self._key
                if key is not None and not ledger.renew(key):
                    log.warning("lost the lease on %s", key)
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


def run_batch(
    spec: StageSpec,
    doc_ids: Sequence[str],
    *,
    connect: Callable[[], Connection],
    ctx: RunContext,
    limits: Limits = Limits(),
    revive: Revival | None = None,
) -> BatchResult:
    """Process ``doc_ids`` through ``spec``; each document that enters ends done, failed or dead."""
    work = connect()
    control = connect()
    try:
        return _Batch(spec, work, control, connect, ctx, limits, revive).run(doc_ids)
    finally:
        work.close()
        control.close()


class _Batch:
    def __init__(
        self,
        spec: StageSpec,
        work: Connection,
        control: Connection,
        connect: Callable[[], Connection],
        ctx: RunContext,
        limits: Limits,
        revive: Revival | None,
    ) -> None:
        self.spec = spec
        self.revive = revive
        self.work = work
        self.limits = limits
        chash = config_hash(spec.key_config())

        def make_ledger(conn: Connection) -> Ledger:
            return Ledger(
                conn,
                spec.name,
                spec.code_version,
                chash,
                ctx,
                lease_s=limits.lease_s,
                max_attempts=limits.max_attempts,
            )

        self.ledger = make_ledger(control)
        self.leases = _LeaseKeeper(connect, make_ledger, every_s=max(limits.lease_s / 3, 0.2))
        self.result = BatchResult(spec.name)
        self.provider_failures_in_a_row = 0

    def run(self, doc_ids: Sequence[str]) -> BatchResult:
        items = self.spec.plan(self.work, doc_ids)
        self.work.commit()
        planned = {item.doc_id for item in items}
        self.result.not_entered = [d for d in doc_ids if d not in planned]
        self.ledger.register((item.item_key, item.doc_id) for item in items)
        states = self.ledger.states([item.item_key for item in items])
        todo: list[WorkItem] = []
        revived: list[str] = []
        for item in items:
            status = states[item.item_key].status
            if status == "done":
                self.result.done.append(item.doc_id)
                self.result.skipped_done += 1
            elif status == "dead" and self.revive is None:
                self.result.dead.append(item.doc_id)
            else:
                todo.append(item)
                if status == "dead":
                    revived.append(item.item_key)
        if revived and self.revive is not None:
            self.ledger.revive(revived, by=self.revive.by, reason=self.revive.reason)
        log.info(
            "%s: %d documents, %d already done, %d dead, %d to do, %d without input",
            self.spec.name,
            len(doc_ids),
            self.result.skipped_done,
            len(self.result.dead),
            len(todo),
            len(self.result.not_entered),
        )
        try:
            held_elsewhere = self._process_all(todo)
            if self.result.systemic is None:
                self._wait_for(held_elsewhere)
        finally:
            self.leases.close()
        return self.result

    def _process_all(self, todo: list[WorkItem]) -> list[WorkItem]:
        held_elsewhere: list[WorkItem] = []
        for position, item in enumerate(todo):
            attempt = self.ledger.claim(item.item_key)
            if attempt is None or not self._process_one(item, attempt):
                held_elsewhere.append(item)
                continue
            if self.result.systemic is not None:
                self._park(todo[position + 1 :] + held_elsewhere)
                return []
        return held_elsewhere

    def _wait_for(self, items: list[WorkItem]) -> None:
        """Finish the batch: wait out items leased by another worker, or take them over."""
        while items:
            log.info(
                "%s: waiting for %d item(s) leased by another worker", self.spec.name, len(items)
            )
            time.sleep(self.limits.wait_poll_s)
            states = self.ledger.states([item.item_key for item in items])
            still: list[WorkItem] = []
            for item in items:
                if not self._settle(item, states[item.item_key]):
                    still.append(item)
                if self.result.systemic is not None:
                    return
            items = still

    def _settle(self, item: WorkItem, state: ItemState) -> bool:
        """Take the outcome another worker reached, or the item itself once its lease is gone."""
        if state.status in ("done", "dead", "failed"):
            getattr(self.result, state.status).append(item.doc_id)
            return True
        if state.status == "running" and state.lease_live:
            return False
        attempt = self.ledger.claim(item.item_key)
        return attempt is not None and self._process_one(item, attempt)

    def _process_one(self, item: WorkItem, attempt: int) -> bool:
        """Process a claimed item; False if its lease was lost and another worker owns it."""
        self.result.processed += 1
        self.leases.hold(item.item_key)

        def record(call: CallRecord) -> None:
            self.ledger.record_call(
                item.item_key,
                {
                    "attempt": attempt,
                    "call_try": call.attempt,
                    "status": call.status,
                    "http_status": call.http_status,
                    "latency_ms": call.latency_ms,
                    "n_inputs": call.n_inputs,
                    "tokens": call.tokens,
                    "idempotency_key": call.idempotency_key,
                },
            )

        try:
            self.spec.process(self.work, item, record)
            kept_lease = self.ledger.complete(item.item_key, conn=self.work)
            if kept_lease:
                self.work.commit()
                self.result.done.append(item.doc_id)
                self.provider_failures_in_a_row = 0
            else:
                self.work.rollback()
        except Exception as exc:
            self.work.rollback()
            kept_lease = self._failed(item, attempt, exc)
        finally:
            self.leases.hold(None)
        if not kept_lease:
            # Our lease expired and another worker took the item over: its outcome stands.
            log.warning("%s: lease on %s lost to another worker", self.spec.name, item.item_key)
        return kept_lease

    def _failed(self, item: WorkItem, attempt: int, exc: Exception) -> bool:
        """Record a failure; False if the lease was lost before it could be recorded."""
        error = classify(exc)
        if error.kind is ErrorKind.SYSTEMIC:
            log.error(
                "%s: systemic failure on %s (%s); stopping the batch",
                self.spec.name,
                item.item_key,
                error.error_class,
            )
            self.ledger.release(item.item_key, error)
            self.result.failed.append(item.doc_id)
            self.result.systemic = error
            return True
        status = self.ledger.fail(item.item_key, error, traceback.format_exc())
        if status is None:
            return False
        log.warning(
            "%s: %s is %s after attempt %d (%s): %s",
            self.spec.name,
            item.item_key,
            status,
            attempt,
            error.error_class,
            error.message,
        )
        if status == "dead":
            self.result.dead.append(item.doc_id)
        else:
            self.result.failed.append(item.doc_id)
        if error.retry_after_s is not None:
            self.result.retry_after_s = max(self.result.retry_after_s or 0.0, error.retry_after_s)
        if error.error_class in PROVIDER_CLASSES:
            self.provider_failures_in_a_row += 1
            if self.provider_failures_in_a_row >= self.limits.systemic_after:
                self.result.systemic = Classified(
                    "provider_unavailable",
                    ErrorKind.SYSTEMIC,
                    f"{self.provider_failures_in_a_row} items in a row failed at the provider; "
                    f"last: {error.message}",
                    self.result.retry_after_s,
                )
        else:
            self.provider_failures_in_a_row = 0
        return True

    def _park(self, items: list[WorkItem]) -> None:
        """Mark the items a stopped batch never reached as failed, without spending attempts."""
        assert self.result.systemic is not None
        if not items:
            return
        execute(
            self.ledger.conn,
            "park_items",
            {
                "stage": self.spec.name,
                "keys": [item.item_key for item in items],
                "error_class": self.result.systemic.error_class,
                "error": "not attempted: " + self.result.systemic.message,
            },
        )
        self.ledger.conn.commit()
        self.result.failed.extend(item.doc_id for item in items)
