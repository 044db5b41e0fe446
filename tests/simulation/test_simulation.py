"""The simulation walks the pipeline's features in a seeded random order (ADR 0136).

``make test`` walks :data:`DEFAULT_SEEDS` for :data:`DEFAULT_STEPS` steps each;
``make simulate STEPS=… SEED=…`` walks one seed as far as asked. A failure prints the seed
and the steps taken, which walk the same way again.
"""

from __future__ import annotations

import os

import pytest
from walk import Walk, walk

pytestmark = pytest.mark.simulation

STEPS_ENV = "REPLAYABLE_SIM_STEPS"
SEED_ENV = "REPLAYABLE_SIM_SEED"
DEFAULT_STEPS = 30
DEFAULT_SEEDS = (1, 2)


def _seeds() -> tuple[int, ...]:
    """The seeds ``REPLAYABLE_SIM_SEED`` names (one, or several comma-separated)."""
    seeds = os.environ.get(SEED_ENV, "").strip()
    return tuple(int(seed) for seed in seeds.split(",")) if seeds else DEFAULT_SEEDS


@pytest.mark.parametrize("seed", _seeds())
def test_every_mix_of_steps_keeps_the_invariants(
    seed, run_in_process, conn, model, tmp_path, monkeypatch
):
    """Any drawn mix of documents, runs, harms, kills, redrives, sweeps and version bumps
    leaves the ledger and the provider's books consistent after each step and at quiescence."""
    steps = int(os.environ.get(STEPS_ENV) or DEFAULT_STEPS)
    walker = Walk(seed, tmp_path / "docs", run_in_process, conn, model, monkeypatch)
    walk(walker, steps)
