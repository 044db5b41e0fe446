"""The tokens-per-minute limit (``max_tpm``): a token bucket shared by every request.

Providers publish a TPM limit per model and answer 429 to a request that would go over it.
The bucket holds at most a minute's worth of tokens by default, starts full and refills
continuously, so a client may spend a whole minute's tokens in a burst and then only what
comes back, about a sixtieth of the limit a second. Providers also enforce the minute over
shorter windows (OpenAI: "60,000 TPM may be enforced as 1,000 tokens per second"): with
``window_s`` the bucket holds only that many seconds' worth.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from devtools.model_server.errors import HttpError
from devtools.model_server.faults import seconds_header


class TokenBucket:
    """At most ``window_s`` seconds of ``per_minute`` tokens, refilled at ``per_minute / 60``
    a second; starts full.

    Thread-safe: the handler's threads take from one bucket, and a take must see the tokens
    the previous one left. ``clock`` returns seconds (monotonic), for tests.
    """

    def __init__(
        self,
        per_minute: float,
        clock: Callable[[], float] = time.monotonic,
        window_s: float = 60.0,
    ) -> None:
        if not per_minute > 0 or not math.isfinite(per_minute):
            raise ValueError(f"per_minute must be a finite number above 0, got {per_minute}")
        if not 0 < window_s <= 60:
            raise ValueError(f"window_s must be above 0 and at most 60, got {window_s}")
        self.rate = float(per_minute) / 60
        self.capacity = self.rate * window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._level = self.capacity
        self._updated = clock()

    def _refill(self) -> None:
        # Called with the lock held: the refill and what follows it must be one step.
        now = self._clock()
        self._level = min(self.capacity, self._level + (now - self._updated) * self.rate)
        self._updated = now

    def take(self, tokens: int) -> float | None:
        """Take ``tokens`` and return None if the bucket holds them; else take nothing.

        Return the seconds until the bucket will hold them (if nothing else takes from it
        meanwhile), or ``math.inf`` when it never will: ``tokens`` is more than a whole
        window's worth.
        """
        if tokens > self.capacity:
            return math.inf
        with self._lock:
            self._refill()
            if self._level >= tokens:
                self._level -= tokens
                return None
            return (tokens - self._level) / self.rate

    def give_back(self, tokens: int) -> None:
        """Return tokens that were taken for a request that turned out to cost nothing."""
        with self._lock:
            self._refill()
            self._level = min(self.capacity, self._level + tokens)

    def level(self) -> float:
        """Return the tokens the bucket holds now."""
        with self._lock:
            self._refill()
            return self._level


class OverTokenLimit(HttpError):
    """A 429 from the ``max_tpm`` limit, which the stats count as ``rejected_tpm``."""


def pay_tokens(bucket: TokenBucket, tokens: int) -> TokenBucket:
    """Take a request's ``tokens`` from ``bucket`` and return it.

    Raise :class:`OverTokenLimit` when the bucket cannot pay for them, taking nothing: with
    ``Retry-After`` when waiting makes them fit, without it when no wait does.
    """
    wait = bucket.take(tokens)
    if wait is None:
        return bucket
    limit = f"{bucket.rate * 60:.15g}"
    if math.isinf(wait):
        # No wait makes it fit, so there is no Retry-After to send.
        raise OverTokenLimit(
            429,
            f"request too large for the tokens per minute limit: it uses {tokens} tokens, "
            f"more than the {bucket.capacity:.15g} the limit of {limit} tokens per minute "
            "allows at once; send fewer or shorter inputs",
            code="rate_limit_exceeded",
        )
    # Seconds with decimals, which the pipeline's client and OpenAI's both read, rounded
    # up to the millisecond so that a client waiting exactly this long finds its tokens.
    retry_after = seconds_header(math.ceil(wait * 1000) / 1000)
    raise OverTokenLimit(
        429,
        f"rate limit reached for tokens per minute: limit {limit}, requested {tokens}; "
        f"try again in {retry_after} s",
        code="rate_limit_exceeded",
        headers={"Retry-After": retry_after},
    )
