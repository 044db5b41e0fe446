"""The server's state behind its HTTP face: its counters, its files and batches, its faults.

:class:`ServerState` is what :class:`~devtools.model_server.handler.Handler` serves from:
the fault config a request runs under and the dice that decide each fault, the
:class:`~devtools.model_server.stats.Stats` it counts in, and the
:class:`~devtools.model_server.batches.BatchStore` that keeps the Files and Batch API's
files and batches and charges them to those stats.
:class:`~devtools.model_server.server.EmbeddingServer` is this state listening on a socket.
"""

from __future__ import annotations

import random
import threading
from collections import deque
from dataclasses import dataclass
from typing import TypedDict

from devtools.model_server.batches import BatchStore
from devtools.model_server.faults import FaultConfig
from devtools.model_server.idempotency import IDEMPOTENCY_MAX_BYTES, IDEMPOTENCY_MAX_KEYS
from devtools.model_server.ratelimit import TokenBucket
from devtools.model_server.stats import Stats
from devtools.model_server.vectors import DEFAULT_DIM, MAX_DIM


@dataclass(frozen=True)
class FaultDraw:
    """The fault config a request runs under, with the state that goes with it.

    ``release`` cuts the request's waits short; ``tokens`` is the ``max_tpm`` bucket it pays
    its tokens from (None without a limit).
    """

    config: FaultConfig
    release: threading.Event
    tokens: TokenBucket | None = None


@dataclass(frozen=True)
class Draw:
    """What the fault dice decided for one request."""

    hang: bool
    status: int | None
    lose: bool


class StateOptions(TypedDict, total=False):
    """The keyword arguments of :class:`ServerState`, which a server passes on."""

    dim: int
    api_key: str | None
    verbose: bool
    idempotency_max_keys: int
    idempotency_max_bytes: int


class ServerState:
    """The counters, files, batches and faults of one server; thread-safe.

    ``idempotency_max_keys`` and ``idempotency_max_bytes`` bound the memory of responses
    kept for repeated ``Idempotency-Key`` headers.
    """

    def __init__(
        self,
        *,
        dim: int = DEFAULT_DIM,
        api_key: str | None = None,
        verbose: bool = False,
        idempotency_max_keys: int = IDEMPOTENCY_MAX_KEYS,
        idempotency_max_bytes: int = IDEMPOTENCY_MAX_BYTES,
    ) -> None:
        if not 1 <= dim <= MAX_DIM:
            raise ValueError(f"dim must be between 1 and {MAX_DIM}, got {dim}")
        self.dim = dim
        self.api_key = api_key or None
        self.verbose = verbose
        self.stats = Stats(idempotency_max_keys, idempotency_max_bytes)
        self.batches = BatchStore(self.stats)
        self._faults_lock = threading.Lock()
        self._faults = FaultConfig()
        self._webhook_statuses: deque[int] = deque()
        self._uploads_to_lose = 0
        self._rng = random.Random(0)  # noqa: S311 - fault draws must be reproducible
        self._release = threading.Event()
        self._tokens: TokenBucket | None = None

    @property
    def faults(self) -> FaultConfig:
        """Return the current fault config."""
        with self._faults_lock:
            return self._faults

    def set_faults(self, config: FaultConfig) -> None:
        """Replace the fault config; restart its webhook statuses and its token bucket.

        The ``max_tpm`` bucket starts full, the count of upload responses to lose starts
        again, and the fault draws are reseeded if the config has a seed.
        """
        with self._faults_lock:
            self._faults = config
            self._webhook_statuses = deque(config.webhook_statuses)
            self._uploads_to_lose = config.lose_upload_responses
            # A new bucket, even for the same limit: setting the faults starts a test's
            # minute afresh, whatever the one before spent.
            self._tokens = (
                TokenBucket(config.max_tpm, window_s=config.tpm_window_s)
                if config.max_tpm is not None
                else None
            )
            if config.seed is not None:
                self._rng.seed(config.seed)

    def clear_faults(self) -> None:
        """Remove every fault (the token limit too); release requests held by latency or hangs."""
        with self._faults_lock:
            self._faults = FaultConfig()
            self._webhook_statuses = deque()
            self._uploads_to_lose = 0
            self._tokens = None
            self._release.set()
            self._release = threading.Event()

    def snapshot_faults(self) -> FaultDraw:
        """Return the config a request runs under, with its release event and token bucket."""
        with self._faults_lock:
            return FaultDraw(self._faults, self._release, self._tokens)

    def draw(self, config: FaultConfig) -> Draw:
        """Draw whether a request hangs, which status it fails with, if any, and if it is lost."""
        # Each draw is taken only when its rate is set, so adding a fault kind leaves the
        # sequences that existing seeds give unchanged.
        with self._faults_lock:
            hang = config.hang_rate > 0 and self._rng.random() < config.hang_rate
            status_draw = self._rng.random() if config.status_rates else None
            lose = config.lose_response_rate > 0 and self._rng.random() < config.lose_response_rate
        status = None
        if status_draw is not None:
            cumulative = 0.0
            for candidate, rate in config.status_rates:
                cumulative += rate
                if status_draw < cumulative:
                    status = candidate
                    break
        return Draw(hang, status, lose)

    def next_webhook_status(self) -> tuple[FaultConfig, int | None]:
        """Return the fault config and the status it sets for the next webhook, if any."""
        with self._faults_lock:
            config = self._faults
            if config.webhook_status_always is not None:
                return config, config.webhook_status_always
            if self._webhook_statuses:
                return config, self._webhook_statuses.popleft()
            return config, None

    def lose_batch_line(self, rate: float) -> bool:
        """Whether a batch line is to be lost (``batch_lose_lines_rate``), drawn from the
        seeded fault draws; nothing is drawn when ``rate`` is 0."""
        if rate <= 0:
            return False
        with self._faults_lock:
            return self._rng.random() < rate

    def lose_next_upload(self) -> bool:
        """Whether a stored upload's response is to be lost (``lose_upload_responses``)."""
        with self._faults_lock:
            if self._uploads_to_lose <= 0:
                return False
            self._uploads_to_lose -= 1
            return True

    def reset_stats(self) -> None:
        """Zero the counters, forget the idempotency memory, drop every file and batch."""
        self.batches.reset()
