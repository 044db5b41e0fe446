"""Helpers of the monitoring tests: where the rules are, and promtool to check them.

promtool comes from Debian's prometheus package through monitoring/install-promtool.sh. The
tests skip only where apt itself is missing; any other failure to get promtool fails them.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from helpers import ROOT

MONITORING = ROOT / "monitoring"


def install_promtool() -> Path:
    """The path of a promtool, installed into .local/tools/ when none is on PATH."""
    done = subprocess.run(
        [str(MONITORING / "install-promtool.sh")],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if done.returncode == 2:
        pytest.skip(f"apt is not available to install promtool: {done.stderr.strip()}")
    assert done.returncode == 0, f"could not install promtool:\n{done.stderr}"
    return Path(done.stdout.strip().splitlines()[-1])


def run(promtool: Path, *args: str, cwd: Path = MONITORING) -> str:
    """Run promtool; fail the test with its output unless it succeeds."""
    done = subprocess.run(
        [str(promtool), *args], cwd=cwd, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout
