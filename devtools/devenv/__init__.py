"""The dev environment behind ``make``: local services, Airflow, the Celery cluster, the CLI.

- :mod:`~devtools.devenv.services`: the embedded Postgres and the model server under a
  state folder (``start``, ``stop``), and the ledger helpers the tests use;
- :mod:`~devtools.devenv.airflow`: Airflow's environment, migration and processes;
- :mod:`~devtools.devenv.api`: the REST calls the cluster commands and the tests make;
- :mod:`~devtools.devenv.cluster`: Redis, Airflow on CeleryExecutor and its workers;
- :mod:`~devtools.devenv.cli`: ``python -m devtools.devenv …``, which the Makefile runs.

The names the tests, the benchmarks and the chaos runs use as ``devenv.X`` are re-exported
here, so they import the package and not the module that defines each.
"""

from __future__ import annotations

from devtools.devenv.airflow import (
    COMMANDS,
    DAG_ID,
    MIGRATE,
    SHARED_ENV_FILE,
    AirflowProcesses,
    airflow_env,
    migrate_airflow,
    read_env_file,
    shared_airflow_env,
    start_standalone,
    wait_until_up,
    worker_hostname,
)
from devtools.devenv.api import AirflowApi, admin_password, api_token
from devtools.devenv.cli import check_conf, main, run
from devtools.devenv.cluster import CLUSTER, Cluster, cluster_env, stop_cluster, tasks_by_worker
from devtools.devenv.services import (
    DEFAULT_STATE,
    ROOT,
    Services,
    drop_search_indexes,
    empty_ledger,
    latest_report,
    model_server_running,
    postgres_conn_json,
    shared_buffers_mb,
    start,
    stop,
    stop_tree,
)

__all__ = [
    "CLUSTER",
    "COMMANDS",
    "DAG_ID",
    "DEFAULT_STATE",
    "MIGRATE",
    "ROOT",
    "SHARED_ENV_FILE",
    "AirflowApi",
    "AirflowProcesses",
    "Cluster",
    "Services",
    "admin_password",
    "airflow_env",
    "api_token",
    "check_conf",
    "cluster_env",
    "drop_search_indexes",
    "empty_ledger",
    "latest_report",
    "main",
    "migrate_airflow",
    "model_server_running",
    "postgres_conn_json",
    "read_env_file",
    "run",
    "shared_airflow_env",
    "shared_buffers_mb",
    "start",
    "start_standalone",
    "stop",
    "stop_cluster",
    "stop_tree",
    "tasks_by_worker",
    "wait_until_up",
    "worker_hostname",
]
