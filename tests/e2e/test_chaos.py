"""Chaos scenarios (a) and (c) through a real Airflow, at a reduced size (``make chaos``: all).

The scenarios are the ones ``make chaos`` runs (``chaos/scenarios.py``), on 60 documents
instead of 300: the same faults, the same reconciliation, asserted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.env import ChaosEnv
from chaos.scenarios import Context, Size, run_scenario

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]


@pytest.fixture(scope="module")
def chaos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Context]:
    workdir: Path = tmp_path_factory.mktemp("chaos")
    with ChaosEnv(workdir / "env", workdir / "corpora") as env:
        yield Context(env, Size(documents=60), log=lambda line: print(line, flush=True))


def test_killed_task_processes_of_two_batches_are_redone_and_nothing_is_paid_twice(chaos):
    """(a) SIGKILL two running embed batches: the run ends done, each chunk charged once."""
    result = run_scenario(chaos, "a")
    print(result.describe())
    assert result.passed, result.problems
    assert len(result.facts["killed"]) == 2


def test_a_postgres_restart_mid_run_costs_retries_not_documents(chaos):
    """(c) Restart the replayable database under running tasks: nothing lost or paid twice."""
    result = run_scenario(chaos, "c")
    print(result.describe())
    assert result.passed, result.problems
    assert result.facts["running at the restart"]
