"""A stock Airflow finds every pipeline file written as the README teaches.

Airflow's safe-mode discovery (``[core] dag_discovery_safe_mode``, on by default) parses a
file of the DAG folder only if its text holds the words "airflow" and "dag": a pipeline file
without them is skipped without a word, and ``airflow dags test`` answers that its DAG
"could not be found".
"""

from __future__ import annotations

import pytest
from airflow.utils.file import might_contain_dag

from checks import paste_readme_example
from helpers import ROOT


def test_the_readmes_stage_example_passes_airflows_safe_mode_check(tmp_path):
    path = paste_readme_example(tmp_path / "dags")
    assert might_contain_dag(str(path), safe_mode=True)


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "dags").glob("*.py")))
def test_every_dag_file_passes_airflows_safe_mode_check(name):
    assert might_contain_dag(str(ROOT / "dags" / name), safe_mode=True)
