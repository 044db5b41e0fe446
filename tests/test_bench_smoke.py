"""`make bench-smoke`: every benchmark runs at a reduced size and its counts are right."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import ROOT

pytestmark = pytest.mark.bench

FIGURES = {"B1", "B2", "B3", "B4", "B5", "B6", "B7", "B8", "B9", "B14", "B15", "B16", "B17", "B22"}


def test_every_benchmark_runs_and_its_counts_hold(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "include"), str(ROOT)])}
    env.pop("REPLAYABLE_DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--smoke"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=1200,
    )
    log = tmp_path / "bench-smoke.log"
    log.write_text(done.stdout + done.stderr)
    assert done.returncode == 0, f"see {log}:\n{done.stderr[-2000:]}"
    result = json.loads((ROOT / ".local" / "bench-smoke.json").read_text())
    ids = {figure["id"] for figure in result["figures"]}
    assert ids >= FIGURES
    assert all(set(f) >= {"id", "value", "target", "pass"} for f in result["figures"])
    counts = {f["id"]: f for f in result["figures"]}
    assert counts["B1.calls"]["value"] == 0  # the identical re-run paid nothing
    assert counts["B3.trips"]["value"] <= 3
    assert counts["B5.429"]["value"] == 0
    assert counts["B22.clean"]["value"] == 0  # the consistent ledger breaks no invariant
    assert counts["B17.writes"]["value"] == 1  # the unchanged paths were never rewritten
