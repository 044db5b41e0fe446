"""The worker side of a guarded pool: what each worker process sets up, and how it runs an item.

Run once per worker (:func:`init_worker`): the parent-death signal, no core dumps, the CPU
limit's hard bound, malloc tuned so that the address space tracks live data, RLIMIT_AS, and
a thread that samples the address space while an item runs. Run per item (:func:`run_item`):
the CPU limit armed for the item and lifted after it, and whatever the item raises made fit
to reach the caller. :func:`run_items` runs several items in one call, each under those
limits and its own wall-clock alarm, and says in shared memory which item it is on, so that
the caller can tell which one a dead worker died of. See :mod:`replayable.guards` for why
each is needed.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import math
import os
import pickle
import resource
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing import forkserver
from typing import Any, Final, TypeVar

from pebble.common.types import RemoteException

from replayable.guards.errors import GuardError, RemoteError

T = TypeVar("T")

_SAMPLE_INTERVAL_S: Final = 0.01
# Address-space samples are kept per worker pid modulo this; pids are verified on read.
USAGE_SLOTS: Final = 4096
_SAMPLER_STACK_BYTES: Final = 256 * 1024
# mallopt parameter numbers from glibc's <malloc.h>.
_M_MMAP_THRESHOLD: Final = -3
_M_ARENA_MAX: Final = -8
_M_TRIM_THRESHOLD: Final = -1
# Blocks this large or larger are mapped on their own and unmapped when freed.
_MMAP_THRESHOLD_BYTES: Final = 512 * 1024
# Free memory at the heap's top beyond this is given back to the system.
_TRIM_THRESHOLD_BYTES: Final = 4 * 2**20
# From <linux/prctl.h>.
_PR_SET_PDEATHSIG: Final = 1


# Set while an item runs. Samples matter only when a worker dies running an item, so the
# sampler waits on this between items and an idle worker costs no CPU.
_item_running = threading.Event()
# This worker's (pid, address-space bytes) pair in the shared array, set by _init_worker.
_usage: Any = None
_usage_slot = 0
# This worker's (pid, call, item index) triple in the shared progress array: which item of
# which several-item call it is running (PROGRESS_FIELDS values per slot, same slots).
PROGRESS_FIELDS: Final = 3
_progress: Any = None
_progress_slot = 0
# run_items starts no further item once the worker's address space has grown by this share of
# its limit since the call began: the results it holds until the call returns must still fit
# twice (pickled to be sent), with the last call's, which pebble keeps until this one ends.
_CALL_SHARE_OF_LIMIT: Final = 0.25
_call_bytes: int | None = None
# /proc/self/statm, opened once by _init_worker when there is a memory limit to watch.
_statm_fd: int | None = None


def _sample_address_space(usage: Any, slot: int) -> None:
    """While an item runs, keep writing this process's address-space size into ``usage``."""
    if _statm_fd is None:
        return  # no procfs: deaths near the limit are then reported as plain crashes
    while True:
        _item_running.wait()
        usage[slot + 1] = _address_space()
        time.sleep(_SAMPLE_INTERVAL_S)


def _start_sampling() -> None:
    """Wake the sampler for an item, forgetting the last item's sample."""
    if _usage is not None:
        _usage[_usage_slot + 1] = 0
        _item_running.set()


def _tune_malloc() -> None:
    """Make glibc's malloc give freed memory back, so the address space tracks live data."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return  # not glibc: nothing to tune
    # A second thread would get its own arena, reserving 64 MiB of address space that
    # RLIMIT_AS counts although it is never used.
    mallopt(_M_ARENA_MAX, 1)
    # A fixed threshold turns off glibc's adaptive one, which after the first large free
    # serves big blocks (up to 32 MiB) from the heap and keeps them there: after one
    # memory-hungry item the worker would stay near its limit for every item after it.
    # 512 KiB and not glibc's starting 128 KiB: PDFium allocates blocks between the two on
    # every page, and mapping each one cost 1 ms of a 6.7 ms document (ADR 0121). Fixing it
    # also fixes the trim threshold, at 128 KiB, below which the heap's free top is kept:
    # at that, the heap shrank and grew again on every page, for the same millisecond. Up
    # to 4 MiB of free heap is kept for the next block instead.
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)
    mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES)


def _die_with_owner() -> None:
    """Have the kernel SIGKILL this worker when the task process that owns its pool dies.

    See the module docstring: the death signal follows the forkserver, and closing the
    inherited end of its alive pipe makes the forkserver follow the task process.
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getppid()
    status = libc.prctl(
        ctypes.c_int(_PR_SET_PDEATHSIG),
        ctypes.c_ulong(signal.SIGKILL),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
    )
    if status != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
    if os.getppid() != parent:
        # The forkserver died before the signal was set, so it will never come.
        os.kill(os.getpid(), signal.SIGKILL)
    # Only now: until this worker lets go of the pipe, the forkserver cannot exit, so it
    # cannot die before the signal above is in place.
    server = forkserver._forkserver
    alive_fd = getattr(server, "_forkserver_alive_fd", None)
    if isinstance(alive_fd, int):
        os.close(alive_fd)
        # Were this worker ever to start processes with forkserver, it would start its own.
        server._forkserver_alive_fd = None  # type: ignore[attr-defined]  # private, untyped


# The CPU allowance of one item and the inherited hard RLIMIT_CPU, set by _init_worker.
_cpu_budget_s = 0
_cpu_hard_limit = resource.RLIM_INFINITY


def _arm_cpu_limit() -> None:
    """Have the kernel send SIGXCPU once this worker has used its item's CPU allowance."""
    soft = math.ceil(time.process_time()) + _cpu_budget_s
    if _cpu_hard_limit != resource.RLIM_INFINITY:
        # SIGXCPU must come first: at the hard limit the kernel sends SIGKILL instead.
        soft = max(0, min(soft, _cpu_hard_limit - 1))
    resource.setrlimit(resource.RLIMIT_CPU, (soft, _cpu_hard_limit))


# The memory limit of one item, the inherited hard RLIMIT_AS, and the worker's address space
# once set up (what it holds with no item and no result), set by init_worker.
_limit_bytes: int | None = None
_as_hard_limit = resource.RLIM_INFINITY
_idle_bytes = 0


def _arm_memory_limit() -> None:
    """Give the next item its own memory limit, over what the worker holds for others.

    The results of the call's earlier items, and the last call's result that pebble keeps
    until this call ends, are in the address space while the item runs: RLIMIT_AS is the
    limit plus that (at most half a limit more), so that an item is never charged with its
    batch-mates' memory (ADR 0126).
    """
    if _limit_bytes is None:
        return
    held = 0
    if _statm_fd is not None:
        held = min(max(0, _address_space() - _idle_bytes), _limit_bytes // 2)
    soft = _limit_bytes + held
    if _as_hard_limit != resource.RLIM_INFINITY:
        soft = min(soft, _as_hard_limit)
    resource.setrlimit(resource.RLIMIT_AS, (soft, _as_hard_limit))


def _lift_cpu_limit() -> None:
    """Lift the soft CPU limit between items; the limit counts a process's whole life."""
    resource.setrlimit(resource.RLIMIT_CPU, (_cpu_hard_limit, _cpu_hard_limit))


def init_worker(limit_bytes: int | None, usage: Any, cpu_budget_s: int, progress: Any) -> None:
    """Set up the worker's guards and start sampling its address space; runs once per worker."""
    global _cpu_budget_s, _cpu_hard_limit, _usage, _usage_slot, _progress, _progress_slot
    global _call_bytes, _statm_fd, _limit_bytes, _as_hard_limit, _idle_bytes
    # A segfaulting item then leaves a Python traceback in the task log, not just "-11".
    faulthandler.enable()
    _die_with_owner()
    _soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
    # Ending the process is SIGXCPU's default action; make sure nothing inherited changed it.
    signal.signal(signal.SIGXCPU, signal.SIG_DFL)
    # pebble stops a timed-out worker with SIGTERM, and its handler is Python code, which
    # cannot run while the item is stuck in C (a lock, a native hang): pebble then waits 3 s
    # before SIGKILL. The default action ends the worker at once, wherever it is.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # run_items's per-item alarm: the default action ends the worker, even inside C code.
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    _progress = progress
    _progress_slot = PROGRESS_FIELDS * (os.getpid() % USAGE_SLOTS)
    _cpu_budget_s = cpu_budget_s
    _cpu_hard_limit = resource.getrlimit(resource.RLIMIT_CPU)[1]
    if limit_bytes is None:
        return
    _call_bytes = int(_CALL_SHARE_OF_LIMIT * limit_bytes)
    with contextlib.suppress(OSError):
        _statm_fd = os.open("/proc/self/statm", os.O_RDONLY)
    _tune_malloc()
    if usage is not None:
        slot = 2 * (os.getpid() % USAGE_SLOTS)
        usage[slot] = os.getpid()
        usage[slot + 1] = 0
        _usage, _usage_slot = usage, slot
        # A small stack: the default 8 MiB reservation would count against RLIMIT_AS.
        previous = threading.stack_size(_SAMPLER_STACK_BYTES)
        try:
            threading.Thread(
                target=_sample_address_space, args=(usage, slot), name="guard-sampler", daemon=True
            ).start()
        finally:
            threading.stack_size(previous)
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit_bytes = min(limit_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, hard))
    _limit_bytes, _as_hard_limit, _idle_bytes = limit_bytes, hard, _address_space()


def _caused_by_memory_error(error: BaseException) -> bool:
    """Return whether a MemoryError is in ``error``'s cause/context chain."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, MemoryError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _survives_pickling(error: BaseException) -> bool:
    """Return whether ``error`` can be pickled here and rebuilt in the caller."""
    try:
        pickle.loads(pickle.dumps(error))  # noqa: S301  # our own bytes, made one line above
    except Exception:
        return False
    return True


def _release_frames(error: BaseException) -> None:
    """Drop the local variables of the frames in ``error``'s tracebacks, keeping the lines.

    pebble holds the last result, exception included, until the next item finishes; the
    frames would otherwise keep whatever the failed item had allocated alive meanwhile.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        current = current.__cause__ or current.__context__


def run_item(fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    """Run ``fn(*args)`` in the worker under its CPU limit; make sure what it raises gets back."""
    _arm_cpu_limit()
    _arm_memory_limit()
    _start_sampling()
    try:
        return fn(*args)
    except BaseException as error:
        _release_frames(error)
        replacement = _transportable(error)
        if replacement is error:
            raise
        # The remote traceback text that reaches the caller then still shows the original.
        raise replacement from error
    finally:
        _item_running.clear()
        _lift_cpu_limit()


def run_items(
    fn: Callable[..., T],
    calls: list[tuple[Any, ...]],
    call_id: int,
    timeout_s: float,
    not_after: float | None,
) -> list[tuple[bool, Any]]:
    """Run ``fn(*args)`` for each of ``calls`` in turn, each as :func:`run_item` runs one.

    Return one (ok, value) per item started, where an item that raised has for value its
    exception wrapped as pebble wraps a single call's (it arrives with the remote traceback
    as its cause). Items start in order, and none once ``time.monotonic()`` (the machine's
    clock, the caller's too) is past ``not_after``, so the list may be shorter than
    ``calls``. Each item has its own wall-clock alarm of ``timeout_s``: SIGALRM, whose
    default action ends the worker wherever it is, for the caller to classify as that
    item's timeout. Before each item the worker writes (pid, ``call_id``, index) to its
    progress slot, which tells the caller, should the worker die, which item it died of.
    No further item starts either once the address space has grown by a quarter of the
    memory limit since the call began: the caller sends the rest in another call.
    """
    outcomes: list[tuple[bool, Any]] = []
    at_start = _address_space() if _call_bytes is not None else 0
    for index, args in enumerate(calls):
        if not_after is not None and time.monotonic() > not_after:
            break
        if outcomes and _call_bytes is not None and _address_space() - at_start > _call_bytes:
            break
        if _progress is not None:
            _progress[_progress_slot : _progress_slot + PROGRESS_FIELDS] = [
                os.getpid(),
                call_id,
                index,
            ]
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            outcomes.append((True, run_item(fn, args)))
        except BaseException as error:
            wrapped = RemoteException(error, traceback.format_exc())  # type: ignore[no-untyped-call]  # pebble leaves it unannotated
            outcomes.append((False, wrapped))
            traceback.clear_frames(error.__traceback__)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    return outcomes


def _address_space() -> int:
    """This process's address-space size in bytes (0 without procfs, or on a failed read)."""
    if _statm_fd is None:
        return 0
    try:
        return int(os.pread(_statm_fd, 128, 0).split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _transportable(error: BaseException) -> BaseException:
    """Return what to raise in the caller's place for ``error`` raised by an item."""
    if isinstance(error, MemoryError):
        return error
    if isinstance(error, Exception):
        # Libraries that catch Exception may turn a MemoryError into some other error.
        if _caused_by_memory_error(error):
            return MemoryError(f"{type(error).__name__} after MemoryError: {error}")
        if not _survives_pickling(error):
            # The caller could not unpickle it, and pebble would then declare the whole
            # pool broken; send something that keeps the pool alive and the message.
            return RemoteError(f"{type(error).__module__}.{type(error).__qualname__}", str(error))
        return error
    # SystemExit, KeyboardInterrupt and the like must not end the caller's process.
    return GuardError("crash", f"worker raised {type(error).__name__}: {error}")
