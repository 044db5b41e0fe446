"""Local services for the demo, the tests and `make`: embedded Postgres, model server, Airflow env.

``python -m devtools.devenv start|stop|status|env|migrate|run|airflow|cluster|cluster-run|
cluster-stop``. State lives in a folder (``.local/`` by default): the pgserver data
directory, the model server's pid and port, Airflow's home, ``services.json`` describing
what runs where and, while ``make cluster`` runs, ``cluster.json``. Every process started
here is stopped by ``stop`` (and ``cluster-stop``): Postgres with its own ``pg_ctl stop``,
everything else by killing its process group.

Airflow's settings that do not depend on where it runs live in ``airflow.env`` at the
project root, read here and by docker-compose.yaml (``env_file``), so the local cluster and
the Compose deployment run one configuration (ADR 0021).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

import httpx

from replayable.settings import check_conf_keys
from replayable.sources import ROOTS_ENV, allowed_roots, check_source

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_STATE = ROOT / ".local"
DAG_ID = "document_pipeline"
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
# `make cluster`: every component once and two Celery workers, labelled `name#n`.
CLUSTER = (
    "api-server",
    "scheduler",
    "dag-processor",
    "triggerer",
    "celery worker#1",
    "celery worker#2",
)
WORKER_NAME_ENV = "REPLAYABLE_WORKER_NAME"
# Creates or upgrades the metadata database before the components start (airflow-init).
MIGRATE = ("db", "migrate")


@dataclass(frozen=True)
class Services:
    """Where the running services are."""

    replayable_dsn: str  # libpq URI of the replayable database
    airflow_db_url: str  # SQLAlchemy URL of Airflow's metadata database
    model_url: str  # OpenAI-compatible API root, ending in /v1
    model_pid: int | None
    pgdata: str | None  # set when the embedded server is ours to stop
    # The model server's start time (psutil's create_time): with it, a pid reused since is
    # never taken for the server (ADR 0079). Records without it are never signalled.
    model_started: float | None = None

    @classmethod
    def load(cls, state: Path) -> Services:
        path = state / "services.json"
        if not path.exists():
            raise SystemExit(f"no services are running under {state}: run `make start` first")
        return cls(**json.loads(path.read_text()))


def _import_pgserver() -> Any:
    # pgserver asks platformdirs for a runtime dir at import; without XDG_RUNTIME_DIR that
    # only warns and falls back to /tmp, which is what we want anyway.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver
    return pgserver


def _embedded_postgres(state: Path) -> tuple[str, str]:
    get_server = _import_pgserver().get_server

    server = get_server(state / "pg", cleanup_mode=None)
    # `stop` owns the server's lifetime; pgserver's exit hook would only log into closed streams.
    atexit.unregister(server._cleanup)
    uri = server.get_uri()
    existing = server.psql("SELECT datname FROM pg_database;")
    for name in ("airflow", "replayable"):
        if f" {name}\n" not in existing:
            server.psql(f"CREATE DATABASE {name};")
    host = parse_qs(urlparse(uri).query)["host"][0]
    return (
        f"postgresql://postgres@/replayable?host={host}",
        f"postgresql+psycopg2://postgres@/airflow?host={host}",
    )


def _start_model_server(state: Path) -> tuple[str, int, float]:
    """Start the local model server detached: it outlives this process until ``stop``.

    Returns its URL, pid and start time.
    """
    import psutil

    from devtools.model_server import LocalModelServer

    server = LocalModelServer(
        port_file=state / "model.port",
        log_path=state / "model-server.log",
        tie_to_parent=False,
    ).start()
    return server.base_url, server.pid, psutil.Process(server.pid).create_time()


def _same_process(pid: int, started: float | None) -> bool:
    """Whether ``pid`` is still the process that was recorded as started at ``started``."""
    import psutil

    if started is None:
        return False
    try:
        created: float = psutil.Process(pid).create_time()
    except psutil.Error:
        return False
    return abs(created - started) < 1


def model_server_running(services: Services) -> bool:
    """Whether the model server ``services`` recorded is still that process."""
    return services.model_pid is not None and _same_process(
        services.model_pid, services.model_started
    )


def start(state: Path = DEFAULT_STATE, *, model_url: str | None = None) -> Services:
    """Start (or reuse) the database and the model server; write ``services.json``.

    With ``model_url`` no model server is started: that endpoint is used instead.
    """
    state.mkdir(parents=True, exist_ok=True)
    path = state / "services.json"
    if path.exists():
        services = Services.load(state)
        if services.model_pid is None or model_server_running(services):
            return services
        stop(state)
    external = os.environ.get("REPLAYABLE_DATABASE_URL")
    if external:
        replayable_dsn = external
        airflow_db = os.environ.get(
            "REPLAYABLE_AIRFLOW_DATABASE_URL",
            "postgresql+psycopg2://" + external.split("://", 1)[1],
        )
        pgdata = None
    else:
        replayable_dsn, airflow_db = _embedded_postgres(state)
        pgdata = str(state / "pg")
    model_pid = model_started = None
    if model_url is None:
        model_url, model_pid, model_started = _start_model_server(state)
    services = Services(replayable_dsn, airflow_db, model_url, model_pid, pgdata, model_started)
    path.write_text(json.dumps(asdict(services), indent=2))
    _ensure_schema(services)
    return services


def stop(state: Path = DEFAULT_STATE) -> None:
    """Stop whatever ``start`` started under ``state``; safe to call twice.

    The model server is only stopped while its pid is still the process that was started
    (same start time), as ``stop_cluster`` does: after a crash or a reboot the number may
    belong to something else, and its whole process group would be killed.
    """
    path = state / "services.json"
    if not path.exists():
        return
    services = Services(**json.loads(path.read_text()))
    if model_server_running(services):
        assert services.model_pid is not None
        _kill_group(services.model_pid)
    elif services.model_pid:
        print(
            f"model server pid {services.model_pid} is no longer the server that was started;"
            " not signalled",
            file=sys.stderr,
        )
    if services.pgdata:
        _stop_postgres(Path(services.pgdata))
    path.unlink()


def _stop_postgres(pgdata: Path) -> None:
    # pgserver builds its command wrappers at import time.
    pg_ctl = _import_pgserver().pg_ctl

    if not (pgdata / "postmaster.pid").exists():
        return
    user = "pgserver" if os.geteuid() == 0 else None
    with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user)


def _kill_group(pid: int) -> None:
    stop_tree(pid)


def stop_tree(pid: int, timeout_s: float = 10.0) -> None:
    """Stop ``pid``, its process group and every process it started, however they detached.

    The descendants are listed before any signal is sent: once a parent dies, its children
    are re-parented to init and can no longer be found from it. SIGTERM first, then SIGKILL
    for whatever is still there after ``timeout_s``.
    """
    import psutil

    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    for proc in family:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(family, timeout=timeout_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=5)


def _ensure_schema(services: Services) -> None:
    from replayable import db

    conn = db.connect(services.replayable_dsn)
    try:
        db.migrate(conn)
    finally:
        conn.close()


def postgres_conn_json(dsn: str) -> str:
    url = urlparse(dsn)
    query = parse_qs(url.query)
    host = query.get("host", [url.hostname or ""])[0]
    return json.dumps(
        {
            "conn_type": "postgres",
            "host": host,
            "port": url.port,
            "login": unquote(url.username or "postgres"),
            "password": unquote(url.password or ""),
            "schema": url.path.lstrip("/") or "postgres",
        }
    )


def empty_ledger(conn: Any) -> None:
    """Empty every table of the replayable schema but its migration record, and commit.

    For the tests, the benchmarks and the chaos runs, between one case and the next. The
    tables are read from the catalog, so a table a migration adds is emptied too.
    """
    from psycopg2 import sql

    with conn.cursor() as cur:
        cur.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'replayable'"
            " AND tablename <> 'schema_migrations' ORDER BY tablename"
        )
        names = [row[0] for row in cur.fetchall()]
        if names:
            tables = sql.SQL(", ").join(sql.Identifier("replayable", n) for n in names)
            cur.execute(sql.SQL("TRUNCATE {} CASCADE").format(tables))
    conn.commit()


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
    shared one, CeleryExecutor (see :func:`cluster_env`).
    """
    model = os.environ.get("REPLAYABLE_MODEL_CONN") or json.dumps(
        {
            "conn_type": "http",
            "host": services.model_url,
            "extra": {"model": "text-embedding-3-small"},
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
        "AIRFLOW_CONN_REPLAYABLE_DB": postgres_conn_json(services.replayable_dsn),
        "AIRFLOW_CONN_REPLAYABLE_MODEL": model,
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


def _airflow(
    args: list[str], env: dict[str, str], **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    airflow = str(Path(sys.executable).with_name("airflow"))
    return subprocess.run(
        [airflow, *args], env={**os.environ, **env}, text=True, check=False, **kwargs
    )


def migrate_airflow(env: dict[str, str]) -> None:
    """Create or upgrade Airflow's metadata database (skipped when already done here)."""
    marker = Path(env["AIRFLOW_HOME"]) / ".migrated"
    if marker.exists() and marker.read_text() == env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]:
        return
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    done = _airflow(list(MIGRATE), env, capture_output=True)
    if done.returncode != 0:
        raise SystemExit(f"airflow db migrate failed:\n{done.stdout}\n{done.stderr}")
    marker.write_text(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])


def latest_report(dsn: str, since: datetime) -> dict[str, Any] | None:
    """The newest run report written at or after ``since``."""
    from replayable import db

    conn = db.connect(dsn)
    try:
        rows = db.fetch_all(conn, "report/latest_report", {"since": since})
    finally:
        conn.close()
    return rows[0]["report"] if rows else None


@contextlib.contextmanager
def running(state: Path) -> Iterator[Services]:
    """Start the services for the duration of a command; stop them if they were started here.

    SIGTERM and SIGHUP end the command like Ctrl-C does, so the services are stopped on
    every way out.
    """
    started_here = not (state / "services.json").exists()

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield start(state)
    finally:
        # A second Ctrl-C must not cut the clean-up short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if started_here:
            stop(state)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def check_conf(conf: str, roots: Sequence[str] | None = None) -> dict[str, Any]:
    """``conf`` parsed, or SystemExit with a sentence on what Airflow would let through.

    Airflow takes any key into a run's conf, and refuses a source outside the roots by
    quoting its pattern; both are said here, before a service starts (ADR 0077). ``source``
    is checked against ``roots`` if given; the values are left to the DAG's params.
    """
    try:
        parsed = json.loads(conf)
    except json.JSONDecodeError as exc:  # reported here, before Airflow starts
        raise SystemExit(f"CONF is not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise SystemExit(f"CONF must be a JSON object, not {type(parsed).__name__}")
    try:
        check_conf_keys(parsed)
        if roots is not None and isinstance(parsed.get("source"), str):
            check_source(parsed["source"], roots)
    except ValueError as error:
        raise SystemExit(f"CONF refused: {error}") from None
    return parsed


def run(state: Path, conf: str, *, quiet: bool = True) -> int:
    """Run document_pipeline once through ``airflow dags test``; print and save its report."""
    # `airflow dags test` runs here, with this environment's roots.
    check_conf(conf, allowed_roots())
    with running(state) as services:
        return _run(state, services, conf, quiet=quiet)


def _run(state: Path, services: Services, conf: str, *, quiet: bool) -> int:
    from replayable.pipeline import format_report

    env = airflow_env(services, state)
    migrate_airflow(env)
    log_path = state / "last_run.log"
    started = datetime.now(UTC)
    with open(log_path, "w") as log:
        done = _airflow(
            ["dags", "test", DAG_ID, "--conf", conf],
            env,
            stdout=log if quiet else None,
            stderr=subprocess.STDOUT,
        )
    report = latest_report(services.replayable_dsn, started)
    if report is None:
        errors = [line for line in log_path.read_text().splitlines() if "Error" in line]
        print(errors[-1] if errors else "the run wrote no report", file=sys.stderr)
        print(f"airflow log: {log_path}", file=sys.stderr)
        return done.returncode or 1
    (state / "last_report.json").write_text(json.dumps(report, indent=2))
    print(format_report(report))
    print(f"report: {state / 'last_report.json'}   airflow log: {log_path}")
    return done.returncode


def serve_airflow(state: Path, *, api_port: int = 8080) -> int:
    """Run ``airflow standalone`` on 127.0.0.1 in its own process group until interrupted."""
    with running(state) as services:
        return _serve_airflow(state, services, api_port)


def start_standalone(env: dict[str, str], **popen: Any) -> subprocess.Popen[bytes]:
    """Start ``airflow standalone`` with ``env`` in its own process group (stop the group)."""
    airflow = str(Path(sys.executable).with_name("airflow"))
    return subprocess.Popen(
        [airflow, "standalone"], env={**os.environ, **env}, start_new_session=True, **popen
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
        airflow = str(Path(sys.executable).with_name("airflow"))
        args = [airflow, *COMMANDS.get(name, tuple(name.split()))]
        extra: dict[str, str] = {}
        if name == "celery worker":
            args += ["--celery-hostname", f"{worker_name(label)}@%h"]
            extra = {
                WORKER_NAME_ENV: worker_name(label),
                "AIRFLOW__CORE__HOSTNAME_CALLABLE": "devtools.devenv.worker_hostname",
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
        for proc in self.procs.values():
            stop_tree(proc.pid, timeout_s=15)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self.procs.clear()


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
    services of :func:`start` (the embedded Postgres, the model server). As a context
    manager it stops everything it started on the way out; :meth:`detach` leaves it running
    for ``make cluster`` and records the process groups in ``cluster.json`` for
    :func:`stop_cluster`.

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
        if _same_process(pid, started):
            stop_tree(pid, timeout_s=15)
    path.unlink()


def api_token(url: str, airflow_home: Path, username: str = "admin") -> str:
    """A JWT for ``username`` from the API server at ``url``, with its generated password."""
    passwords = airflow_home / "simple_auth_manager_passwords.json.generated"
    password = json.loads(passwords.read_text())[username]
    response = httpx.post(f"{url}/auth/token", json={"username": username, "password": password})
    response.raise_for_status()
    return str(response.json()["access_token"])


class AirflowApi:
    """The few calls of Airflow's REST API that the cluster commands and tests make."""

    def __init__(self, url: str, token: str, dag_id: str = DAG_ID) -> None:
        self.dag_id = dag_id
        self.http = httpx.Client(
            base_url=f"{url}/api/v2", headers={"Authorization": f"Bearer {token}"}, timeout=30
        )

    def close(self) -> None:
        self.http.close()

    def wait_for_dag(self, timeout_s: float = 180) -> None:
        """Wait until the DAG processor has parsed the DAG."""
        deadline = time.monotonic() + timeout_s
        while self.http.get(f"/dags/{self.dag_id}").status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.dag_id} was not parsed within {timeout_s:.0f} s")
            time.sleep(1)

    def trigger(self, conf: dict[str, Any]) -> str:
        """Trigger a run with ``conf``; return its run id."""
        response = self.http.post(
            f"/dags/{self.dag_id}/dagRuns", json={"logical_date": None, "conf": conf}
        )
        response.raise_for_status()
        return str(response.json()["dag_run_id"])

    def state(self, run_id: str) -> str:
        return str(self.http.get(f"/dags/{self.dag_id}/dagRuns/{run_id}").json()["state"])

    def wait(self, run_id: str, timeout_s: float = 900) -> str:
        """Wait for the run to end; return ``success`` or ``failed``."""
        deadline = time.monotonic() + timeout_s
        while (state := self.state(run_id)) not in ("success", "failed"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"run {run_id} is still {state} after {timeout_s:.0f} s")
            time.sleep(1)
        return state

    def task_instances(self, run_id: str) -> list[dict[str, Any]]:
        found = self.http.get(
            f"/dags/{self.dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 1000}
        )
        found.raise_for_status()
        return list(found.json()["task_instances"])

    def tries(self, run_id: str, task_id: str, map_index: int) -> list[dict[str, Any]]:
        """Every try of one task instance, the current one included."""
        found = self.http.get(
            f"/dags/{self.dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/{map_index}/tries"
        )
        found.raise_for_status()
        return list(found.json()["task_instances"])


def tasks_by_worker(task_instances: list[dict[str, Any]]) -> dict[str, int]:
    """How many of the run's batch task instances each worker ran (by recorded hostname)."""
    counts: dict[str, int] = {}
    for ti in task_instances:
        if ti["task_id"].startswith("batch.") and ti.get("hostname"):
            name = str(ti["hostname"]).split("@")[0]
            counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def admin_password(env: dict[str, str]) -> str | None:
    """The password ``airflow standalone`` generated for its admin user, once it exists."""
    passwords = Path(env["AIRFLOW_HOME"]) / "simple_auth_manager_passwords.json.generated"
    return json.loads(passwords.read_text()).get("admin") if passwords.exists() else None


def _serve_airflow(state: Path, services: Services, api_port: int) -> int:
    env = airflow_env(services, state, api_port=api_port)
    migrate_airflow(env)
    proc = start_standalone(env)
    url = f"http://127.0.0.1:{api_port}"
    try:
        if not wait_until_up(url, proc):
            return proc.poll() or 1
        print(
            f"\nAirflow is up: {url}  (user: admin, password: {admin_password(env)};"
            f" stored in {env['AIRFLOW_HOME']})\nCtrl-C stops it.",
            flush=True,
        )
        return proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        _kill_group(proc.pid)


def start_cluster(state: Path) -> int:
    """``make cluster``: start everything and leave it running; ``make cluster-stop`` stops it."""
    if (state / "cluster.json").exists():
        record = json.loads((state / "cluster.json").read_text())
        print(f"the cluster is already running: {record['url']}")
        return 0
    services = start(state)
    try:
        cluster = Cluster(services, state)
        cluster.__enter__()
    except BaseException:
        stop(state)
        raise
    record = cluster.detach()
    print(
        f"Airflow on CeleryExecutor: {record['url']} (user admin, password in "
        f"{record['airflow_home']}/simple_auth_manager_passwords.json.generated)\n"
        f"broker {record['broker_url']}; workers {', '.join(cluster.workers)}; "
        f"logs in {record['log_dir']}\nPDFs under {state / 'corpus'} may be a run's source. "
        "`make cluster-run`, then `make cluster-stop`."
    )
    return 0


def cluster_run(state: Path, conf: str) -> int:
    """Trigger document_pipeline on the running cluster, wait, print its report and workers."""
    from replayable.pipeline import format_report

    # The cluster's roots are those it was started with; its params judge the source.
    parsed = check_conf(conf)
    path = state / "cluster.json"
    if not path.exists():
        raise SystemExit("no cluster is running: `make cluster` first")
    record = json.loads(path.read_text())
    api = AirflowApi(record["url"], api_token(record["url"], Path(record["airflow_home"])))
    try:
        api.wait_for_dag()
        started = datetime.now(UTC)
        run_id = api.trigger(parsed)
        print(f"triggered {run_id}; waiting for it to end")
        state_ = api.wait(run_id)
        workers = tasks_by_worker(api.task_instances(run_id))
    finally:
        api.close()
    report = latest_report(Services.load(state).replayable_dsn, started)
    if report is not None:
        print(format_report(report))
    print(f"run {run_id}: {state_}; batch tasks per worker: {workers}")
    return 0 if state_ == "success" else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.devenv", description=__doc__)
    parser.add_argument("--state", type=Path, default=DEFAULT_STATE)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("start", help="start the embedded Postgres and the local model server")
    sub.add_parser("stop", help="stop them")
    sub.add_parser("status", help="show what runs where")
    sub.add_parser("env", help="print the Airflow environment as shell exports")
    sub.add_parser("migrate", help="migrate Airflow's metadata database")
    run_cmd = sub.add_parser("run", help="run document_pipeline once and print its report")
    run_cmd.add_argument("--conf", default="{}")
    run_cmd.add_argument("--verbose", action="store_true", help="show Airflow's output")
    sub.add_parser("airflow", help="run Airflow standalone on 127.0.0.1:8080 until Ctrl-C")
    sub.add_parser("cluster", help="start Redis, Airflow on CeleryExecutor and two workers")
    run_on_cluster = sub.add_parser("cluster-run", help="run document_pipeline on the cluster")
    run_on_cluster.add_argument("--conf", default="{}")
    sub.add_parser("cluster-stop", help="stop the cluster and the services under it")
    args = parser.parse_args(argv)
    args.state = args.state.resolve()

    if args.command == "start":
        services = start(args.state)
        print(f"postgres: {services.replayable_dsn}\nmodel server: {services.model_url}")
    elif args.command == "stop":
        stop_cluster(args.state)  # it runs on these services
        stop(args.state)
    elif args.command == "status":
        print(json.dumps(asdict(Services.load(args.state)), indent=2))
    elif args.command == "env":
        for key, value in airflow_env(Services.load(args.state), args.state).items():
            print(f"export {key}={shlex.quote(value)}")
    elif args.command == "migrate":
        migrate_airflow(airflow_env(Services.load(args.state), args.state))
    elif args.command == "run":
        return run(args.state, args.conf, quiet=not args.verbose)
    elif args.command == "airflow":
        return serve_airflow(args.state)
    elif args.command == "cluster":
        return start_cluster(args.state)
    elif args.command == "cluster-run":
        return cluster_run(args.state, args.conf)
    elif args.command == "cluster-stop":
        stop_cluster(args.state)
        stop(args.state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
