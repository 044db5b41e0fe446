"""Tests for replayable.guards: each item runs in a killable, memory-capped worker."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from replayable.guards import GuardedPool, GuardError, RemoteError, check_size

# The containment tier: each test spends CPU, memory or time on purpose to prove a limit.
pytestmark = pytest.mark.containment

TIMEOUT_S = 1.0
MEMORY_MB = 256

# Worker functions live at module level: the pool pickles them by qualified name.


def add(a: int, b: int) -> int:
    return a + b


def worker_pid() -> int:
    return os.getpid()


def raise_value_error(message: str) -> None:
    raise ValueError(message)


def raise_timeout_error() -> None:
    raise TimeoutError("the item's own socket timed out")


def sleep_for(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def allocate_mb(megabytes: int) -> int:
    # Grows in steps, as a parser would, rather than asking for one impossible block.
    chunks = [bytearray(16 * 2**20) for _ in range(megabytes // 16)]
    return len(chunks)


def hide_memory_error() -> None:
    try:
        bytearray(64 * MEMORY_MB * 2**20)
    except MemoryError as error:
        raise RuntimeError("parser gave up") from error


def kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def segfault() -> None:
    ctypes.string_at(0)


def sigsegv_at_once() -> None:
    # Unlike a ctypes call, this keeps the GIL: no other thread runs before the death.
    os.kill(os.getpid(), signal.SIGSEGV)


def map_near_limit(limit_mb: int) -> int:
    statm = Path("/proc/self/statm").read_text().split()
    used = int(statm[0]) * os.sysconf("SC_PAGE_SIZE")
    # Mapped but never touched, so that unmapping it at the end takes no time at all.
    with mmap.mmap(-1, int(limit_mb * 2**20 * 0.95) - used) as ballast:
        time.sleep(0.1)  # long enough for the worker's address-space sampler to see it
        return len(ballast)


def address_space() -> int:
    return int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def churn(block_kib: int, total_mb: int) -> tuple[int, int, int]:
    """Allocate ``total_mb`` in blocks of ``block_kib``, each followed by a small block that
    outlives it (a parser's bookkeeping), then free the big ones; return the address space
    before, at the peak and after."""
    before = address_space()
    big, small = [], []
    for _ in range(total_mb * 1024 // block_kib):
        big.append(bytearray(block_kib * 1024))
        small.append(bytearray(1024))
    peak = address_space()
    del big
    after = address_space()
    return before, peak, after


def segfault_near_limit(limit_mb: int) -> None:
    statm = Path("/proc/self/statm").read_text().split()
    used = int(statm[0]) * os.sysconf("SC_PAGE_SIZE")
    _ballast = bytearray(int(limit_mb * 2**20 * 0.95) - used)
    time.sleep(0.1)  # long enough for the worker's address-space sampler to see it
    ctypes.string_at(0)


def call_exit() -> None:
    sys.exit(3)


def spin() -> None:
    while True:
        pass


def deadlock_in_c() -> None:
    """Lock a default pthread mutex twice: the worker blocks in the kernel, spends no CPU,
    and no signal makes the lock return to Python, as a native library's hang would."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    mutex = ctypes.create_string_buffer(64)  # all zeros: PTHREAD_MUTEX_INITIALIZER (glibc)
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)


def spin_cpu_for(seconds: float) -> float:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    return seconds


def hold(seconds: float) -> tuple[int, float, float]:
    """Sleep in a worker; return its pid and when the item started and ended (wall clock)."""
    started = time.time()
    time.sleep(seconds)
    return os.getpid(), started, time.time()


class ItemError(Exception):
    """A custom exception with an extra init argument, made picklable by passing it on."""

    def __init__(self, item_id: str, reason: str) -> None:
        super().__init__(item_id, reason)
        self.item_id = item_id
        self.reason = reason


class UnpicklableError(Exception):
    """A custom exception that cannot be rebuilt from its args (the common mistake)."""

    def __init__(self, item_id: str, reason: str) -> None:
        super().__init__(f"{item_id}: {reason}")


def raise_item_error() -> None:
    raise ItemError("doc-7", "bad xref")


def raise_unpicklable_error() -> None:
    raise UnpicklableError("doc-7", "bad xref")


@pytest.fixture(scope="module")
def pool() -> Iterator[GuardedPool]:
    """One pool for the module: surviving the items that break workers is under test too."""
    with GuardedPool(timeout_s=TIMEOUT_S, memory_mb=MEMORY_MB) as shared:
        yield shared


@pytest.fixture(scope="module")
def roomy_pool() -> Iterator[GuardedPool]:
    """A pool whose timeout no memory item reaches on a loaded machine, so that what it
    tests is the memory limit: in the shared pool's 1 s, allocating up to the 256 MiB limit
    once took longer under the parallel suite and came back as 'timeout'."""
    with GuardedPool(timeout_s=10 * TIMEOUT_S, memory_mb=MEMORY_MB) as shared:
        yield shared


def test_run_returns_the_value(pool: GuardedPool) -> None:
    """run returns what fn returns."""
    assert pool.run(add, 2, 3) == 5


def test_value_error_is_reraised_as_value_error(pool: GuardedPool) -> None:
    """An ordinary exception from fn reaches the caller with its own type and message."""
    with pytest.raises(ValueError, match="no /Root"):
        pool.run(raise_value_error, "no /Root")


def test_picklable_custom_exception_keeps_type_and_attributes(pool: GuardedPool) -> None:
    """A custom exception that passes all init args to super() arrives intact."""
    with pytest.raises(ItemError) as caught:
        pool.run(raise_item_error)
    assert (caught.value.item_id, caught.value.reason) == ("doc-7", "bad xref")


def test_unpicklable_custom_exception_becomes_remote_error(pool: GuardedPool) -> None:
    """An exception that cannot be rebuilt arrives as RemoteError and the pool keeps working."""
    with pytest.raises(RemoteError, match="UnpicklableError: doc-7: bad xref"):
        pool.run(raise_unpicklable_error)
    assert pool.run(add, 1, 1) == 2


def test_sleep_past_timeout_is_timeout_and_pool_keeps_working(pool: GuardedPool) -> None:
    """An item past timeout_s raises GuardError('timeout'); the next item runs normally."""
    started = time.monotonic()
    with pytest.raises(GuardError) as caught:
        pool.run(sleep_for, 30)
    assert caught.value.error_class == "timeout"
    assert time.monotonic() - started < TIMEOUT_S + 3
    assert pool.run(add, 2, 2) == 4


def test_an_item_stuck_in_native_code_is_killed_at_its_timeout(pool: GuardedPool) -> None:
    """No Python signal handler runs while an item is blocked in C: the worker must not wait
    for one (pebble's SIGTERM handler, then 3 s more before SIGKILL), so it ends at once."""
    started = time.monotonic()
    with pytest.raises(GuardError) as caught:
        pool.run(deadlock_in_c)
    assert caught.value.error_class == "timeout"
    assert time.monotonic() - started < TIMEOUT_S + 1.5  # pebble's grace would be 3 s more
    assert pool.run(add, 2, 2) == 4


def test_timeout_error_raised_by_fn_is_not_a_guard_timeout(pool: GuardedPool) -> None:
    """fn's own TimeoutError is re-raised as such, not reported as the guard's timeout."""
    with pytest.raises(TimeoutError, match="own socket") as caught:
        pool.run(raise_timeout_error)
    assert not isinstance(caught.value, GuardError)


def test_allocating_past_memory_limit_is_memory(roomy_pool: GuardedPool) -> None:
    """Allocating far past memory_mb raises GuardError('memory'); the pool keeps working."""
    with pytest.raises(GuardError) as caught:
        roomy_pool.run(allocate_mb, 8 * MEMORY_MB)
    assert caught.value.error_class == "memory"
    assert roomy_pool.run(add, 3, 3) == 6


def test_memory_freed_after_memory_error(roomy_pool: GuardedPool) -> None:
    """After a MemoryError the worker gives the memory back, so a later item has room."""
    with pytest.raises(GuardError):
        roomy_pool.run(allocate_mb, 8 * MEMORY_MB)
    assert roomy_pool.run(allocate_mb, MEMORY_MB // 2) == MEMORY_MB // 32


def test_exception_caused_by_memory_error_is_memory(roomy_pool: GuardedPool) -> None:
    """An exception raised while handling a MemoryError still counts as 'memory'."""
    with pytest.raises(GuardError) as caught:
        roomy_pool.run(hide_memory_error)
    assert caught.value.error_class == "memory"


def test_blocks_of_a_mib_are_given_back_even_when_small_ones_outlive_them(
    roomy_pool: GuardedPool,
) -> None:
    """Blocks from 512 KiB up are mapped on their own (ADR 0121): freed, they leave the
    address space, though small blocks allocated after each still live. From the heap, the
    small ones would pin it at the peak, and the next items would run that much nearer the
    limit."""
    before, peak, after = roomy_pool.run(churn, 1024, MEMORY_MB // 2)
    assert peak - before > MEMORY_MB // 4 * 2**20
    assert after - before < 16 * 2**20


def test_sigkill_is_crash_and_pool_keeps_working(pool: GuardedPool) -> None:
    """A worker killed by SIGKILL raises GuardError('crash'); the next item runs normally."""
    with pytest.raises(GuardError) as caught:
        pool.run(kill_self)
    assert caught.value.error_class == "crash"
    assert "SIGKILL" in str(caught.value)
    assert pool.run(add, 4, 4) == 8


def test_segfault_is_crash(pool: GuardedPool) -> None:
    """A segfault in native code raises GuardError('crash')."""
    with pytest.raises(GuardError) as caught:
        pool.run(segfault)
    assert caught.value.error_class == "crash"
    assert "SIGSEGV" in str(caught.value)


def test_segfault_near_memory_limit_is_memory(pool: GuardedPool) -> None:
    """A worker that dies with its address space near the limit is reported as 'memory'."""
    with pytest.raises(GuardError) as caught:
        pool.run(segfault_near_limit, MEMORY_MB)
    assert caught.value.error_class == "memory"


def test_crash_right_after_a_memory_hungry_item_is_crash(pool: GuardedPool) -> None:
    """The previous item's address-space sample does not make the next item's crash 'memory'."""
    first = pool.run(worker_pid)
    assert pool.run(map_near_limit, MEMORY_MB) > 0
    with pytest.raises(GuardError) as caught:
        pool.run(sigsegv_at_once)
    assert caught.value.error_class == "crash"
    assert pool.run(worker_pid) != first


def test_system_exit_is_crash_and_does_not_exit_caller(pool: GuardedPool) -> None:
    """sys.exit inside fn becomes GuardError('crash') instead of ending the caller."""
    with pytest.raises(GuardError) as caught:
        pool.run(call_exit)
    assert caught.value.error_class == "crash"


def test_worker_is_reused_across_items(pool: GuardedPool) -> None:
    """Two consecutive items run in the same worker process, not in the caller."""
    first = pool.run(worker_pid)
    assert pool.run(worker_pid) == first
    assert first != os.getpid()


# -- several items per call (run_each) ---------------------------------------------------


def act(what: str, arg: Any = None) -> Any:
    """One item of a run_each call: what it does is named, so that one fn serves them all."""
    actions: dict[str, Callable[[], Any]] = {
        "pid": worker_pid,
        "kill": kill_self,
        "deadlock": deadlock_in_c,
        "allocate": lambda: allocate_mb(arg),
        "hide_memory_error": hide_memory_error,
        "raise": lambda: raise_item_error(),
        "sleep": lambda: hold(arg),
        "result_mb": lambda: bytes(arg * 2**20),
    }
    return actions[what]()


def test_run_each_computes_every_item_in_one_worker_in_order(pool: GuardedPool) -> None:
    outcomes = pool.run_each(act, [("sleep", 0.01), ("sleep", 0.01), ("sleep", 0.01)])
    pids, started, ended = zip(*(outcome.result() for outcome in outcomes), strict=True)
    assert len(set(pids)) == 1 and pids[0] != os.getpid()
    # One after another, in the order given.
    assert started[0] < ended[0] <= started[1] < ended[1] <= started[2]


def test_an_item_that_kills_its_worker_is_the_only_one_of_its_call_to_fail(
    pool: GuardedPool,
) -> None:
    """The worker says which item it was on: that one is the crash, the others still end."""
    outcomes = pool.run_each(act, [("pid",), ("kill",), ("pid",), ("pid",)])
    assert isinstance(outcomes[1].error, GuardError)
    assert outcomes[1].error.error_class == "crash"
    ended = [outcomes[i].result() for i in (0, 2, 3)]
    # The items after the death ran on the worker that replaced it.
    assert ended[1] == ended[2] != os.getpid()


def test_an_item_stuck_in_native_code_times_out_alone_at_its_own_limit(
    pool: GuardedPool,
) -> None:
    """Each item has its own alarm: the stuck one ends at timeout_s, not at the call's
    backstop (one timeout_s per item of the call), and the items around it still end."""
    started = time.monotonic()
    outcomes = pool.run_each(act, [("pid",), ("deadlock",), ("pid",), ("pid",), ("pid",)])
    assert time.monotonic() - started < 2 * TIMEOUT_S + 1.5
    assert isinstance(outcomes[1].error, GuardError)
    assert outcomes[1].error.error_class == "timeout"
    assert all(isinstance(outcomes[i].result(), int) for i in (0, 2, 3, 4))


def test_an_item_past_the_memory_limit_is_memory_and_the_rest_of_its_call_ends(
    roomy_pool: GuardedPool,
) -> None:
    outcomes = roomy_pool.run_each(
        act, [("allocate", 8 * MEMORY_MB), ("pid",), ("hide_memory_error",), ("pid",)]
    )
    for failed in (outcomes[0], outcomes[2]):
        assert isinstance(failed.error, GuardError) and failed.error.error_class == "memory"
    assert outcomes[1].result() == outcomes[3].result()


def test_an_item_s_own_exception_keeps_its_type_and_remote_traceback(pool: GuardedPool) -> None:
    outcomes = pool.run_each(act, [("raise",), ("pid",)])
    with pytest.raises(ItemError) as caught:
        outcomes[0].result()
    assert (caught.value.item_id, caught.value.reason) == ("doc-7", "bad xref")
    assert "raise_item_error" in str(caught.value.__cause__)  # the worker's traceback
    assert isinstance(outcomes[1].result(), int)


def test_a_call_returns_early_when_its_results_fill_its_share_of_the_memory_limit() -> None:
    """Three results of 100 MiB would need 300 MiB held and 300 more pickled, past the
    512 MiB limit, and the worker would die sending them. It returns once the call has
    grown it by a quarter of the limit; the rest go in another call, and every result
    arrives."""
    with GuardedPool(timeout_s=30, memory_mb=512) as roomy:
        outcomes = roomy.run_each(act, [("result_mb", 100)] * 3)
        assert [len(o.result()) for o in outcomes] == [100 * 2**20] * 3


def test_no_item_of_a_call_starts_past_its_not_after(pool: GuardedPool) -> None:
    """Say a lease runs out while a call's first items run: the rest come back unstarted."""
    assert pool.run(add, 1, 1) == 2  # a warm worker: the items' starts are 0.5 s apart
    not_after = time.monotonic() + 0.75
    outcomes = pool.run_each(
        act, [("sleep", 0.5), ("sleep", 0.5), ("sleep", 0.5)], not_after=not_after
    )
    assert [o.started for o in outcomes] == [True, True, False]
    assert [o.result()[0] for o in outcomes[:2]] == [pool.run(worker_pid)] * 2
    with pytest.raises(RuntimeError, match="not started"):
        outcomes[2].result()
    assert all(not o.started for o in pool.run_each(act, [("pid",)], not_after=0.0))


def test_guard_error_survives_pickling() -> None:
    """GuardError keeps error_class and message through pickle, as it crosses processes."""
    error = pickle.loads(pickle.dumps(GuardError("timeout", "too slow")))  # noqa: S301  # own bytes
    assert (error.error_class, error.message, str(error)) == (
        "timeout",
        "too slow",
        "timeout: too slow",
    )


def test_guard_error_rejects_unknown_class() -> None:
    """GuardError accepts only the four documented error classes."""
    with pytest.raises(ValueError, match="unknown error class"):
        GuardError("slow", "nope")


def test_closed_pool_refuses_work() -> None:
    """run after close raises RuntimeError instead of starting workers again."""
    closed = GuardedPool(timeout_s=TIMEOUT_S, memory_mb=None)
    closed.close()
    with pytest.raises(RuntimeError, match="closed"):
        closed.run(add, 1, 2)


def test_check_size_oversize_from_stat_alone(tmp_path: Path) -> None:
    """check_size rejects a 1 GB sparse file at once: it stats the file, never reads it."""
    sparse = tmp_path / "sparse.pdf"
    with sparse.open("wb") as handle:
        handle.truncate(2**30)
    started = time.monotonic()
    with pytest.raises(GuardError) as caught:
        check_size(sparse, 10**6)
    assert caught.value.error_class == "oversize"
    assert check_size(sparse, 2**30) == 2**30
    assert time.monotonic() - started < 0.5


def test_check_size_returns_size_within_limit(tmp_path: Path) -> None:
    """check_size returns the byte size of a file at or under the limit."""
    small = tmp_path / "small.pdf"
    small.write_bytes(b"%PDF-1.7\n")
    assert check_size(small, 9) == 9
    assert check_size(str(small), 100) == 9


def test_check_size_rejects_a_fifo_as_unreadable(tmp_path: Path) -> None:
    """check_size refuses a FIFO, whose stat size does not bound a read, without blocking."""
    from replayable.retry import ErrorKind, ItemError

    fifo = tmp_path / "pipe.pdf"
    os.mkfifo(fifo)
    with pytest.raises(ItemError) as caught:
        check_size(fifo, 10**6)
    assert caught.value.error_class == "unreadable"
    assert caught.value.kind is ErrorKind.TERMINAL


def test_cpu_limit_is_passed_on_in_whole_seconds() -> None:
    """cpu_s defaults to twice timeout_s and is rounded up to whole seconds, as RLIMIT_CPU is."""
    assert GuardedPool(timeout_s=2.5, memory_mb=None).cpu_s == 5
    assert GuardedPool(timeout_s=0.2, memory_mb=None).cpu_s == 1
    assert GuardedPool(timeout_s=60, memory_mb=None, cpu_s=1.5).cpu_s == 2
    with pytest.raises(ValueError, match="cpu_s"):
        GuardedPool(timeout_s=1, memory_mb=None, cpu_s=0)


def test_spinning_item_is_timeout_by_cpu_limit_before_wall_clock() -> None:
    """An item spinning past cpu_s is ended by the kernel (SIGXCPU) long before timeout_s."""
    with GuardedPool(timeout_s=120, memory_mb=MEMORY_MB, cpu_s=1) as guarded:
        started = time.monotonic()
        with pytest.raises(GuardError) as caught:
            guarded.run(spin)
        assert caught.value.error_class == "timeout"
        assert "SIGXCPU" in str(caught.value)
        assert time.monotonic() - started < 60
        assert guarded.run(add, 5, 5) == 10


def test_cpu_limit_is_per_item_not_per_worker() -> None:
    """Items that together use more than cpu_s on one worker all finish: each gets its own."""
    with GuardedPool(timeout_s=120, memory_mb=MEMORY_MB, cpu_s=1) as guarded:
        first = guarded.run(worker_pid)
        assert [guarded.run(spin_cpu_for, 0.4) for _ in range(3)] == [0.4] * 3  # 1.2 s > cpu_s
        assert guarded.run(worker_pid) == first


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat_line.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _descendants(root: int) -> set[int]:
    """Pids of every living process below ``root``, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: set[int] = set()
    pending = [root]
    while pending:
        for child in children.get(pending.pop(), []):
            if child not in found:
                found.add(child)
                pending.append(child)
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux")
def test_workers_die_with_the_process_that_owns_the_pool(tmp_path: Path) -> None:
    """SIGKILL the task process while its workers are stuck: no worker nor forkserver lives on.

    One worker sleeps and one spins, with wall-clock and CPU limits far away, so only the
    parent-death chain can end them.
    """
    (tmp_path / "stuck.py").write_text(
        "import os, time\n"
        "def sleep(marker):\n"
        "    open(marker + '/' + str(os.getpid()), 'w').close()\n"
        "    time.sleep(600)\n"
        "def spin(marker):\n"
        "    open(marker + '/' + str(os.getpid()), 'w').close()\n"
        "    while True:\n"
        "        pass\n"
    )
    (tmp_path / "owner.py").write_text(
        "import os, sys, threading, time\n"
        "import stuck\n"
        "from replayable.guards import GuardedPool\n"
        "marker = sys.argv[1]\n"
        "pool = GuardedPool(timeout_s=600, memory_mb=None, workers=2)\n"
        "for item in (stuck.sleep, stuck.spin):\n"
        "    threading.Thread(target=pool.run, args=(item, marker), daemon=True).start()\n"
        "while len(os.listdir(marker)) < 2:\n"
        "    time.sleep(0.05)\n"
        "print('stuck', flush=True)\n"
        "time.sleep(600)\n"
    )
    marker = tmp_path / "started"
    marker.mkdir()
    include = Path(__file__).resolve().parents[3] / "include"
    owner = subprocess.Popen(
        [sys.executable, str(tmp_path / "owner.py"), str(marker)],
        env={**os.environ, "PYTHONPATH": f"{include}{os.pathsep}{tmp_path}"},
        stdout=subprocess.PIPE,
        text=True,
    )
    below: set[int] = set()
    try:
        assert owner.stdout is not None
        assert owner.stdout.readline().strip() == "stuck"
        below = _descendants(owner.pid)
        workers = {int(name) for name in os.listdir(marker)}
        assert workers <= below  # the two stuck workers, the forkserver, its helpers
        assert len(below) >= 3
        owner.kill()
        owner.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in below) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [pid for pid in below if _alive(pid)] == []
    finally:
        owner.kill()
        owner.wait(timeout=10)
        for pid in below:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_pool_recovers_when_an_idle_worker_is_killed() -> None:
    """A worker killed between items (pebble then gives up on its pool) costs no later item."""
    with GuardedPool(timeout_s=TIMEOUT_S, memory_mb=None) as guarded:
        idle = guarded.run(worker_pid)
        os.kill(idle, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _alive(idle) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # pebble's pool manager looks at its workers every 0.1 s
        assert guarded.run(add, 1, 2) == 3
        assert guarded.run(worker_pid) != idle


WORKERS = 3
HOLD_S = 0.25


def _parallel_round(
    guarded: GuardedPool, threads: ThreadPoolExecutor
) -> list[tuple[int, float, float]]:
    """Run WORKERS holding items from WORKERS threads at once; return (pid, start, end) each."""
    return list(threads.map(lambda _: guarded.run(hold, HOLD_S), range(WORKERS)))


def _full_round(guarded: GuardedPool, threads: ThreadPoolExecutor) -> set[int]:
    """Return the worker pids of a parallel round once all WORKERS workers are up and take one."""
    deadline = time.monotonic() + 20
    while True:
        pids = {pid for pid, _start, _end in _parallel_round(guarded, threads)}
        if len(pids) == WORKERS or time.monotonic() > deadline:
            return pids


def test_items_from_threads_run_at_once_on_distinct_workers() -> None:
    """run from WORKERS threads runs WORKERS items at the same time, each on its own worker."""
    with (
        GuardedPool(timeout_s=30, memory_mb=MEMORY_MB, workers=WORKERS) as guarded,
        ThreadPoolExecutor(max_workers=WORKERS) as threads,
    ):
        _full_round(guarded, threads)  # every worker up and warm
        items = _parallel_round(guarded, threads)
    assert len({pid for pid, _start, _end in items}) == WORKERS
    assert os.getpid() not in {pid for pid, _start, _end in items}
    # One instant at which every item was running.
    assert max(start for _pid, start, _end in items) < min(end for _pid, _start, end in items)


POISONS: list[tuple[str, Callable[..., Any], tuple[Any, ...], str, int]] = [
    # id, fn, args, error class, workers it kills
    ("timeout", sleep_for, (30,), "timeout", 1),
    ("memory-error", allocate_mb, (8 * MEMORY_MB,), "memory", 0),
    ("memory-death", segfault_near_limit, (MEMORY_MB,), "memory", 1),
    ("sigkill", kill_self, (), "crash", 1),
    ("segfault", segfault, (), "crash", 1),
]


@pytest.mark.parametrize(
    ("fn", "args", "error_class", "killed"),
    [poison[1:] for poison in POISONS],
    ids=[poison[0] for poison in POISONS],
)
def test_poison_item_under_parallel_load_costs_only_its_own_worker(
    fn: Callable[..., Any], args: tuple[Any, ...], error_class: str, killed: int
) -> None:
    """A poison item among parallel items fails alone; the others succeed; the pool refills."""
    # Only the timeout case needs a short timeout; on a loaded machine the others could reach
    # it before their own limit (a memory error taken for a timeout).
    timeout_s = TIMEOUT_S if error_class == "timeout" else 10 * TIMEOUT_S
    with (
        GuardedPool(timeout_s=timeout_s, memory_mb=MEMORY_MB, workers=WORKERS) as guarded,
        ThreadPoolExecutor(max_workers=WORKERS) as threads,
    ):
        before = _full_round(guarded, threads)
        assert len(before) == WORKERS
        poison_done = threading.Event()
        at_work = threading.Barrier(WORKERS)

        def neighbour() -> int:
            # Items on the other workers while the poison item runs, and a few after it.
            guarded.run(hold, 0.1)
            at_work.wait(timeout=60)
            items = 1
            while not poison_done.is_set():
                guarded.run(hold, 0.1)
                items += 1
            for _ in range(3):
                guarded.run(hold, 0.1)
            return items + 3

        neighbours = [threads.submit(neighbour) for _ in range(WORKERS - 1)]
        # Every neighbour has finished an item before the poison starts: a poison that ends
        # at once (a SIGKILL) still finds them at work, however loaded the machine is.
        at_work.wait(timeout=60)
        try:
            with pytest.raises(GuardError) as caught:
                guarded.run(fn, *args)
        finally:
            poison_done.set()
        assert caught.value.error_class == error_class
        for done in neighbours:
            assert done.result() > 3  # re-raises if any neighbour item failed

        after = _full_round(guarded, threads)
    assert len(after) == WORKERS
    assert len(before - after) == killed


def test_workers_do_not_rerun_the_callers_main_script(tmp_path: Path) -> None:
    """An Airflow task's __main__ is the `airflow` script; a worker must not import it again."""
    script = tmp_path / "caller.py"
    script.write_text(
        "import os\n"
        "if __name__ != '__main__':\n"
        "    raise SystemExit('the main script ran again in a worker')\n"
        "from replayable.guards import GuardedPool\n"
        "with GuardedPool(timeout_s=20, memory_mb=None) as pool:\n"
        "    print('worker pid differs:', pool.run(os.getpid) != os.getpid())\n"
    )
    include = Path(__file__).resolve().parents[3] / "include"
    done = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "PYTHONPATH": str(include)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "worker pid differs: True" in done.stdout


CELERY_LIKE_WORKER = """
import os, sys
import billiard
from replayable.guards import GuardedPool

def task(_):
    # What Airflow does on a Celery worker: fork the task process from a pool process.
    pid = os.fork()
    if pid == 0:
        try:
            with GuardedPool(timeout_s=30, memory_mb=None, workers=1) as pool:
                print("result", pool.run(abs, -5), flush=True)
            os._exit(0)
        except BaseException as error:
            print("error", repr(error), flush=True)
            os._exit(2)
    return os.waitpid(pid, 0)[1]

if __name__ == "__main__":
    with billiard.Pool(1) as pool:
        sys.exit(pool.map(task, [0])[0] >> 8)
"""


def test_a_task_forked_from_a_celery_pool_process_can_start_guarded_workers() -> None:
    """Celery's pool processes are daemonic and carry billiard's authkey; the task is neither.

    In a new interpreter, as a Celery worker is: this one may already run a forkserver.
    """
    pytest.importorskip("billiard")
    include = str(Path(__file__).resolve().parents[3] / "include")
    done = subprocess.run(
        [sys.executable, "-c", CELERY_LIKE_WORKER],
        env={**os.environ, "PYTHONPATH": include},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "result 5" in done.stdout
