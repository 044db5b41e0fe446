"""Airflow pointed at this project: its environment, its migration and its processes.

Airflow's settings that do not depend on where it runs live in ``airflow.env`` at the
project root, read here and by docker-compose.yaml (``env_file``), so the local cluster and
the Compose deployment run one configuration (ADR 0021). ``airflow_env`` adds what does
depend on it: the state folder, the database, the connections and the API port.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from devtools.devenv.api import api_token
from devtools.devenv.services import DEFAULT_STATE, ROOT, Services, postgres_conn_json, stop_tree
from replayable.vocabulary import LEDGER_CONN_ID, MODEL_CONN_ID, PIPELINE_DAG_ID

DAG_ID = PIPELINE_DAG_ID
SHARED_ENV_FILE = ROOT / "airflow.env"

# Each Airflow component as the `airflow` arguments it runs with. `make cluster` starts these
# and docker-compose.yaml's services run the same (tests/test_docker_compose.py checks it).
# Task logs are on a disk every component shares (AIRFLOW_HOME here, a volume in Compose),
# so neither the workers nor the triggerer serve logs: no log-server port per process.
COMMANDS: dict[str, tuple[str, ...]] = {
    "api-server": ("api-server",),
    "scheduler": ("scheduler",),
    "dag-processor": ("dag-processor",),
    "triggerer": ("triggerer", "--skip-serve-logs"),
    "celery worker": ("celery", "worker", "--skip-serve-logs"),
}
# Creates or upgrades the metadata database before the components start (airflow-init).
MIGRATE = ("db", "migrate")
WORKER_NAME_ENV = "REPLAYABLE_WORKER_NAME"
# ``[core] hostname_callable`` of the local Celery workers: :func:`worker_hostname`.
WORKER_HOSTNAME_CALLABLE = "devtools.devenv.airflow.worker_hostname"


def read_env_file(path: Path) -> dict[str, str]:
    """The ``KEY=VALUE`` lines of an env file (``#`` comments and blank lines skipped).

    Values are taken as written. Quotes and ``$`` are refused: Compose would strip or
    interpolate them, and the file must read the same to both.
    """
    found: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.isidentifier() or any(c in value for c in "'\"$"):
            raise ValueError(f"{path.name}:{number}: not a plain KEY=VALUE line: {raw!r}")
        found[key] = value
    return found


def shared_airflow_env() -> dict[str, str]:
    """Airflow's settings shared with docker-compose.yaml (``airflow.env``)."""
    return read_env_file(SHARED_ENV_FILE)


def airflow_env(
    services: Services,
    state: Path = DEFAULT_STATE,
    *,
    api_port: int = 8080,
    executor: str | None = "LocalExecutor",
) -> dict[str, str]:
    """Environment that points Airflow at this project, its database and its connections.

    The settings of ``airflow.env`` apply, except the executor: ``executor`` replaces it
    (LocalExecutor for ``make run``, ``make airflow`` and the tests); None keeps the
    shared one, CeleryExecutor (see :func:`devtools.devenv.cluster.cluster_env`).
    """
    model = os.environ.get("REPLAYABLE_MODEL_CONN") or json.dumps(
        {
            "conn_type": "http",
            "host": services.model_url,
            # OpenAI's list prices (USD per million tokens), so that a run's report shows
            # what it would have cost there (ADR 0110).
            "extra": {
                "model": "text-embedding-3-small",
                # The local server is polled as often as a test asks (ADR 0149).
                "min_batch_poll_s": 0.1,
                "prices": {
                    "text-embedding-3-small": {"input": 0.02},
                    "local-wordllama-256": {"input": 0},  # runs here, for nothing
                    "gpt-4o-mini": {"input": 0.15, "output": 0.6},
                },
            },
        }
    )
    # Events go to the local server's webhook receiver, standing in for a downstream system.
    receiver = f"{services.model_url.removesuffix('/v1')}/webhooks/replayable"
    events = os.environ.get("REPLAYABLE_EVENTS_CONN") or json.dumps(
        {"conn_type": "http", "host": receiver}
    )
    env = {
        **shared_airflow_env(),
        "AIRFLOW_HOME": str(state / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": services.airflow_db_url,
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(api_port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{api_port}/execution/",
        f"AIRFLOW_CONN_{LEDGER_CONN_ID.upper()}": postgres_conn_json(services.replayable_dsn),
        f"AIRFLOW_CONN_{MODEL_CONN_ID.upper()}": model,
        "AIRFLOW_CONN_REPLAYABLE_EVENTS": events,
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT / "include"), os.environ.get("PYTHONPATH", "")) if p
        ),
        "NO_PROXY": "127.0.0.1,localhost",
        # `airflow standalone` starts its components as `airflow …` found on PATH.
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    if executor is not None:
        env["AIRFLOW__CORE__EXECUTOR"] = executor
    return env


def worker_name(label: str) -> str:
    """``celery worker#2`` -> ``worker-2``: the name a worker's task instances carry."""
    base, _, number = label.partition("#")
    return base.split()[-1] + (f"-{number}" if number else "")


def worker_hostname() -> str:
    """``[core] hostname_callable`` of the local workers: ``worker-N@host``.

    Several workers on one machine would all record the machine's name on their task
    instances; with this each records its own, as Celery names its nodes.
    """
    name = os.environ.get(WORKER_NAME_ENV)
    host = socket.gethostname()
    return f"{name}@{host}" if name else host


def _airflow_binary() -> str:
    # The `airflow` of this interpreter's environment, whatever PATH says.
    return str(Path(sys.executable).with_name("airflow"))


def run_airflow(
    args: list[str], env: dict[str, str], **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """Run ``airflow <args>`` with ``env`` over this process's environment; never raises."""
    return subprocess.run(
        [_airflow_binary(), *args], env={**os.environ, **env}, text=True, check=False, **kwargs
    )


def migrate_airflow(env: dict[str, str]) -> None:
    """Create or upgrade Airflow's metadata database (skipped when already done here)."""
    marker = Path(env["AIRFLOW_HOME"]) / ".migrated"
    if marker.exists() and marker.read_text() == env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]:
        return
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    done = run_airflow(list(MIGRATE), env, capture_output=True)
    if done.returncode != 0:
        raise SystemExit(f"airflow db migrate failed:\n{done.stdout}\n{done.stderr}")
    marker.write_text(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])


def start_standalone(env: dict[str, str], **popen: Any) -> subprocess.Popen[bytes]:
    """Start ``airflow standalone`` with ``env`` in its own process group (stop the group)."""
    return subprocess.Popen(
        [_airflow_binary(), "standalone"],
        env={**os.environ, **env},
        start_new_session=True,
        **popen,
    )


def wait_until_up(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 300) -> bool:
    """Wait for the API server at ``url`` to answer; False if Airflow exited or timed out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{url}/api/v2/monitor/health", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    return False


class AirflowProcesses:
    """Airflow's components as separate local processes, each in its own process group.

    Unlike ``airflow standalone``, any component can be killed or restarted on its own (as a
    deploy does), and the executor is the environment's (LocalExecutor by default). Use as a
    context manager; every process it started is stopped on the way out, with its children.

    :param env: the Airflow environment (see :func:`airflow_env`).
    :param log_dir: where each component writes ``<name>.log``.
    :param components: ``airflow`` subcommands to run, e.g. ``("scheduler", "dag-processor",
        "api-server")``; a component given as ``"celery worker"`` runs ``airflow celery worker``.
    """

    DEFAULT = ("api-server", "scheduler", "dag-processor")

    def __init__(
        self,
        env: dict[str, str],
        log_dir: Path,
        components: tuple[str, ...] = DEFAULT,
    ) -> None:
        self.env = env
        self.log_dir = log_dir
        self.components = components
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.url = env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"].removesuffix("/execution/")

    def __enter__(self) -> AirflowProcesses:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        migrate_airflow(self.env)
        try:
            for name in self.components:
                self.start(name.split("#")[0], label=name)
            if "api-server" in self.components and not self.wait_until_up():
                raise RuntimeError(f"the API server did not come up; see {self.log_dir}")
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def command(self, name: str, label: str) -> tuple[list[str], dict[str, str]]:
        """The command line and extra environment of component ``name`` started as ``label``.

        A Celery worker gets a node name and a task-instance hostname of its own
        (``worker-N``), since every worker here runs on one machine.
        """
        args = [_airflow_binary(), *COMMANDS.get(name, tuple(name.split()))]
        extra: dict[str, str] = {}
        if name == "celery worker":
            args += ["--celery-hostname", f"{worker_name(label)}@%h"]
            extra = {
                WORKER_NAME_ENV: worker_name(label),
                "AIRFLOW__CORE__HOSTNAME_CALLABLE": WORKER_HOSTNAME_CALLABLE,
                # The hostname callable lives in devtools/, at the repository root, which
                # the product's PYTHONPATH (include/) does not name.
                "PYTHONPATH": os.pathsep.join(
                    p for p in (self.env.get("PYTHONPATH", ""), str(ROOT)) if p
                ),
            }
        return args, extra

    def start(self, name: str, *, label: str | None = None) -> subprocess.Popen[bytes]:
        """Start ``airflow <name>`` (``label`` names it when one component runs twice)."""
        key = label or name
        args, extra = self.command(name, key)
        with open(self.log_dir / f"{key.replace(' ', '-')}.log", "ab") as log:
            proc = subprocess.Popen(
                args,
                env={**os.environ, **self.env, **extra},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs[key] = proc
        return proc

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to one component's whole process group (SIGKILL: a crash)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.procs[name].pid, sig)

    def restart(self, name: str) -> None:
        """Stop one component (SIGTERM, then SIGKILL) and start it again, as a deploy does."""
        stop_tree(self.procs[name].pid, timeout_s=30)
        self.procs[name].wait(timeout=10)
        self.start(name.split("#")[0], label=name)

    def wait_until_up(self, timeout_s: float = 180) -> bool:
        return wait_until_up(self.url, self.procs["api-server"], timeout_s)

    def token(self, username: str = "admin") -> str:
        """A JWT for ``username``, whose password the API server generated."""
        return api_token(self.url, Path(self.env["AIRFLOW_HOME"]), username)

    def pids(self) -> dict[str, int]:
        """Each running component's pid (its process group), by label."""
        return {name: proc.pid for name, proc in self.procs.items()}

    def stop(self) -> None:
        """Stop every component at once: each gets its SIGTERM and grace period together."""

        def stop_one(proc: subprocess.Popen[bytes]) -> None:
            stop_tree(proc.pid, timeout_s=15)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)

        if self.procs:
            with ThreadPoolExecutor(len(self.procs)) as threads:
                list(threads.map(stop_one, self.procs.values()))
        self.procs.clear()
