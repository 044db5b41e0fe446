"""Per-item, per-stage state in ``replayable.stage_runs``: claim and finish whole batches.

Statuses move ``pending → running → done | failed | dead``. ``running`` always carries a
lease (owner and expiry): a live lease held by someone else is skipped, an expired one may
be taken over. Only the lease holder can finish an item, so a worker whose lease was taken
over cannot overwrite the new owner's result. A batch costs two round trips of bookkeeping:
one to claim every item (registering new ones) and one to finish them, in the transaction
that writes their outputs. Finishing also writes the outbox events the transitions announce
(``document.ready``, ``document.failed``) in that same transaction (ADR 0040).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg2.errors

from replayable.db import Connection, Database, fetch_all, fetch_script
from replayable.retry import Classified
from replayable.vocabulary import ITEM_LEASE_S, ITEM_MAX_ATTEMPTS

# How often a claim that lost a race for a document's current row is tried again.
_CLAIM_RACE_RETRIES = 5


@dataclass(frozen=True)
class RunContext:
    """Where the work happens: the Airflow run, map index and try, and the lease owner."""

    owner: str
    dag_id: str | None = None
    run_id: str | None = None
    map_index: int | None = None
    try_number: int | None = None


@dataclass(frozen=True)
class ItemState:
    """The ledger's view of one item; ``mine`` when this worker holds its lease."""

    item_key: str
    doc_id: str
    status: str
    attempts: int
    mine: bool
    lease_live: bool
    # Taken over from a holder that is gone, with no attempt spent yet: start it with
    # :meth:`Ledger.start` just before its work (ADR 0084).
    unstarted: bool = False

    @property
    def settled(self) -> bool:
        return self.status in ("done", "failed", "dead")


@dataclass(frozen=True)
class Outcome:
    """How one claimed item ended: ``done``, ``failed`` (with its error) or ``release``."""

    item_key: str
    outcome: str
    error: Classified | None = None
    traceback: str | None = None

    @classmethod
    def done(cls, item_key: str) -> Outcome:
        return cls(item_key, "done")


@dataclass(frozen=True)
class Revival:
    """A run that reopens dead items: who asked and why, recorded on their dead letters."""

    by: str
    reason: str


@dataclass
class Ledger:
    """The state rows of one stage, at one code version and config."""

    db: Database
    stage: str
    code_version: str
    config_hash: str
    spec_hash: str
    ctx: RunContext
    lease_s: float = ITEM_LEASE_S
    max_attempts: int = ITEM_MAX_ATTEMPTS
    # The versions a ``document.ready`` event names when an item ends done here: set for a
    # document's last stage only; None announces nothing.
    announce_ready: Mapping[str, Any] | None = None

    @property
    def _params(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "owner": self.ctx.owner,
            "lease_s": self.lease_s,
            "dag_id": self.ctx.dag_id,
            "run_id": self.ctx.run_id,
            "map_index": self.ctx.map_index,
            "try_number": self.ctx.try_number,
            "max_attempts": self.max_attempts,
        }

    @property
    def _announcing(self) -> dict[str, Any]:
        """Whether an item ending done announces its document, and the versions it names."""
        return {
            "announce_ready": self.announce_ready is not None,
            "versions": json.dumps(dict(self.announce_ready or {}), sort_keys=True),
        }

    def claim(
        self,
        items: Iterable[tuple[str, str]],
        *,
        revive: Revival | None = None,
        ready: Collection[str] = (),
    ) -> dict[str, ItemState]:
        """Register and lease (item_key, doc_id) pairs in one round trip; return every state.

        Keys in ``ready`` have their outputs stored already: new ones are registered done,
        with no lease, and announced like a finish (ADR 0125); existing ones are claimed as
        any other.
        """
        pairs = list(items)
        ready = set(ready)
        params = {
            **self._params,
            **self._announcing,
            "keys": [key for key, _ in pairs],
            "doc_ids": [doc for _, doc in pairs],
            "ready": [key in ready for key, _ in pairs],
            "code_version": self.code_version,
            "config_hash": self.config_hash,
            "spec_hash": self.spec_hash,
            "revive": revive is not None,
            "revive_by": revive.by if revive else None,
            "revive_reason": revive.reason if revive else None,
        }
        if not pairs:
            return {}
        for attempt in range(_CLAIM_RACE_RETRIES):
            try:
                rows = self.db.transaction(
                    lambda conn: fetch_all(conn, "ledger/claim_items", params),
                    describe=f"{self.stage}: claim",
                )
                return _states(rows)
            except psycopg2.errors.UniqueViolation:
                # Another claim moved a document's current row to its key after this claim's
                # first statement ran (two code versions claiming one document at once):
                # claimed again, this claim sees that row and moves it (ADR 0084).
                if attempt == _CLAIM_RACE_RETRIES - 1:
                    raise
                time.sleep(random.uniform(0, 0.05 * 2**attempt))  # noqa: S311 - jitter
        raise AssertionError("unreachable")

    def states(self, keys: Sequence[str]) -> dict[str, ItemState]:
        """Return the state of every key in one query."""
        params = {**self._params, "keys": list(keys)}
        rows = self.db.transaction(
            lambda conn: fetch_all(conn, "ledger/item_states", params),
            describe=f"{self.stage}: states",
        )
        return _states(rows)

    def finish(
        self, conn: Connection, outcomes: Sequence[Outcome], *, outputs: Sequence[bytes] = ()
    ) -> dict[str, ItemState]:
        """Record ``outcomes``, after the items' bound ``outputs`` statements, in one round trip.

        On an autocommit connection the outputs and the outcomes commit together or not at
        all; on a transaction the caller commits.
        """
        errors = [o.error for o in outcomes]
        params = {
            **self._params,
            "keys": [o.item_key for o in outcomes],
            "outcomes": [o.outcome for o in outcomes],
            "error_classes": [e.error_class if e else None for e in errors],
            "error_kinds": [e.kind.value if e else None for e in errors],
            "errors": [e.message if e else None for e in errors],
            "tracebacks": [o.traceback for o in outcomes],
            "retry_after_s": [e.retry_after_s if e else None for e in errors],
            **self._announcing,
        }
        return _states(fetch_script(conn, list(outputs), "ledger/finish_items", params))

    def start(self, keys: Sequence[str]) -> dict[str, int]:
        """Spend the attempt of items this worker holds unstarted; return their attempt numbers.

        Committed before the work begins, so an item that kills its task has its attempt
        counted, and its batch-mates that were never started have not (ADR 0084).
        """
        params = {**self._params, "keys": list(keys)}
        rows = self.db.transaction(
            lambda conn: fetch_all(conn, "ledger/start_items", params),
            describe=f"{self.stage}: start",
        )
        return {row["item_key"]: int(row["attempts"]) for row in rows}

    def renew(self, keys: Sequence[str]) -> set[str]:
        """Extend this worker's leases on ``keys``; return the keys it still holds."""
        params = {**self._params, "keys": list(keys)}
        rows = self.db.transaction(
            lambda conn: fetch_all(conn, "ledger/renew_leases", params),
            describe=f"{self.stage}: renew",
        )
        return {row["item_key"] for row in rows}


def _states(rows: Iterable[Mapping[str, Any]]) -> dict[str, ItemState]:
    return {
        row["item_key"]: ItemState(
            row["item_key"],
            row["doc_id"],
            row["status"],
            int(row["attempts"]),
            bool(row["mine"]),
            bool(row["lease_live"]),
            bool(row.get("unstarted", False)),
        )
        for row in rows
    }
