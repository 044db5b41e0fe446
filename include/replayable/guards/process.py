"""The caller side of a guarded pool: what its own process must know and do for its workers.

The cgroup OOM-kill counter that tells a worker killed for memory from one killed otherwise,
the caller's ``__main__`` script hidden from the workers while a pool is alive, and the
multiprocessing state a Celery pool process leaves behind undone. See
:mod:`replayable.guards` for why each is needed.
"""

from __future__ import annotations

import multiprocessing
import sys
import threading
import types
from pathlib import Path
from typing import Any


def oom_events_file() -> Path | None:
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
        if read_oom_kills(candidate) is not None:
            return candidate
    return None


def read_oom_kills(events: Path | None) -> int | None:
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


def hide_script_main() -> None:
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


def restore_script_main() -> None:
    """Undo one ``hide_script_main``."""
    global _main_users, _script_main
    with _main_lock:
        _main_users -= 1
        if _main_users == 0 and _script_main is not None:
            sys.modules["__main__"] = _script_main
            _script_main = None


def undo_inherited_process_state() -> None:
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
