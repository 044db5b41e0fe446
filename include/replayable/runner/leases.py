"""Keep the leases of a batch's items in progress alive from a thread, and notice lost ones."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from replayable.ledger import Ledger

log = logging.getLogger(__name__)


class LeaseKeeper:
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

    def valid_until(self) -> float:
        """A ``time.monotonic()`` time before which every lease held is known to be valid.

        One renewal interval short of a lease after the last renewal began (or the claim):
        no later renewal is counted until it has answered.
        """
        with self._lock:
            return self._last_ok + self._ledger.lease_s - self._every_s

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            with self._lock:
                keys = sorted(self._held)
            if not keys:
                continue
            began = time.monotonic()
            try:
                kept = self._ledger.renew(keys)
            except Exception as error:  # never let the keeper die: leases would silently lapse
                log.warning("lease renewal failed (%s: %s)", type(error).__name__, error)
                with self._lock:
                    if time.monotonic() - self._last_ok > self._ledger.lease_s:
                        self.lost.update(self._held)
                continue
            with self._lock:
                self._last_ok = began
                gone = [key for key in keys if key not in kept and key in self._held]
                self.lost.update(gone)
            for key in gone:
                log.warning("%s: lost the lease on %s", self._ledger.stage, key)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
