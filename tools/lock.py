"""Lock the project's dependencies (``make lock``) and check an install against the lock.

Two inputs, edited by people, and two locks, generated from them (never edit those):

- ``requirements.txt`` (what a deployment runs) -> ``requirements.lock``: installed by the
  Docker image;
- ``requirements-dev.txt`` (``-r requirements.txt`` plus the embedded Postgres and the test
  tools) -> ``requirements-dev.lock``: installed by ``make install``. It is resolved with
  ``requirements.lock`` as a constraint, so every runtime package has the same version in
  both.

Each lock pins every package, transitive ones included, with the sha256 of every file PyPI
serves for that version, for CPython 3.11 on Linux (``--require-hashes`` installs refuse
anything else).

Airflow is meant to be installed against its constraints file for the release and Python
version. ``lock`` fetches it; the project's own pins win over it (a provider newer than the
release is the usual case, and Airflow's docs allow it), and so do the Airflow providers
those pins pull in. Where the file cannot be fetched (the development machines reach PyPI
only), the lock stands in for it with the way the file itself is made, a highest-version
resolution on the day of the release: every package not pinned by the project and not an
Airflow provider is limited to the versions that were on PyPI at ``RELEASE_CUTOFF``. The
lock's header says which of the two was used.

``python tools/lock.py check --python .venv/bin/python`` compares ``pip freeze`` of an
environment with the dev lock (``make lock-check``). It lists every package, setuptools
included (the lock pins it: it builds the project's editable install), except pip itself,
which comes with the venv, and the project, which ``make install`` installs from its source.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import tomllib
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AIRFLOW_VERSION = "3.3.2"
PYTHON_VERSION = "3.11"
PLATFORM = "x86_64-manylinux_2_28"
CONSTRAINTS_URL = (
    "https://raw.githubusercontent.com/apache/airflow/"
    f"constraints-{AIRFLOW_VERSION}/constraints-{PYTHON_VERSION}.txt"
)
# apache-airflow 3.3.2 was uploaded to PyPI on 2026-09-16; its constraints were resolved then.
RELEASE_CUTOFF = "2026-09-17"
PROVIDER_PREFIX = "apache-airflow-providers-"
INPUTS = {"requirements.lock": "requirements.txt", "requirements-dev.lock": "requirements-dev.txt"}

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;\\#]+)")


def normalize(name: str) -> str:
    """A distribution name as PyPI compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    """``name == version`` lines of a requirements or lock file (``-r`` lines are followed)."""
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith(("-r ", "--requirement ")):
            found.update(pins(path.parent / line.split(maxsplit=1)[1]))
        elif match := _PIN.match(line):
            found[normalize(match[1])] = match[2]
    return found


def fetch_constraints(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=15) as response:  # noqa: S310 - a fixed https URL
            return str(response.read().decode())
    except OSError as error:
        print(f"lock: {url} is unreachable ({error}); using the release-day cutoff")
        return None


def uv(*args: str) -> None:
    command = [str(Path(sys.executable).with_name("uv")), "pip", "compile", *args]
    subprocess.run(command, cwd=ROOT, check=True)


def common_args() -> list[str]:
    return [
        "--python-version",
        PYTHON_VERSION,
        "--python-platform",
        PLATFORM,
        "--generate-hashes",
        "--strip-extras",
        "--custom-compile-command",
        "make lock",
        "--quiet",
    ]


def constraint_args(work: Path, constraints: str | None, own: set[str]) -> tuple[list[str], str]:
    """How the Airflow constraints enter the resolution, and a line saying so for the header."""
    if constraints is not None:
        kept = [
            line
            for line in constraints.splitlines()
            if not (match := _PIN.match(line.strip()))
            or not (normalize(match[1]) in own or normalize(match[1]).startswith(PROVIDER_PREFIX))
        ]
        path = work / f"constraints-{AIRFLOW_VERSION}-{PYTHON_VERSION}.txt"
        path.write_text("\n".join(kept) + "\n")
        note = f"constraints: {CONSTRAINTS_URL}, except the project's pins and the providers"
        return ["--constraint", str(path)], note
    # The providers that the project's pins pull in: resolved once without a cutoff.
    probe = work / "probe.txt"
    uv("requirements.txt", "--python-version", PYTHON_VERSION, "--python-platform", PLATFORM,
       "--quiet", "--no-header", "--no-annotate", "-o", str(probe))  # fmt: skip
    exempt = own | {name for name in pins(probe) if name.startswith(PROVIDER_PREFIX)}
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).date().isoformat()
    args = ["--exclude-newer", RELEASE_CUTOFF]
    for name in sorted(exempt):
        args += ["--exclude-newer-package", f"{name}={tomorrow}"]
    note = (
        f"constraints: {CONSTRAINTS_URL} was unreachable; instead every package but the "
        f"project's pins and the Airflow providers is limited to PyPI on {RELEASE_CUTOFF}, "
        f"the day after apache-airflow {AIRFLOW_VERSION} was released"
    )
    return args, note


def lock(upgrade: bool) -> None:
    own = set(pins(ROOT / "requirements.txt"))
    extra = ["--upgrade"] if upgrade else []
    with tempfile.TemporaryDirectory() as tmp:
        args, note = constraint_args(Path(tmp), fetch_constraints(CONSTRAINTS_URL), own)
        uv("requirements.txt", *common_args(), *args, *extra, "-o", "requirements.lock")
        # The development tools are no part of Airflow's installation: only the runtime
        # lock constrains them.
        uv(
            "requirements-dev.txt",
            *common_args(),
            *extra,
            "--constraint",
            "requirements.lock",
            "-o",
            "requirements-dev.lock",
        )
    notes = {"requirements.lock": note, "requirements-dev.lock": "runtime as requirements.lock"}
    for name in INPUTS:
        path = ROOT / name
        text = path.read_text()
        header = f"# Airflow {AIRFLOW_VERSION}, Python {PYTHON_VERSION}: {notes[name]}.\n"
        path.write_text(header + re.sub(r"^# Airflow .*\n", "", text, count=1))
        print(f"lock: wrote {name} ({len(pins(path))} packages)")


def project_name() -> str:
    """The project's own distribution name (pyproject.toml)."""
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"])


def check(python: str, lock_file: Path) -> int:
    """Compare ``pip freeze`` of ``python``'s environment with ``lock_file``; 0 when equal."""
    # --all: on Python < 3.12 pip freeze hides setuptools, which the lock pins.
    frozen = subprocess.run(
        [python, "-m", "pip", "freeze", "--all", "--disable-pip-version-check",
         "--exclude", "pip", "--exclude", project_name()],
        capture_output=True,
        text=True,
        check=True,
    ).stdout  # fmt: skip
    installed = {
        normalize(name): version
        for name, version in (line.split("==", 1) for line in frozen.splitlines() if "==" in line)
    }
    others = [line for line in frozen.splitlines() if line.strip() and "==" not in line]
    locked = pins(lock_file)
    problems = [f"not installed: {n}=={v}" for n, v in sorted(locked.items()) if n not in installed]
    problems += [
        f"{n}: installed {installed[n]}, locked {v}"
        for n, v in sorted(locked.items())
        if n in installed and installed[n] != v
    ]
    problems += [
        f"not in the lock: {n}=={v}" for n, v in sorted(installed.items()) if n not in locked
    ]
    problems += [f"not installed from an index: {line}" for line in others]
    for problem in problems:
        print(f"lock-check: {problem}")
    if not problems:
        print(f"lock-check: pip freeze matches {lock_file.name} ({len(locked)} packages)")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    lock_cmd = sub.add_parser("lock", help="regenerate requirements.lock and requirements-dev.lock")
    lock_cmd.add_argument("--upgrade", action="store_true", help="newest versions allowed")
    check_cmd = sub.add_parser("check", help="compare pip freeze with a lock")
    check_cmd.add_argument("--python", default=sys.executable)
    check_cmd.add_argument("--lock", type=Path, default=ROOT / "requirements-dev.lock")
    args = parser.parse_args(argv)
    if args.command == "lock":
        lock(args.upgrade)
        return 0
    return check(args.python, args.lock)


if __name__ == "__main__":
    sys.exit(main())
