"""Run one untrusted-input function per item in a killable, memory-capped worker process.

A hostile PDF can make a parser loop for hours, allocate until the machine swaps, or crash
the interpreter. ``GuardedPool`` runs each item in a reusable worker process (a pebble
``ProcessPool``) with a wall-clock timeout and an address-space limit, and turns every way
an item can break the worker into a ``GuardError`` whose ``error_class`` names it:

- ``timeout``: the item ran past ``timeout_s``, and pebble killed the worker and started a new
  one; or the item used more than ``cpu_s`` seconds of CPU, and the kernel ended the worker
  with SIGXCPU (its RLIMIT_CPU, see below).
- ``memory``: the item raised ``MemoryError`` under the worker's RLIMIT_AS (or an exception
  caused by one), or the worker died in a way that looks like running out of memory: killed
  by the kernel OOM killer, or dead while its address space was within 10 % of the limit.
- ``crash``: the worker died some other way (a signal such as SIGSEGV or SIGKILL, ``os._exit``),
  or ``fn`` raised ``SystemExit``/``KeyboardInterrupt``, which must not end the caller.
- ``oversize``: raised by ``check_size`` before any worker is involved.

Every other exception from ``fn`` is re-raised in the caller with its own type. It crosses the
process boundary by pickling, so a custom exception class must be picklable: either pass
every ``__init__`` argument on to ``super().__init__(*args)``, or define ``__reduce__`` (as
``GuardError`` does). An exception that cannot make the round trip arrives as ``RemoteError``
instead of breaking the pool. ``fn``, its arguments and its return value must be picklable
too, so ``fn`` must be a module-level function.

Workers start with the ``forkserver`` method. The caller is typically an Airflow task
process, itself forked from a threaded supervisor and running threads of its own; ``fork``
from such a process can copy a lock held by another thread and deadlock the child, and
would also hand the task's open sockets and log handles to every worker. ``forkserver``
forks workers from a clean single-threaded server instead. Measured on a 2-vCPU Linux VM,
Python 3.11: the first worker in a process takes about 110 ms (it starts the server too),
each later one, including each replacement after a timeout or crash, 55-75 ms (``spawn``:
80-115 ms every time); an item on a warm worker costs about 1 ms of overhead. Importing
the item function's module (pypdf: about 100 ms) happens once per worker, before the
item's clock starts.

The wall-clock timeout is watched by threads in the caller. Two guards hold without them,
for when the caller is killed, frozen or stuck:

- **CPU.** While an item runs, its worker's soft RLIMIT_CPU is its CPU time so far plus
  ``cpu_s`` (default ``2 * timeout_s``: the wall clock normally fires first, the CPU limit
  is the backstop), so the kernel ends a spinning worker with SIGXCPU, reported as
  ``timeout``. Between items the soft limit is lifted again: the limit counts a process's
  whole life, and an idle worker must not die of what its earlier items used. The hard
  limit is left as inherited (an unprivileged process could never raise it again); a
  finite one keeps the soft limit a second below it, so the CPU limit ends a worker with
  SIGXCPU, not with the kernel's SIGKILL at the hard limit (which only an item that
  catches or ignores SIGXCPU can reach, and is then reported as ``crash``). Workers dump
  no core: SIGXCPU's default action would otherwise write a copy of the worker's memory,
  the untrusted document included, into the task's working directory.
- **Parent death.** A worker is a child of the forkserver, not of the task process, so
  ``PR_SET_PDEATHSIG`` alone would tie it to the wrong process: when the task process is
  SIGKILLed, the forkserver lives on as long as any process holds the write end of its
  "alive" pipe, and multiprocessing hands that to every worker. So each worker, once its
  parent-death signal (SIGKILL) is set, closes its copy. Then the task process is the
  only holder: when it dies, the forkserver reads EOF and exits, and the kernel SIGKILLs
  every worker, whatever it is stuck in. The forkserver gets no death signal of its own:
  it is started from whichever caller thread came first, and the signal fires when that
  *thread* exits. Limits: a forkserver child that is not a GuardedPool worker (another
  library's pool in the same task process) keeps the forkserver, and with it these
  workers, alive until it exits too; on a system without ``prctl`` (not Linux) workers
  only stop when their item ends.

A worker failing to start, or a return value the caller cannot unpickle, breaks the pebble
pool: ``run`` then re-raises pebble's ``BrokenProcessPool`` (a setup fault, not the item's)
and starts a fresh pool on the next call. pebble also gives up on its pool when a worker
dies between items (killed from outside, or with its forkserver); no item hears of that,
and the next ``run`` starts a fresh pool too. pebble keeps a worker's last return value
alive until its next item finishes, so ``memory_mb`` has to hold two results at once.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import math
import multiprocessing
import os
import pickle
import resource
import signal
import stat
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import forkserver
from pathlib import Path
from types import TracebackType
from typing import Any, Final, TypeVar, cast

from pebble import ProcessExpired, ProcessPool
from pebble.common.types import RemoteTraceback

__all__ = ["ERROR_CLASSES", "GuardError", "GuardedPool", "RemoteError", "check_size"]

T = TypeVar("T")

ERROR_CLASSES: Final = ("timeout", "memory", "crash", "oversize")

# A worker whose last sampled address space was this close to its limit when it died is
# taken to have died of the limit (a C library that cannot handle a failed malloc).
_NEAR_LIMIT_FRACTION: Final = 0.9
_SAMPLE_INTERVAL_S: Final = 0.01
# Address-space samples are kept per worker pid modulo this; pids are verified on read.
_USAGE_SLOTS: Final = 4096
_SAMPLER_STACK_BYTES: Final = 256 * 1024
# mallopt parameter numbers from glibc's <malloc.h>.
_M_MMAP_THRESHOLD: Final = -3
_M_ARENA_MAX: Final = -8
# From <linux/prctl.h>.
_PR_SET_PDEATHSIG: Final = 1
# Default CPU allowance of one item, in multiples of its wall-clock timeout.
_CPU_PER_TIMEOUT: Final = 2


class GuardError(Exception):
    """An item broke a guard; error_class is one of 'timeout', 'memory', 'crash', 'oversize'."""

    error_class: str
    message: str

    def __init__(self, error_class: str, message: str) -> None:
        """Record which guard broke (``error_class``) and a human-readable ``message``."""
        if error_class not in ERROR_CLASSES:
            raise ValueError(
                f"unknown error class {error_class!r}; expected one of {ERROR_CLASSES}"
            )
        super().__init__(message)
        self.error_class = error_class
        self.message = message

    def __reduce__(self) -> tuple[type[GuardError], tuple[str, str]]:
        """Rebuild from both init arguments: the default pickling would pass only ``args``."""
        return (type(self), (self.error_class, self.message))

    def __str__(self) -> str:
        """Return ``'<error_class>: <message>'``."""
        return f"{self.error_class}: {self.message}"


class RemoteError(Exception):
    """An exception from ``fn`` that could not be pickled back; it keeps the type name and text."""

    type_name: str
    message: str

    def __init__(self, type_name: str, message: str) -> None:
        """Record the original exception's qualified type name and ``str()``."""
        super().__init__(type_name, message)
        self.type_name = type_name
        self.message = message

    def __str__(self) -> str:
        """Return ``'<type_name>: <message>'``."""
        return f"{self.type_name}: {self.message}"


def check_size(path: str | os.PathLike[str], max_bytes: int) -> int:
    """Return the size from os.stat, never reading the file; GuardError('oversize') above max_bytes.

    Anything but a regular file is refused as well, as a terminal ``ItemError('unreadable')``:
    the size of a FIFO or a device says nothing about how much a read of it returns, and
    such a file is no document that can be read (ADR 0074).
    """
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        from replayable.retry import ItemError

        raise ItemError("unreadable", f"{os.fspath(path)} is not a regular file")
    if info.st_size > max_bytes:
        raise GuardError(
            "oversize", f"{os.fspath(path)} is {info.st_size} bytes, over the limit of {max_bytes}"
        )
    return info.st_size


# --- worker side ----------------------------------------------------------------------


# Set while an item runs. Samples matter only when a worker dies running an item, so the
# sampler waits on this between items and an idle worker costs no CPU.
_item_running = threading.Event()
# This worker's (pid, address-space bytes) pair in the shared array, set by _init_worker.
_usage: Any = None
_usage_slot = 0


def _sample_address_space(usage: Any, slot: int) -> None:
    """While an item runs, keep writing this process's address-space size into ``usage``."""
    page = os.sysconf("SC_PAGE_SIZE")
    try:
        fd = os.open("/proc/self/statm", os.O_RDONLY)
    except OSError:
        return  # no procfs: deaths near the limit are then reported as plain crashes
    while True:
        _item_running.wait()
        with contextlib.suppress(OSError, ValueError, IndexError):
            usage[slot + 1] = int(os.pread(fd, 128, 0).split()[0]) * page
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
    # serves big blocks from the heap and keeps them there: after one memory-hungry item
    # the worker would stay near its limit for every item after it.
    mallopt(_M_MMAP_THRESHOLD, 128 * 1024)


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


def _lift_cpu_limit() -> None:
    """Lift the soft CPU limit between items; the limit counts a process's whole life."""
    resource.setrlimit(resource.RLIMIT_CPU, (_cpu_hard_limit, _cpu_hard_limit))


def _init_worker(limit_bytes: int | None, usage: Any, cpu_budget_s: int) -> None:
    """Set up the worker's guards and start sampling its address space; runs once per worker."""
    global _cpu_budget_s, _cpu_hard_limit, _usage, _usage_slot
    # A segfaulting item then leaves a Python traceback in the task log, not just "-11".
    faulthandler.enable()
    _die_with_owner()
    _soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
    # Ending the process is SIGXCPU's default action; make sure nothing inherited changed it.
    signal.signal(signal.SIGXCPU, signal.SIG_DFL)
    _cpu_budget_s = cpu_budget_s
    _cpu_hard_limit = resource.getrlimit(resource.RLIMIT_CPU)[1]
    if limit_bytes is None:
        return
    _tune_malloc()
    if usage is not None:
        slot = 2 * (os.getpid() % _USAGE_SLOTS)
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


def _call(fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    """Run ``fn(*args)`` in the worker under its CPU limit; make sure what it raises gets back."""
    _arm_cpu_limit()
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


# --- caller side ----------------------------------------------------------------------


def _oom_events_file() -> Path | None:
    """Return the cgroup file whose ``oom_kill`` counter covers this process, if readable."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    candidates: list[Path] = []
    for line in lines:
        _hierarchy, controllers, group = line.split(":", 2)
        group = group.lstrip("/")
        if controllers == "":  # cgroup v2
            candidates += [Path("/sys/fs/cgroup", group, "memory.events")]
        elif "memory" in controllers.split(","):  # cgroup v1
            candidates += [Path("/sys/fs/cgroup/memory", group, "memory.oom_control")]
    # Inside a container the listed group may not be visible: fall back to the mount root.
    candidates += [
        Path("/sys/fs/cgroup/memory.events"),
        Path("/sys/fs/cgroup/memory/memory.oom_control"),
    ]
    for candidate in candidates:
        if _read_oom_kills(candidate) is not None:
            return candidate
    return None


def _read_oom_kills(events: Path | None) -> int | None:
    """Return the ``oom_kill`` count in a cgroup memory events file, or None."""
    if events is None:
        return None
    try:
        for line in events.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


_main_lock = threading.Lock()
_main_users = 0
_script_main: Any = None


def _hide_script_main() -> None:
    """While a pool is alive, keep workers from re-running the caller's ``__main__`` script.

    multiprocessing's forkserver and spawn children execute the parent's main script again
    when the parent was started as a script (``__main__`` with a ``__file__`` but no
    ``__spec__``). In an Airflow task that script is the ``airflow`` command: importing it
    configures Airflow against a metadata database the task process is not given, so every
    worker died at start ("All workers expired"), and under ``airflow dags test`` each
    worker paid a full Airflow import. A stand-in ``__main__`` with neither attribute makes
    the children leave main alone; the real one is put back when the last pool closes.
    """
    global _main_users, _script_main
    with _main_lock:
        if _main_users == 0:
            main = sys.modules["__main__"]
            if getattr(main, "__spec__", None) is None and hasattr(main, "__file__"):
                _script_main = main
                sys.modules["__main__"] = types.ModuleType("__main__")
        _main_users += 1


def _restore_script_main() -> None:
    """Undo one ``_hide_script_main``."""
    global _main_users, _script_main
    with _main_lock:
        _main_users -= 1
        if _main_users == 0 and _script_main is not None:
            sys.modules["__main__"] = _script_main
            _script_main = None


def _undo_inherited_process_state() -> None:
    """Let this process start workers although it was forked from a Celery pool process.

    A Celery prefork worker's pool processes are daemonic, and Airflow's task process is
    forked from one of them, inheriting multiprocessing's record of the current process from
    Celery's multiprocessing fork (billiard): the daemon flag, with which multiprocessing
    refuses to start any child ("daemonic processes are not allowed to have children"), and
    billiard's authentication key, which multiprocessing cannot pass to a forkserver child.
    The task process is no daemon of anyone's pool: it owns its workers, and they die with
    it. No public API resets either; both are set back to what a plain process has.
    """
    config = multiprocessing.current_process()._config  # type: ignore[attr-defined]
    if config.get("daemon"):
        config["daemon"] = False
    # typeshed does not declare AuthenticationString, multiprocessing's own bytes type.
    plain: Any = getattr(multiprocessing.process, "AuthenticationString")  # noqa: B009
    authkey = config.get("authkey")
    if authkey is not None and type(authkey) is not plain:
        config["authkey"] = plain(bytes(authkey))


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
            self._usage = self._context.RawArray("q", 2 * _USAGE_SLOTS)
        self._oom_events = _oom_events_file()
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
        oom_kills = _read_oom_kills(self._oom_events)
        name = getattr(fn, "__qualname__", repr(fn))
        try:
            future = pool.schedule(_call, args=(fn, args), timeout=self.timeout_s)
            return cast(T, future.result())
        except GuardError:
            raise
        except MemoryError as error:
            raise GuardError(
                "memory", f"{name} ran out of memory (limit {self.memory_mb} MiB)"
            ) from error
        except TimeoutError as error:
            if isinstance(error.__cause__, RemoteTraceback):
                raise  # fn's own TimeoutError, e.g. from a socket: not ours to classify
            raise GuardError(
                "timeout", f"{name} ran longer than {self.timeout_s} s; its worker was killed"
            ) from None
        except ProcessExpired as error:
            error_class, reason = self._classify_death(error, oom_kills)
            raise GuardError(error_class, f"{name}: worker {reason}") from error
        except BrokenProcessPool:
            # Workers that cannot start, or a result the caller cannot unpickle: a fault of
            # the setup or of fn, not of this item, so it must not be filed as one. Nothing
            # more can run on a broken pebble pool; the next run starts a fresh one.
            self._discard(pool)
            raise

    def close(self) -> None:
        """Stop the workers after any items still running; the pool cannot be used again."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()  # type: ignore[no-untyped-call]  # pebble leaves it unannotated
            pool.join()
            _restore_script_main()

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
                _hide_script_main()
                _undo_inherited_process_state()
                self._pool = ProcessPool(
                    max_workers=self.workers,
                    max_tasks=0,
                    initializer=_init_worker,
                    initargs=(self._limit_bytes, self._usage, self.cpu_s),
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
        _restore_script_main()

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
        if exitcode == -signal.SIGXCPU:
            # Only RLIMIT_CPU sends SIGXCPU, and it is armed only while an item runs.
            return "timeout", f"{how}: the item used more than {self.cpu_s} s of CPU"
        if exitcode == -signal.SIGKILL and oom_kills is not None:
            now = _read_oom_kills(self._oom_events)
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
        slot = 2 * (pid % _USAGE_SLOTS)
        if self._usage[slot] != pid or self._usage[slot + 1] <= 0:
            return None
        return int(self._usage[slot + 1])
