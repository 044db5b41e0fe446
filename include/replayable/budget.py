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

Tokens a minute (``max_tpm``) are a second rate on the same table, counted in tokens: a
request reserves the tokens it is estimated to use before it is sent, and the estimate is
corrected from the response's ``usage`` once it answers (ADR 0106). Unlike the request rate,
a request is charged after its own send: it may go once what was spent before it is paid
for, within a second, so a request larger than a second's worth is never held back by its
own size, and the one after it waits for it.

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
from typing import Any

from replayable.db import Connection, Database, execute, fetch_all
from replayable.keys import sha256_bytes

__all__ = ["RequestBudget"]

# What a request may find still owed to the tokens-per-minute budget and go anyway: a second.
# Providers enforce their minute over shorter windows (OpenAI: "60,000 TPM may be enforced as
# 1,000 tokens per second"), so the budget sends at its rate and never a minute's burst.
TOKENS_TOLERANCE_S = 1.0


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
    :param max_tpm: tokens sent per minute, or None for no token limit; shared like
        ``max_rps`` (a row of its own, the budget's name plus `` tokens``).
    :param tokens_tolerance_s: the seconds of tokens a request may find owed and go.
    """

    name: str
    slots: int
    max_rps: float | None = None
    burst: int = 1
    connect: Callable[[], Database] | None = field(default=None, repr=False)
    own_rps: float | None = None
    own_name: str | None = None
    max_tpm: float | None = None
    tokens_tolerance_s: float = TOKENS_TOLERANCE_S
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
        if self.max_tpm is not None and not self.max_tpm > 0:
            raise ValueError(f"max_tpm must be above 0, got {self.max_tpm}")
        limited = (self.max_rps, self.own_rps, self.max_tpm)
        if any(limit is not None for limit in limited) and self.connect is None:
            raise ValueError(
                "max_rps and max_tpm need connect: send times are reserved in Postgres"
            )
        self.namespace = _namespace(self.name)

    def close(self) -> None:
        """Close the connection send times were reserved on, if one was opened."""
        with self._rate_lock:
            if self._rates is not None:
                self._rates.close()
                self._rates = None

    @property
    def tokens_name(self) -> str:
        """The name of the tokens-per-minute row."""
        return f"{self.name} tokens"

    def _on_rates(self, statement: Callable[..., Any], query: str, params: Any) -> Any:
        """Run one statement on the budget's own connection, committed at once."""
        with self._rate_lock:  # one connection per budget, shared by its threads
            if self._rates is None:
                assert self.connect is not None  # checked in __post_init__
                self._rates = self.connect()
            return self._rates.transaction(
                functools.partial(statement, query=query, params=params), describe=query
            )

    def reserve(self, tokens: int = 0) -> float:
        """Reserve the next send time of the rate budget; return the seconds to wait for it.

        With ``own_rps`` the run's own row is reserved as well, and with ``max_tpm`` the
        ``tokens`` the request is estimated to use; the latest time wins.
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
            rows = self._on_rates(fetch_all, "budget/take_rate_token", params)
            wait = max(wait, float(rows[0]["wait_s"]))
        if self.max_tpm is not None and tokens > 0:
            rows = self._on_rates(
                fetch_all,
                "budget/take_tokens",
                {
                    "name": self.tokens_name,
                    "tokens": tokens,
                    "seconds_per_token": 60.0 / self.max_tpm,
                    "tolerance_s": self.tokens_tolerance_s,
                },
            )
            wait = max(wait, float(rows[0]["wait_s"]))
        return wait

    def refund(self, reserved: int, used: int) -> None:
        """Correct the token budget: ``reserved`` tokens were taken, the provider used ``used``.

        Tokens reserved and not used are given back; a request that used more than its
        estimate is charged the difference, so the rate holds to what the provider counts.
        """
        if self.max_tpm is None or reserved == used:
            return
        params = {
            "name": self.tokens_name,
            "tokens": reserved - used,
            "seconds_per_token": 60.0 / self.max_tpm,
        }
        self._on_rates(execute, "budget/refund_tokens", params)

    @contextlib.contextmanager
    def paced(self) -> Iterator[None]:
        """Wait for the next send time of the rate budget: for the provider calls that carry
        no inputs (the Files and Batch API), which take no slot but count against the
        requests a second every worker shares (ADR 0149)."""
        wait = self.reserve()
        if wait > 0:
            time.sleep(wait)
        yield

    @contextlib.contextmanager
    def slot(self, conn: Connection, tokens: int = 0) -> Iterator[int]:
        """Hold one slot on ``conn`` for the duration of the block (waits for one if needed).

        With ``max_rps`` or ``max_tpm`` the block starts at the send time reserved for it
        (``tokens``: the request's estimate), once the slot is held.
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
            wait = self.reserve(tokens)
            if wait > 0:
                time.sleep(wait)
            yield taken
        finally:
            if not conn.closed:
                with contextlib.suppress(Exception):
                    fetch_all(
                        conn, "budget/release_slot", {"namespace": self.namespace, "slot": taken}
                    )
