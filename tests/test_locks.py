"""requirements*.lock: complete, hashed, consistent with their inputs; the image gets runtime only.

Whether an install matches the lock is ``make lock-check`` (run by .ci/run after ``make
install`` on a fresh clone): it needs the environment the lock built, not the one the tests
happen to run in.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import lock  # noqa: E402 - tools/ is not a package

RUNTIME, DEV = ROOT / "requirements.lock", ROOT / "requirements-dev.lock"
DEV_ONLY = {"pgserver", "pytest", "ruff", "mypy", "fpdf2", "uv"}


def entries(path: Path) -> dict[str, list[str]]:
    """Each locked package's ``name==version`` line and its hashes."""
    found: dict[str, list[str]] = {}
    current = None
    for line in path.read_text().splitlines():
        if match := re.match(r"^([a-z0-9][a-z0-9._-]*)==(\S+)", line):
            current = lock.normalize(match[1])
            found[current] = []
        elif current and (digest := re.search(r"--hash=sha256:([0-9a-f]{64})", line)):
            found[current].append(digest[1])
    return found


@pytest.mark.parametrize("path", [RUNTIME, DEV], ids=lambda p: p.name)
def test_every_locked_package_is_pinned_with_hashes(path: Path) -> None:
    locked = entries(path)
    assert locked and all(locked.values()), [n for n, h in locked.items() if not h]
    # Nothing but pins, hashes, comments and the header: no index URLs or local paths.
    for line in path.read_text().splitlines():
        stripped = line.strip()
        assert not stripped or re.match(r"^([a-z0-9]|--hash=|#)", stripped), line


@pytest.mark.parametrize(
    ("path", "inputs"), [(RUNTIME, "requirements.txt"), (DEV, "requirements-dev.txt")]
)
def test_each_lock_pins_its_inputs_at_their_versions(path: Path, inputs: str) -> None:
    wanted = lock.pins(ROOT / inputs)
    locked = lock.pins(path)
    assert {name: locked.get(name) for name in wanted} == wanted


def test_the_dev_lock_has_the_runtime_versions() -> None:
    runtime, dev = lock.pins(RUNTIME), lock.pins(DEV)
    assert {name: dev.get(name) for name in runtime} == runtime


def test_development_tools_stay_out_of_the_runtime_lock() -> None:
    assert set(lock.pins(DEV)) >= DEV_ONLY
    assert not DEV_ONLY & set(lock.pins(RUNTIME))


def test_the_runtime_lock_has_airflow_and_the_celery_executor() -> None:
    runtime = lock.pins(RUNTIME)
    assert runtime["apache-airflow"] == lock.AIRFLOW_VERSION
    assert {"apache-airflow-providers-celery", "celery", "redis"} <= set(runtime)


def test_each_lock_says_how_airflows_constraints_entered_it() -> None:
    header = RUNTIME.read_text().splitlines()[0]
    assert header.startswith(f"# Airflow {lock.AIRFLOW_VERSION}, Python {lock.PYTHON_VERSION}:")
    assert lock.CONSTRAINTS_URL in header
    assert "make lock" in RUNTIME.read_text()


def test_the_image_and_make_install_install_the_locks_with_hashes() -> None:
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert "COPY requirements.lock " in dockerfile
    assert re.search(
        r"pip install .*--require-hashes --no-deps -r \S+requirements\.lock", dockerfile
    )
    assert "requirements-dev" not in dockerfile
    makefile = (ROOT / "Makefile").read_text()
    assert "pip install --quiet --require-hashes --no-deps -r requirements-dev.lock" in makefile


def test_check_reports_a_version_that_differs_from_the_lock(tmp_path: Path) -> None:
    fake_lock = tmp_path / "x.lock"
    fake_lock.write_text("pytest==0.0.1 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    assert lock.check(sys.executable, fake_lock) == 1
