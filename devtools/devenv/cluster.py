"""``make cluster``: Redis, Airflow on CeleryExecutor and two Celery workers, on loopback.

The cluster runs ``airflow.env`` as docker-compose.yaml does, against the services of
:func:`devtools.devenv.services.start`. ``make cluster`` leaves it running and records its
process groups in ``<state>/cluster.json`` for :func:`stop_cluster`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from devtools.devenv.airflow import AirflowProcesses, airflow_env
from devtools.devenv.services import Services, same_process, stop_tree
from replayable.sources import ROOTS_ENV

# `make cluster`: every component once and two Celery workers, labelled `name#n`.
CLUSTER = (
    "api-server",
    "scheduler",
    "dag-processor",
    "triggerer",
    "celery worker#1",
    "celery worker#2",
)


def cluster_env(
    services: Services, state: Path, *, api_port: int, broker_url: str
) -> dict[str, str]:
    """The environment of ``make cluster``: ``airflow.env`` as Compose runs it, on loopback.

    CeleryExecutor with ``broker_url`` (the cluster's Redis) as its broker and Airflow's
    metadata database as the result backend, as in docker-compose.yaml.
    """
    env = airflow_env(services, state, api_port=api_port, executor=None)
    env["AIRFLOW__CELERY__BROKER_URL"] = broker_url
    backend = services.airflow_db_url.replace("postgresql+psycopg2://", "postgresql://", 1)
    env["AIRFLOW__CELERY__RESULT_BACKEND"] = "db+" + backend
    # PDFs put in <state>/corpus (`make cluster-run`) may be a run's source, as /data may be
    # in Compose.
    listed = os.environ.get(ROOTS_ENV, "")
    env[ROOTS_ENV] = os.pathsep.join(p for p in (str(state / "corpus"), listed) if p)
    return env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """Debian's ``redis-server`` on 127.0.0.1, in its own process group, keeping nothing on disk.

    ``tools/install-redis.sh`` installs it when missing (``make cluster``, ``.ci/run``).
    """

    def __init__(self, directory: Path, port: int | None = None) -> None:
        self.directory = directory
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 30) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server is not installed: run tools/install-redis.sh")
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / "redis.log", "ab") as log:
            self.proc = subprocess.Popen(
                [
                    binary,
                    "--bind",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(self.directory),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while not self.ping():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not start; see {self.directory}/redis.log")
            time.sleep(0.1)
        return self

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            stop_tree(self.proc.pid, timeout_s=10)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
            self.proc = None


class Cluster:
    """Redis, Airflow's components on CeleryExecutor and its Celery workers, on loopback.

    Every process runs in its own process group (see :class:`AirflowProcesses`), against the
    services of :func:`devtools.devenv.services.start` (the embedded Postgres, the model
    server). As a context manager it stops everything it started on the way out;
    :meth:`detach` leaves it running for ``make cluster`` and records the process groups in
    ``cluster.json`` for :func:`stop_cluster`.

    :param services: the database and the model server.
    :param state: the state folder; logs go to ``<state>/cluster``.
    :param components: labels of :data:`CLUSTER` form (``celery worker#N`` for worker N).
    :param extra_env: added to every component's environment (e.g. more source roots).
    """

    def __init__(
        self,
        services: Services,
        state: Path,
        *,
        components: tuple[str, ...] = CLUSTER,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.state = state
        self.log_dir = state / "cluster"
        self.redis = RedisServer(self.log_dir / "redis")
        self.api_port = free_port()
        self.env = cluster_env(
            services, state, api_port=self.api_port, broker_url=self.redis.url
        ) | (extra_env or {})
        self.airflow = AirflowProcesses(self.env, self.log_dir, components)

    @property
    def url(self) -> str:
        return self.airflow.url

    @property
    def workers(self) -> list[str]:
        return [name for name in self.airflow.components if name.startswith("celery worker")]

    def __enter__(self) -> Cluster:
        self.redis.start()
        try:
            self.airflow.__enter__()
        except BaseException:
            self.redis.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.airflow.stop()
        self.redis.stop()

    def detach(self) -> dict[str, Any]:
        """Leave every process running; record them in ``cluster.json`` and return that."""
        import psutil

        assert self.redis.proc is not None
        pids = {"redis": self.redis.proc.pid, **self.airflow.pids()}
        record = {
            "url": self.url,
            "airflow_home": self.env["AIRFLOW_HOME"],
            "broker_url": self.redis.url,
            "log_dir": str(self.log_dir),
            # With its start time, so that a pid reused since is never taken for ours.
            "pids": {name: [pid, psutil.Process(pid).create_time()] for name, pid in pids.items()},
        }
        (self.state / "cluster.json").write_text(json.dumps(record, indent=2))
        return record


def stop_cluster(state: Path) -> None:
    """Stop what ``make cluster`` left running under ``state``; safe to call twice.

    A recorded pid is only stopped while it is still the process that was started (same
    start time): after a reboot the number may belong to something else.
    """
    path = state / "cluster.json"
    if not path.exists():
        return
    record = json.loads(path.read_text())
    for pid, started in record["pids"].values():
        if same_process(pid, started):
            stop_tree(pid, timeout_s=15)
    path.unlink()


def tasks_by_worker(task_instances: list[dict[str, Any]]) -> dict[str, int]:
    """How many of the run's batch task instances each worker ran (by recorded hostname)."""
    counts: dict[str, int] = {}
    for ti in task_instances:
        if ti["task_id"].startswith("batch.") and ti.get("hostname"):
            name = str(ti["hostname"]).split("@")[0]
            counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))
