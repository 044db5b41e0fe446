"""What the make targets run, read from `make -n` (a dry run: nothing is executed)."""

from __future__ import annotations

import os
import shlex
import subprocess

from helpers import ROOT


def _dry_run(target: str, *args: str, unset: tuple[str, ...]) -> list[str]:
    """The commands ``make -n target args`` prints, one a line.

    A make that runs this test passes its own command-line variables (PYTEST_ARGS, DAG,
    CONF) down in the environment: ``unset`` keeps them out, so that the dry run sees the
    Makefile's defaults, not the caller's.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k not in unset}
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", "-C", str(ROOT), target, *args],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return done.stdout.splitlines()


def _pytest_lines(target: str, *args: str) -> list[list[str]]:
    lines = [
        shlex.split(line)
        for line in _dry_run(target, *args, unset=("PYTEST_ARGS",))
        if " -m pytest" in line
    ]
    return [words[words.index("pytest") + 1 :] for words in lines]


def _marker_expression(words: list[str]) -> str:
    return words[words.index("-m") + 1]


def test_make_test_runs_every_tier_in_two_sessions_each_printing_its_25_slowest_tests():
    fast, slow = _pytest_lines("test")
    assert fast[:4] == ["-n", "4", "--dist", "worksteal"] and "-n" not in slow
    assert _marker_expression(fast) == f"not ({_marker_expression(slow)})"
    for words in (fast, slow):
        assert words[-1] == "--durations=25"


def test_pytest_args_reach_both_sessions():
    for words in _pytest_lines("test", "PYTEST_ARGS=-k x"):
        assert words[-3:] == ["--durations=25", "-k", "x"]


def test_every_registered_tier_but_the_unit_ones_is_in_the_slow_session_or_test_fast_skips_it():
    """A new marker must be placed: make test's slow session or test-fast's exclusions."""
    import tomllib

    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    names = {m.split(":")[0] for m in markers["markers"]}
    (fast,) = _pytest_lines("test-fast")
    excluded = set(_marker_expression(fast).replace("not ", "").replace(" and ", " ").split())
    (_, slow) = _pytest_lines("test")
    in_slow = set(_marker_expression(slow).replace(" or ", " ").split())
    assert names - {"db"} == excluded, "test-fast must name every tier it leaves out"
    assert in_slow <= names and in_slow <= excluded


def _devenv_line(target: str, *args: str) -> list[str]:
    dry_run = _dry_run(target, *args, unset=("DAG", "CONF"))
    (line,) = [line for line in dry_run if " -m devtools.devenv " in line]
    words = shlex.split(line)
    return words[words.index("run") :]


def test_make_run_runs_the_pipeline_dag_names_with_conf_document_pipeline_by_default():
    conf = '{"source": "/data/pdfs"}'
    assert _devenv_line("run", f"CONF={conf}") == [
        "run",
        "--dag",
        "document_pipeline",
        "--conf",
        conf,
    ]
    assert _devenv_line("run", "DAG=top_words_pipeline", f"CONF={conf}") == [
        "run",
        "--dag",
        "top_words_pipeline",
        "--conf",
        conf,
    ]
