"""The project as an installed package (ADR 0063): the command, the provider, the lock."""

from __future__ import annotations

import subprocess
import tomllib
from importlib import metadata

from packaging.requirements import Requirement

from conftest import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _locked(path: str) -> dict[str, str]:
    pins = {}
    for line in (ROOT / path).read_text().splitlines():
        if "==" in line and not line.startswith((" ", "#")):
            name, version = line.split(" ", 1)[0].split("==")
            pins[name.lower().replace("_", "-")] = version
    return pins


def test_the_replayable_command_is_on_the_venvs_path():
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "replayable"), "--help"],
        env={"PATH": "/usr/bin:/bin"},  # no PYTHONPATH: the install alone must do
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for command in ("status", "failed", "dead-letters", "rerun", "redrive"):
        assert command in done.stdout


def test_airflow_finds_the_provider_through_its_entry_point():
    (found,) = [
        ep for ep in metadata.entry_points(group="apache_airflow_provider")
        if ep.dist is not None and ep.dist.name == PROJECT["name"]
    ]  # fmt: skip
    info = found.load()()
    assert info["package-name"] == PROJECT["name"]
    assert info["connection-types"]


def test_the_runtime_lock_satisfies_every_declared_dependency():
    locked = _locked("requirements.lock")
    for line in PROJECT["dependencies"]:
        wanted = Requirement(line)
        name = wanted.name.lower().replace("_", "-")
        assert name in locked, f"{name} is declared but not locked"
        assert wanted.specifier.contains(locked[name]), (line, locked[name])
