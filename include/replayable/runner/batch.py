"""Run one stage over one batch of documents: plan, claim, process, wait for peers.

Per batch: plan the items (one key per document for this stage), then claim them all in
one round trip (registering new ones); items that are done, dead, or leased by another
worker are not processed. The items this worker holds are processed (see
``replayable.runner.processing``) while a :class:`~replayable.runner.leases.LeaseKeeper`
renews their leases; items another worker holds are waited for, and taken over when their
lease expires. A run's deadline (``Limits.deadline_s``) ends both the processing and the
waiting.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from replayable.db import Database
from replayable.keys import config_hash
from replayable.ledger import ItemState, Ledger, Outcome, Revival, RunContext
from replayable.retry import Classified, ErrorKind
from replayable.runner.leases import LeaseKeeper
from replayable.runner.processing import Processing
from replayable.runner.protocol import (
    DEADLINE,
    BatchResult,
    Limits,
    StageSpec,
    WorkItem,
    ready_versions,
    spec_hash,
)

log = logging.getLogger(__name__)


def run_batch(
    spec: StageSpec,
    doc_ids: Sequence[str],
    *,
    connect: Callable[[], Database],
    ctx: RunContext,
    limits: Limits = Limits(),  # noqa: B008  # frozen: one shared default is safe
    revive: Revival | None = None,
) -> BatchResult:
    """Process ``doc_ids`` through ``spec``; each document that enters ends done, failed or dead."""
    # One clock for the whole batch: the deadline stops its processing and its waiting alike.
    ends = None if limits.deadline_s is None else time.monotonic() + limits.deadline_s
    batch = Batch(spec, connect, ctx, limits, revive, ends)
    try:
        return batch.run(doc_ids)
    finally:
        batch.close()


class Batch:
    """One stage over one batch: plan, claim, process what this worker holds, wait for the rest."""

    def __init__(
        self,
        spec: StageSpec,
        connect: Callable[[], Database],
        ctx: RunContext,
        limits: Limits,
        revive: Revival | None,
        ends: float | None = None,
    ) -> None:
        self.spec = spec
        self.limits = limits
        # When the batch's deadline passes, on the monotonic clock (None: no deadline).
        self.ends = ends
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
        self.leases = LeaseKeeper(
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
        ends = self.ends
        items = self.work.transaction(
            lambda conn: self.spec.plan(conn, doc_ids), describe=f"{self.spec.name}: plan"
        )
        planned = {item.doc_id for item in items}
        self.result.not_entered = [d for d in doc_ids if d not in planned]
        states = self.ledger.claim(
            ((i.item_key, i.doc_id) for i in items),
            revive=self.revive,
            ready={i.item_key for i in items if i.ready},
        )
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
            waiting += Processing(self, mine, attempts).run()
        if orphans and self.spec.start_takeovers_together:
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
            waiting += Processing(self, mine, started).run()
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
