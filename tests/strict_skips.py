"""``REPLAYABLE_STRICT=1``: a skipped browser, real-world-PDF, promtool or chaos test fails.

Those tests skip, saying why, when their tools cannot be installed on a developer's machine.
CI has every tool, so a skip there means a check silently did not run: under strict mode
the skip is reported as a failure instead (ADR 0081). Other skips stay skips.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest

STRICT_ENV = "REPLAYABLE_STRICT"
# Markers and fixtures that identify the tests CI must never skip.
GUARDED_MARKERS = frozenset({"chaos", "realworld"})
GUARDED_FIXTURES = frozenset({"chromium", "promtool", "realworld_corpus"})


def strict() -> bool:
    """Whether this session runs in strict mode."""
    return os.environ.get(STRICT_ENV, "") not in ("", "0")


def guarded(item: pytest.Item) -> bool:
    """Whether ``item`` is a browser, real-world-PDF, promtool or chaos test."""
    markers = {mark.name for mark in item.iter_markers()}
    fixtures = set(getattr(item, "fixturenames", ()))
    return bool(markers & GUARDED_MARKERS or fixtures & GUARDED_FIXTURES)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    """Turn the skip of a guarded test into a failure that gives the skip's reason."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not (report.skipped and strict() and guarded(item)):
        return
    if hasattr(report, "wasxfail"):
        return  # an expected failure is not a skip of the check
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"{STRICT_ENV}=1: this test may not be skipped here, but was: {reason}"
