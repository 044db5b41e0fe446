"""Local services for the demo, the tests and `make`: embedded Postgres, model server, Airflow env.

``python -m devtools.devenv start|stop|status|env|migrate|run|airflow|cluster|cluster-run|
cluster-stop``. State lives in a folder (``.local/`` by default): the pgserver data
directory, the model server's pid and port, Airflow's home, ``services.json`` describing
what runs where and, while ``make cluster`` runs, ``cluster.json``. Every process started
here is stopped by ``stop`` (and ``cluster-stop``): Postgres with its own ``pg_ctl stop``,
everything else by killing its process group.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from devtools.devenv.airflow import (
    DAG_ID,
    airflow_env,
    migrate_airflow,
    run_airflow,
    start_standalone,
    wait_until_up,
)
from devtools.devenv.api import AirflowApi, admin_password, api_token
from devtools.devenv.cluster import Cluster, stop_cluster, tasks_by_worker
from devtools.devenv.services import (
    DEFAULT_STATE,
    Services,
    latest_report,
    running,
    start,
    stop,
    stop_tree,
)
from replayable.settings import check_conf_keys
from replayable.sources import allowed_roots, check_source


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


def run(
    state: Path,
    conf: str,
    *,
    quiet: bool = True,
    dag_id: str = DAG_ID,
    dags_folder: Path | None = None,
) -> int:
    """Run a pipeline of ``dags_folder`` (the project's dags/ by default) once through
    ``airflow dags test``; print and save its report."""
    # `airflow dags test` runs here, with this environment's roots.
    check_conf(conf, allowed_roots())
    with running(state) as services:
        return _run(state, services, conf, quiet=quiet, dag_id=dag_id, dags_folder=dags_folder)


def _run(
    state: Path,
    services: Services,
    conf: str,
    *,
    quiet: bool,
    dag_id: str,
    dags_folder: Path | None,
) -> int:
    from replayable.pipeline import format_report

    env = airflow_env(services, state)
    if dags_folder is not None:
        env["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags_folder.resolve())
    migrate_airflow(env)
    log_path = state / "last_run.log"
    started = datetime.now(UTC)
    with open(log_path, "w") as log:
        done = run_airflow(
            ["dags", "test", dag_id, "--conf", conf],
            env,
            stdout=log if quiet else None,
            stderr=subprocess.STDOUT,
        )
    report = latest_report(services.replayable_dsn, started, dag_id=dag_id)
    if report is None:
        errors = [
            line
            for line in log_path.read_text().splitlines()
            if "Error" in line or "could not be found" in line
        ]
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
        stop_tree(proc.pid)


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
    """Parse the command line and run one command; return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m devtools.devenv", description=__doc__)
    parser.add_argument("--state", type=Path, default=DEFAULT_STATE)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("start", help="start the embedded Postgres and the local model server")
    sub.add_parser("stop", help="stop them")
    sub.add_parser("status", help="show what runs where")
    sub.add_parser("env", help="print the Airflow environment as shell exports")
    sub.add_parser("migrate", help="migrate Airflow's metadata database")
    run_cmd = sub.add_parser("run", help="run a pipeline once and print its report")
    run_cmd.add_argument("--dag", default=DAG_ID, help=f"its DAG id (default: {DAG_ID})")
    run_cmd.add_argument("--conf", default="{}")
    run_cmd.add_argument(
        "--dags-folder", type=Path, default=None, help="the DAG folder (default: dags/)"
    )
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
        return run(
            args.state,
            args.conf,
            quiet=not args.verbose,
            dag_id=args.dag,
            dags_folder=args.dags_folder,
        )
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
