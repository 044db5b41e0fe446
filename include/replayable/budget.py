"""A request budget shared by every worker: at most N requests in flight and R a second.

Invariant 11 asks for model requests to run concurrently up to a budget that all workers
share, so that the provider never sees more than it allows, however many tasks and workers
run. Both limits live in Postgres, which every worker already reaches:

- in flight: N Postgres session advisory locks in a namespace derived from the provider's
  name; a request holds one for exactly as long as it is in flight. Nothing is stored; a
  worker that dies drops its connection and with it its slot.
- rate: a row of ``replayable.request_rates`` holding the time the budget's next request is
  due (GCRA, the virtual-scheduling form of a token bucket). Each request reserves its send
  time with one ``INSERT … ON CONFLICT DO UPDATE … RETURNING`` and sleeps until then: no
  polling, and the row lock lasts one statement. A worker that dies loses only the send
  times it reserved.

A request takes its in-flight slot first and its send time second, so that the time it
reserved is the time it is sent (ADR 0022).

The slots and the shared rate are always the model connection's: a run's conf may ask for
less (invariant 15), which it spends on its own — fewer sender threads, and a rate row of
its own (``own_rps``, ``own_name``) reserved on top of the shared one — but it can never
change the budget that every run counts against (ADR 0086).
"""

from __future__ import annotations

import contextlib
import functools
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from replayable.db import Connection, Database, fetch_all
from replayable.keys import sha256_bytes

__all__ = ["RequestBudget"]


def _namespace(name: str) -> int:
    """A stable signed 32-bit advisory-lock namespace for ``name``."""
    value = int(sha256_bytes(f"replayable-budget\x00{name}".encode())[:8], 16)
    return value - 2**32 if value >= 2**31 else value


@dataclass
class RequestBudget:
    """``slots`` requests in flight at once, ``max_rps`` a second, across every worker.

    :param name: the budget's name (the provider's URL); every worker using it shares it.
    :param slots: requests in flight at once (``max_in_flight``).
    :param max_rps: requests sent per second, or None for no rate limit.
    :param burst: requests that may go back to back after a quiet spell (at least 1).
    :param connect: opens the connection send times are reserved on; required with
        ``max_rps``. It is the budget's own (the request's connection is inside a
        transaction that lasts as long as the request, and would hold the row that long).
    :param own_rps: a lower rate one run asked for, spent on a row of its own
        (``own_name``) in addition to the shared rate; None: the shared rate only.
    :param own_name: the name of that row (the budget's name and the run).
    """

    name: str
    slots: int
    max_rps: float | None = None
    burst: int = 1
    connect: Callable[[], Database] | None = field(default=None, repr=False)
    own_rps: float | None = None
    own_name: str | None = None
    _counter: int = field(default=0, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _rate_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _rates: Database | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {self.slots}")
        if self.max_rps is not None and not self.max_rps > 0:
            raise ValueError(f"max_rps must be above 0, got {self.max_rps}")
        if self.burst < 1:
            raise ValueError(f"burst must be at least 1, got {self.burst}")
        if self.own_rps is not None and not self.own_rps > 0:
            raise ValueError(f"max_rps must be above 0, got {self.own_rps}")
        if (self.max_rps is not None or self.own_rps is not None) and self.connect is None:
            raise ValueError("max_rps needs connect: send times are reserved in Postgres")
        self.namespace = _namespace(self.name)

    def close(self) -> None:
        """Close the connection send times were reserved on, if one was opened."""
        with self._rate_lock:
            if self._rates is not None:
                self._rates.close()
                self._rates = None

    def reserve(self) -> float:
        """Reserve the next send time of the rate budget; return the seconds to wait for it.

        With ``own_rps`` the run's own row is reserved as well, and the later time wins.
        """
        rates = [(self.name, self.max_rps)]
        if self.own_rps is not None:
            rates.append((self.own_name or f"{self.name} (own)", self.own_rps))
        wait = 0.0
        for name, rps in rates:
            if rps is None:
                continue
            params: dict[str, object] = {
                "name": name,
                "interval_s": 1.0 / rps,
                "burst": self.burst,
            }
            with self._rate_lock:  # one connection per budget, shared by its threads
                if self._rates is None:
                    assert self.connect is not None  # checked in __post_init__
                    self._rates = self.connect()
                rows = self._rates.transaction(
                    functools.partial(fetch_all, query="budget/take_rate_token", params=params),
                    describe="request rate",
                )
            wait = max(wait, float(rows[0]["wait_s"]))
        return wait

    @contextlib.contextmanager
    def slot(self, conn: Connection) -> Iterator[int]:
        """Hold one slot on ``conn`` for the duration of the block (waits for one if needed).

        With ``max_rps`` the block starts at the send time reserved for it, once the slot
        is held.
        """
        with self._lock:
            self._counter += 1
            preferred = self._counter % self.slots
        start = random.randrange(self.slots)  # noqa: S311 - spreads workers over the slots
        params = {"namespace": self.namespace, "slots": self.slots, "start": start}
        rows = fetch_all(conn, "budget/take_slot", params)
        taken = int(rows[0]["slot"]) if rows else preferred
        if not rows:
            # Every slot is in use: queue for one in Postgres rather than poll.
            fetch_all(conn, "budget/wait_slot", {"namespace": self.namespace, "slot": taken})
        try:
            wait = self.reserve()
            if wait > 0:
                time.sleep(wait)
            yield taken
        finally:
            if not conn.closed:
                with contextlib.suppress(Exception):
                    fetch_all(
                        conn, "budget/release_slot", {"namespace": self.namespace, "slot": taken}
                    )
