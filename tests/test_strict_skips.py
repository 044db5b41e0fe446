"""Strict mode (``REPLAYABLE_STRICT=1``) turns skips of the tests CI must run into failures."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from helpers.session import pytest_session

# Each test starts pytest sub-sessions: the harness checking itself (not in test-fast).
pytestmark = pytest.mark.harness

TESTS = Path(__file__).resolve().parent
SKIPPING = """
import pytest

@pytest.fixture
def promtool():
    pytest.skip("promtool could not be installed")

@pytest.mark.chaos
def test_chaos_that_skips():
    pytest.skip("no Airflow here")

def test_promtool_that_skips(promtool):
    pass

def test_plain_skip():
    pytest.skip("nothing to check on this platform")

def test_passes():
    pass
"""


def _session(tmp_path: Path, strict: str | None) -> subprocess.CompletedProcess[str]:
    """Run pytest on a module whose tests skip, with the strict-skips plugin loaded."""
    (tmp_path / "test_skipping.py").write_text(SKIPPING)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    chaos: a chaos test\n")
    env = {k: v for k, v in os.environ.items() if k != "REPLAYABLE_STRICT"}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    if strict is not None:
        env["REPLAYABLE_STRICT"] = strict
    return pytest_session(tmp_path, "-p", "strict_skips", "-rA", str(tmp_path), env=env)


def test_strict_mode_fails_a_skipped_chaos_or_promtool_test_and_keeps_other_skips(
    tmp_path: Path,
) -> None:
    done = _session(tmp_path, "1")
    assert done.returncode == 1, done.stdout
    assert "FAILED test_skipping.py::test_chaos_that_skips" in done.stdout
    assert "no Airflow here" in done.stdout
    assert "ERROR test_skipping.py::test_promtool_that_skips" in done.stdout
    assert "SKIPPED" in done.stdout and "nothing to check on this platform" in done.stdout
    assert "1 passed" in done.stdout


@pytest.mark.parametrize("strict", [None, "0"])
def test_without_strict_mode_those_skips_stay_skips(tmp_path: Path, strict: str | None) -> None:
    done = _session(tmp_path, strict)
    assert done.returncode == 0, done.stdout
    assert "3 skipped" in done.stdout and "1 passed" in done.stdout
