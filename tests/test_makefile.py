"""What the make targets run, read from `make -n` (a dry run: nothing is executed)."""

from __future__ import annotations

import os
import subprocess

from conftest import ROOT


def _pytest_line(target: str, *args: str) -> list[str]:
    # A make that runs this test passes its own command-line variables (PYTEST_ARGS) down in
    # the environment: the dry run must see the Makefile's defaults, not the caller's.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k != "PYTEST_ARGS"}
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", "-C", str(ROOT), target, *args],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    (line,) = [line for line in done.stdout.splitlines() if " -m pytest" in line]
    return line.split()[line.split().index("pytest") + 1 :]


def test_make_test_prints_the_25_slowest_tests_and_runs_what_pytest_args_select():
    assert _pytest_line("test") == ["--durations=25"]
    assert _pytest_line("test", "PYTEST_ARGS=-k x") == ["--durations=25", "-k", "x"]
