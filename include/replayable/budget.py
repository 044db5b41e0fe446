"""A request budget shared by every worker: at most N provider requests in flight at once.

Invariant 11 asks for model requests to run concurrently up to a budget that all workers
share, so that the provider never sees more than it allows, however many tasks and workers
run. The budget is N Postgres session advisory locks in a namespace derived from the
provider's name: a request holds one for exactly as long as it is in flight. Nothing is
stored; a worker that dies drops its connection and with it its slot.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from replayable.db import Connection, fetch_all
from replayable.keys import sha256_bytes

__all__ = ["RequestBudget"]


def _namespace(name: str) -> int:
    """A stable signed 32-bit advisory-lock namespace for ``name``."""
    value = int(sha256_bytes(f"replayable-budget\x00{name}".encode())[:8], 16)
    return value - 2**32 if value >= 2**31 else value


@dataclass
class RequestBudget:
    """``slots`` requests in flight at once across every worker that uses ``name``."""

    name: str
    slots: int
    _counter: int = field(default=0, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {self.slots}")
        self.namespace = _namespace(self.name)

    @contextlib.contextmanager
    def slot(self, conn: Connection) -> Iterator[int]:
        """Hold one slot on ``conn`` for the duration of the block (waits for one if needed)."""
        with self._lock:
            self._counter += 1
            preferred = self._counter % self.slots
        start = random.randrange(self.slots)  # noqa: S311 - spreads workers over the slots
        params = {"namespace": self.namespace, "slots": self.slots, "start": start}
        rows = fetch_all(conn, "take_budget_slot", params)
        taken = int(rows[0]["slot"]) if rows else preferred
        if not rows:
            # Every slot is in use: queue for one in Postgres rather than poll.
            fetch_all(conn, "wait_budget_slot", {"namespace": self.namespace, "slot": taken})
        try:
            yield taken
        finally:
            if not conn.closed:
                with contextlib.suppress(Exception):
                    fetch_all(
                        conn, "release_budget_slot", {"namespace": self.namespace, "slot": taken}
                    )
