"""The project as an installed package (ADR 0063, 0091): the command, the provider, the lock, and
a wheel that carries the product and none of the dev tooling."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from helpers import ROOT

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


# What the wheel must never carry: the dev tooling and the dev-only embedded Postgres.
DEV_ONLY = ("devtools", "pgserver")


def _imports(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel `pip wheel` builds from a copy of the project (the build writes into it)."""
    src = tmp_path_factory.mktemp("src")
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copytree(
        ROOT / "include",
        src / "include",
        ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"),
    )
    out = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip, "--wheel-dir", str(out), str(src)], check=True, timeout=300)
    (built,) = out.glob("replayable-*.whl")
    return built


def test_the_wheel_carries_the_product_and_no_dev_tooling(wheel: Path):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        sources = {n: archive.read(n).decode() for n in names if n.endswith(".py")}
    packages = {name.split("/", 1)[0] for name in names}
    assert packages == {"replayable", "replayable-0.1.0.dist-info"}, packages
    assert "replayable/sql/queries/ledger/claim_items.sql" in names
    assert "replayable/web/templates/base.html" in names
    offenders = {
        name: sorted(i for i in _imports(text) if i.split(".")[0] in DEV_ONLY)
        for name, text in sources.items()
    }
    assert not {k: v for k, v in offenders.items() if v}, "the product imports dev tooling"


@pytest.mark.packaging
def test_the_wheel_in_a_clean_venv_with_the_runtime_lock_runs_the_command_and_the_provider(
    wheel: Path, tmp_path: Path
):
    """Installed the way a deployment installs it: the runtime lock, then the wheel alone."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps"]
    lock = ["--require-hashes", "-r", str(ROOT / "requirements.lock")]
    subprocess.run([*pip, *lock], check=True, timeout=900)
    subprocess.run([*pip, str(wheel)], check=True, timeout=300)
    # Outside the checkout and without PYTHONPATH: only what was installed can be imported.
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    env["AIRFLOW_HOME"] = str(tmp_path / "airflow")

    def run(*command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
        )

    done = run(str(venv / "bin" / "replayable"), "--help")
    assert done.returncode == 0, done.stderr
    assert all(c in done.stdout for c in ("status", "failed", "dead-letters", "rerun", "redrive"))
    probe = (
        "import importlib.util, json\n"
        "from importlib.metadata import entry_points\n"
        "(ep,) = [e for e in entry_points(group='apache_airflow_provider')"
        " if e.dist.name == 'replayable']\n"
        "info = ep.load()()\n"
        "print(json.dumps({'provider': info['package-name'],"
        " 'connections': [c['connection-type'] for c in info['connection-types']],"
        " 'dev': [m for m in ('devtools', 'pgserver') if importlib.util.find_spec(m)]}))\n"
    )
    done = run(str(venv / "bin" / "python"), "-c", probe)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["provider"] == "replayable" and found["connections"]
    assert found["dev"] == [], "dev tooling is importable from the installed product"
