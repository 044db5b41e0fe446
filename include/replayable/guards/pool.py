"""GuardedPool: reusable worker processes, each item under a wall-clock, CPU and memory limit.

The caller's side of the guard: it schedules items on a pebble ``ProcessPool`` whose workers
:mod:`replayable.guards.worker` sets up, and turns every way an item can break its worker
into a :class:`~replayable.guards.errors.GuardError`. See :mod:`replayable.guards`.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Generic, TypeVar, cast

from pebble import ProcessExpired, ProcessPool
from pebble.common.types import RemoteTraceback

from replayable.guards.errors import GuardError
from replayable.guards.process import (
    hide_script_main,
    oom_events_file,
    read_oom_kills,
    restore_script_main,
    undo_inherited_process_state,
)
from replayable.guards.worker import (
    PROGRESS_FIELDS,
    USAGE_SLOTS,
    init_worker,
    run_item,
    run_items,
)

T = TypeVar("T")

# A worker whose last sampled address space was this close to its limit when it died is
# taken to have died of the limit (a C library that cannot handle a failed malloc).
_NEAR_LIMIT_FRACTION: Final = 0.9
# Default CPU allowance of one item, in multiples of its wall-clock timeout.
_CPU_PER_TIMEOUT: Final = 2


@dataclass(frozen=True)
class ItemOutcome(Generic[T]):
    """What one item of :meth:`GuardedPool.run_each` came to.

    Its value, or the error ``run`` would have raised for it (``error``), or neither when it
    was not started because ``not_after`` had passed (``started`` False).
    """

    value: T | None = None
    error: BaseException | None = None
    started: bool = True

    def result(self) -> T:
        """Return the value, or raise the item's error (an unstarted item is a RuntimeError)."""
        if self.error is not None:
            raise self.error
        if not self.started:
            raise RuntimeError("the item was not started: its not_after had passed")
        return cast(T, self.value)


class GuardedPool:
    """A reusable pool of worker processes with per-item wall-clock, CPU and memory limits.

    The workers are a pebble ``ProcessPool``; the memory limit is each worker's RLIMIT_AS,
    the CPU limit its RLIMIT_CPU (``cpu_s`` seconds per item, by default twice
    ``timeout_s``). ``run`` is thread-safe: with ``workers > 1``, calls from several
    threads run in parallel, one item per worker. Workers live until ``close`` (or until an
    item kills its worker, which is then replaced), so per-process start-up and imports
    are paid once per worker; they die with the process that owns the pool.
    """

    def __init__(
        self,
        *,
        timeout_s: float,
        memory_mb: int | None,
        workers: int = 1,
        cpu_s: float | None = None,
    ) -> None:
        """Configure the pool; worker processes start lazily with the first ``run``."""
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, not {timeout_s}")
        if memory_mb is not None and memory_mb <= 0:
            raise ValueError(f"memory_mb must be positive or None, not {memory_mb}")
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        if cpu_s is not None and cpu_s <= 0:
            raise ValueError(f"cpu_s must be positive or None, not {cpu_s}")
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.workers = workers
        # RLIMIT_CPU counts whole seconds.
        self.cpu_s = max(1, math.ceil(_CPU_PER_TIMEOUT * timeout_s if cpu_s is None else cpu_s))
        self._limit_bytes = None if memory_mb is None else memory_mb * 2**20
        self._context = multiprocessing.get_context("forkserver")
        # Shared with the workers: (pid, address-space bytes) pairs written by their samplers.
        self._usage: Any = None
        if self._limit_bytes is not None:
            self._usage = self._context.RawArray("q", 2 * USAGE_SLOTS)
        # Shared with the workers: which item of which run_each call each one is running.
        self._progress: Any = self._context.RawArray("q", PROGRESS_FIELDS * USAGE_SLOTS)
        self._calls = itertools.count(1)
        self._oom_events = oom_events_file()
        self._lock = threading.Lock()
        self._pool: ProcessPool | None = None
        self._closed = False

    def __enter__(self) -> GuardedPool:
        """Return the pool itself."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the pool."""
        self.close()

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Return ``fn(*args)`` computed in a worker; raise GuardError if the item broke a guard.

        Any other exception from ``fn`` is re-raised with its own type (see the module
        docstring for what that requires of custom exception classes).
        """
        pool = self._live_pool()
        oom_kills = read_oom_kills(self._oom_events)
        try:
            future = pool.schedule(run_item, args=(fn, args), timeout=self.timeout_s)
            return cast(T, future.result())
        except GuardError:
            raise
        except MemoryError as error:
            raise self._item_error(fn, error)  # noqa: B904  # its cause is the MemoryError
        except TimeoutError as error:
            if isinstance(error.__cause__, RemoteTraceback):
                raise  # fn's own TimeoutError, e.g. from a socket: not ours to classify
            raise GuardError(
                "timeout", f"{_name(fn)} ran longer than {self.timeout_s} s; its worker was killed"
            ) from None
        except ProcessExpired as error:
            error_class, reason = self._classify_death(error, oom_kills)
            raise GuardError(error_class, f"{_name(fn)}: worker {reason}") from error
        except BrokenProcessPool:
            # Workers that cannot start, or a result the caller cannot unpickle: a fault of
            # the setup or of fn, not of this item, so it must not be filed as one. Nothing
            # more can run on a broken pebble pool; the next run starts a fresh one.
            self._discard(pool)
            raise

    def run_each(
        self,
        fn: Callable[..., T],
        calls: Sequence[tuple[Any, ...]],
        *,
        not_after: float | None = None,
    ) -> list[ItemOutcome[T]]:
        """Compute ``fn(*args)`` for each of ``calls`` in one worker, one after another.

        One round trip to a worker for several items: each item still runs under its own
        wall-clock, CPU and memory limits, and comes to what ``run`` would have made of it,
        value or error. If an item kills its worker, only that item gets the classified
        death; the worker says which item it was on, and the others run again on a fresh
        worker. No item starts once ``time.monotonic()`` is past ``not_after``: those come
        back unstarted. A worker grown by a quarter of its memory limit during the call
        returns the results it holds, and the rest go in another call.
        ``BrokenProcessPool`` is raised as ``run`` raises it.
        """
        if not calls:
            return []
        pool = self._live_pool()
        oom_kills = read_oom_kills(self._oom_events)
        call_id = next(self._calls)
        # Each item ends at its own alarm; this only backs those up.
        backstop_s = self.timeout_s * (len(calls) + 1)
        try:
            future = pool.schedule(
                run_items,
                args=(fn, list(calls), call_id, self.timeout_s, not_after),
                timeout=backstop_s,
            )
            done: list[tuple[bool, Any]] = future.result()
        except ProcessExpired as error:
            index = self._progress_of(error.pid, call_id)
            if index is None:
                return [self._run_alone(fn, args, not_after) for args in calls]
            error_class, reason = self._classify_death(error, oom_kills)
            died = GuardError(error_class, f"{_name(fn)}: worker {reason}")
            died.__cause__ = error
            return [
                *self.run_each(fn, calls[:index], not_after=not_after),
                ItemOutcome[T](error=died),
                *self.run_each(fn, calls[index + 1 :], not_after=not_after),
            ]
        except TimeoutError:
            # The backstop fired, so no item's alarm did: run each alone, with its own timeout.
            return [self._run_alone(fn, args, not_after) for args in calls]
        except BrokenProcessPool:
            self._discard(pool)
            raise
        outcomes = [
            ItemOutcome[T](value=cast(T, value))
            if ok
            else ItemOutcome[T](error=self._item_error(fn, value))
            for ok, value in done
        ]
        rest = calls[len(done) :]
        if rest and (not_after is None or time.monotonic() <= not_after):
            # The worker stopped with its results filling its share of memory: send the rest.
            return outcomes + self.run_each(fn, rest, not_after=not_after)
        return outcomes + [ItemOutcome[T](started=False)] * len(rest)

    def _run_alone(
        self, fn: Callable[..., T], args: tuple[Any, ...], not_after: float | None
    ) -> ItemOutcome[T]:
        """One item through ``run``, as an outcome; unstarted past ``not_after``."""
        if not_after is not None and time.monotonic() > not_after:
            return ItemOutcome[T](started=False)
        try:
            return ItemOutcome[T](value=self.run(fn, *args))
        except BrokenProcessPool:
            raise
        except Exception as error:
            return ItemOutcome[T](error=error)

    def _item_error(self, fn: Callable[..., Any], error: BaseException) -> BaseException:
        """What the caller gets for ``error``, raised by one item of ``fn`` in its worker."""
        if isinstance(error, MemoryError):
            memory = GuardError(
                "memory", f"{_name(fn)} ran out of memory (limit {self.memory_mb} MiB)"
            )
            memory.__cause__ = error
            return memory
        return error

    def _progress_of(self, pid: int | None, call_id: int) -> int | None:
        """The index of the item of call ``call_id`` that worker ``pid`` last started."""
        if pid is None:
            return None
        slot = PROGRESS_FIELDS * (pid % USAGE_SLOTS)
        if self._progress[slot] != pid or self._progress[slot + 1] != call_id:
            return None
        return int(self._progress[slot + 2])

    def close(self) -> None:
        """Stop the workers after any items still running; the pool cannot be used again."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()  # type: ignore[no-untyped-call]  # pebble leaves it unannotated
            pool.join()
            restore_script_main()

    def _live_pool(self) -> ProcessPool:
        """Return the current pebble pool, creating it on first use or when it broke."""
        broken = None
        with self._lock:
            if self._closed:
                raise RuntimeError("GuardedPool is closed")
            # pebble stops a pool for good when a worker dies while no item is running
            # ("All workers expired"), which no running item hears of.
            if self._pool is not None and not self._pool.active:
                broken, self._pool = self._pool, None
            if self._pool is None:
                hide_script_main()
                undo_inherited_process_state()
                self._pool = ProcessPool(
                    max_workers=self.workers,
                    max_tasks=0,
                    initializer=init_worker,
                    initargs=(self._limit_bytes, self._usage, self.cpu_s, self._progress),
                    context=self._context,
                )
            pool = self._pool
        if broken is not None:
            self._stop(broken)
        return pool

    def _discard(self, pool: ProcessPool) -> None:
        """Drop ``pool`` and stop its workers, unless another thread already replaced it."""
        with self._lock:
            if self._pool is not pool:
                return
            self._pool = None
        self._stop(pool)

    @staticmethod
    def _stop(pool: ProcessPool) -> None:
        """Stop a pool that is no longer current, without waiting for its items."""
        pool.stop()  # type: ignore[no-untyped-call]  # pebble leaves it unannotated
        pool.join()
        restore_script_main()

    def _classify_death(self, error: ProcessExpired, oom_kills: int | None) -> tuple[str, str]:
        """Return (error_class, reason) for a worker that died while running an item."""
        exitcode = error.exitcode
        if exitcode is not None and exitcode < 0:
            try:
                how = f"killed by {signal.Signals(-exitcode).name}"
            except ValueError:
                how = f"killed by signal {-exitcode}"
        else:
            how = f"exited with code {exitcode}"
        if exitcode == -signal.SIGALRM:
            # Only run_items arms the alarm, for one item at a time.
            return "timeout", f"{how}: the item ran longer than {self.timeout_s} s"
        if exitcode == -signal.SIGXCPU:
            # Only RLIMIT_CPU sends SIGXCPU, and it is armed only while an item runs.
            return "timeout", f"{how}: the item used more than {self.cpu_s} s of CPU"
        if exitcode == -signal.SIGKILL and oom_kills is not None:
            now = read_oom_kills(self._oom_events)
            if now is not None and now > oom_kills:
                return "memory", f"{how}; the cgroup OOM killer fired meanwhile"
        used = self._last_address_space(error.pid)
        limit = self._limit_bytes
        if used is not None and limit is not None and used >= _NEAR_LIMIT_FRACTION * limit:
            return "memory", f"{how} at {used / 2**20:.0f} of {self.memory_mb} MiB address space"
        return "crash", how

    def _last_address_space(self, pid: int | None) -> int | None:
        """Return the last address-space sample of worker ``pid``, if there is one."""
        if self._usage is None or pid is None:
            return None
        slot = 2 * (pid % USAGE_SLOTS)
        if self._usage[slot] != pid or self._usage[slot + 1] <= 0:
            return None
        return int(self._usage[slot + 1])


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", repr(fn))
