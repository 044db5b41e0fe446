"""devtools.devenv.airflow and its CLI: Airflow pointed at this checkout, as `make` runs it."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

from devtools import devenv
from devtools.devenv.airflow import WORKER_HOSTNAME_CALLABLE, worker_hostname
from helpers import ROOT


def _services() -> devenv.Services:
    return devenv.Services(
        replayable_dsn="postgresql://postgres@/replayable?host=/tmp",
        airflow_db_url="postgresql+psycopg2://postgres@/airflow?host=/tmp",
        model_url="http://127.0.0.1:1/v1",
        model_pid=None,
        pgdata=None,
    )


def test_airflow_is_pointed_at_this_checkouts_dags_plugins_and_library(tmp_path: Path) -> None:
    """ROOT is the repository root, however deep the module that defines it sits."""
    assert devenv.ROOT == ROOT
    env = devenv.airflow_env(_services(), tmp_path)
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == str(ROOT / "dags")
    assert env["AIRFLOW__CORE__PLUGINS_FOLDER"] == str(ROOT / "plugins")
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT / "include")
    assert devenv.SHARED_ENV_FILE == ROOT / "airflow.env"


def test_the_workers_hostname_callable_names_an_importable_function() -> None:
    """Airflow imports ``[core] hostname_callable`` by its dotted path in each worker."""
    module, _, name = WORKER_HOSTNAME_CALLABLE.rpartition(".")
    assert getattr(importlib.import_module(module), name) is worker_hostname
    env = {"AIRFLOW__CORE__EXECUTION_API_SERVER_URL": "http://127.0.0.1:1/execution/"}
    _, extra = devenv.AirflowProcesses(env, Path()).command("celery worker", "celery worker#2")
    assert extra["AIRFLOW__CORE__HOSTNAME_CALLABLE"] == WORKER_HOSTNAME_CALLABLE


def test_the_makefiles_command_runs_the_package(tmp_path: Path) -> None:
    """``python -m devtools.devenv`` (the Makefile's DEVENV) reaches the CLI."""
    done = subprocess.run(
        [sys.executable, "-m", "devtools.devenv", "--state", str(tmp_path), "status"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "include"), str(ROOT)])},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 1
    assert f"no services are running under {tmp_path}" in done.stderr
