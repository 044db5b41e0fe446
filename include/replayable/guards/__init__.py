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

``run_each`` hands a worker several items in one call (ADR 0126), one after another, and
returns an ``ItemOutcome`` per item: what ``run`` would have returned or raised for it.
Each item keeps its own limits: the CPU limit below, the address-space samples, and a
wall-clock alarm of its own (SIGALRM, whose default action ends the worker even inside
native code: ``timeout``). The worker records which item of which call it is on in shared
memory, so a death is charged to the item that died and the call's other items run again
on a fresh worker. No item starts past the call's ``not_after``, nor once the worker's
address space has grown by a quarter of its limit during the call (the rest go in another
call), so that the results a call holds still fit when pickled. An item's RLIMIT_AS is the
limit over what the worker holds for others when it starts (earlier items' results, the last
call's result that pebble keeps; at most half a limit more), so that no item is charged
``memory`` for a batch-mate's result.

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
80-115 ms every time); an item on a warm worker costs about 1 ms of overhead with two
busy workers on two cores, a quarter of that when ``run_each`` sends four at once. Importing
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

Modules: ``errors`` (GuardError, RemoteError, check_size), ``worker`` (each worker's setup and
how it runs an item, or several), ``process`` (what the caller's process does for its
workers), ``pool`` (GuardedPool, ItemOutcome) and ``cores`` (machine_cores: one pool as wide
as the machine at a time, ADR 0123).
"""

from __future__ import annotations

from replayable.guards.cores import machine_cores
from replayable.guards.errors import ERROR_CLASSES, GuardError, RemoteError, check_size
from replayable.guards.pool import GuardedPool, ItemOutcome

__all__ = [
    "ERROR_CLASSES",
    "GuardError",
    "GuardedPool",
    "ItemOutcome",
    "RemoteError",
    "check_size",
    "machine_cores",
]
