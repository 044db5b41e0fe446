"""The README's stage example, pasted into a new file of dags/, runs with `make run DAG=…`.

`make run DAG=<id> CONF=…` runs `python -m devtools.devenv run --dag <id> --conf …`
(tests/test_makefile.py); here that command runs through a stock Airflow (`airflow dags
test`, safe-mode discovery on) over a copy of dags/ with the example pasted in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from checks import README_EXAMPLE_DAG, paste_readme_example, rows, subset
from helpers import ROOT
from replayable import sources

pytestmark = pytest.mark.e2e


def test_the_readmes_example_pasted_into_dags_runs_with_make_run_and_prints_its_report(
    services, state_dir, airflow_env, conn, tmp_path, tmp_path_factory
):
    dags = tmp_path / "dags"
    paste_readme_example(dags)
    folder = subset(tmp_path, 2)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "include"), str(ROOT)]),
        sources.ROOTS_ENV: str(tmp_path_factory.getbasetemp()),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "devtools.devenv",
            "--state",
            str(state_dir),
            "run",
            "--dag",
            README_EXAMPLE_DAG,
            "--conf",
            json.dumps({"source": str(folder)}),
            "--dags-folder",
            str(dags),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # The report, printed as `make run` prints it.
    assert "2 documents" in done.stdout, done.stdout
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("top_words ")]
    assert line.split()[1] == "2", done.stdout  # done
    assert rows(conn, "SELECT payload->>'dag_id', count(*) FROM replayable.outbox GROUP BY 1") == [
        (README_EXAMPLE_DAG, 2)
    ]
