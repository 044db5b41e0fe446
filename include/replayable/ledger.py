"""Per-item, per-stage state in ``replayable.stage_runs``: register, check, claim, finish.

Statuses move ``pending → running → done | failed | dead``. ``running`` always carries a
lease (owner and expiry): a live lease held by someone else is skipped, an expired one may
be taken over. Only the lease holder can finish an item, so a worker whose lease was taken
over cannot overwrite the new owner's result.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from replayable.db import Connection, execute, execute_values, fetch_all
from replayable.retry import Classified, ErrorKind


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
    """The ledger's view of one item."""

    status: str
    attempts: int
    lease_owner: str | None
    lease_live: bool


@dataclass
class Ledger:
    """The state rows of one stage, at one code version and config."""

    conn: Connection
    stage: str
    code_version: str
    config_hash: str
    ctx: RunContext
    lease_s: float = 300.0
    max_attempts: int = 3
    _params: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self._params = {
            "stage": self.stage,
            "owner": self.ctx.owner,
            "lease_s": self.lease_s,
            "dag_id": self.ctx.dag_id,
            "run_id": self.ctx.run_id,
            "map_index": self.ctx.map_index,
            "try_number": self.ctx.try_number,
            "max_attempts": self.max_attempts,
        }

    def _commit(self) -> None:
        self.conn.commit()

    def register(self, items: Iterable[tuple[str, str]]) -> None:
        """Record (item_key, doc_id) pairs as pending; existing rows are left as they are."""
        rows = [
            (
                self.stage,
                key,
                doc_id,
                self.code_version,
                self.config_hash,
                self.ctx.dag_id,
                self.ctx.run_id,
                self.ctx.map_index,
            )
            for key, doc_id in items
        ]
        execute_values(self.conn, "register_items", rows)
        self._commit()

    def states(self, keys: Sequence[str]) -> dict[str, ItemState]:
        """Return the state of every key in one query."""
        rows = fetch_all(self.conn, "item_states", {"stage": self.stage, "keys": list(keys)})
        self._commit()
        return {
            row["item_key"]: ItemState(
                row["status"], row["attempts"], row["lease_owner"], row["lease_live"]
            )
            for row in rows
        }

    def claim(self, key: str) -> int | None:
        """Lease ``key`` for this worker; return its attempt number, or None if not ours to do."""
        rows = fetch_all(self.conn, "claim_item", {**self._params, "item_key": key})
        self._commit()
        return int(rows[0]["attempts"]) if rows else None

    def renew(self, key: str) -> bool:
        """Extend this worker's lease on ``key``; False if the lease was lost."""
        renewed = execute(self.conn, "renew_lease", {**self._params, "item_key": key})
        self._commit()
        return renewed == 1

    def complete(self, key: str, *, conn: Connection) -> bool:
        """Mark ``key`` done on ``conn``, in the transaction that wrote its outputs.

        The caller commits; False means the lease was lost and the caller must roll back.
        """
        return execute(conn, "complete_item", {**self._params, "item_key": key}) == 1

    def fail(self, key: str, error: Classified, traceback: str | None) -> str | None:
        """Record a failed attempt; return the new status (``failed`` or ``dead``).

        A dead item gets an open dead letter carrying the full error and traceback.
        Returns None when this worker no longer held the lease.
        """
        params = {
            **self._params,
            "item_key": key,
            "terminal": error.kind is ErrorKind.TERMINAL,
            "error_class": error.error_class,
            "error_kind": error.kind.value,
            "error": error.message,
        }
        rows = fetch_all(self.conn, "fail_item", params)
        if not rows:
            self._commit()
            return None
        row = rows[0]
        if row["status"] == "dead":
            execute(
                self.conn,
                "insert_dead_letter",
                {
                    **params,
                    "doc_id": row["doc_id"],
                    "traceback": traceback,
                    "attempts": row["attempts"],
                    "code_version": row["code_version"],
                },
            )
        self._commit()
        return str(row["status"])

    def revive(self, keys: Sequence[str], *, by: str, reason: str) -> None:
        """Reopen dead items with a fresh attempt budget; close their dead letters as redriven."""
        execute(
            self.conn,
            "revive_dead",
            {"stage": self.stage, "keys": list(keys), "by": by, "reason": reason},
        )
        self._commit()

    def release(self, key: str, error: Classified) -> None:
        """Give back a claim after a systemic failure, returning the attempt it took."""
        execute(
            self.conn,
            "release_item",
            {
                **self._params,
                "item_key": key,
                "error_class": error.error_class,
                "error": error.message,
            },
        )
        self._commit()

    def record_call(self, item_key: str, record: dict[str, Any]) -> None:
        """Append one billable provider call to ``model_calls``."""
        execute(
            self.conn,
            "insert_model_call",
            {"stage": self.stage, "item_key": item_key, "run_id": self.ctx.run_id, **record},
        )
        self._commit()
