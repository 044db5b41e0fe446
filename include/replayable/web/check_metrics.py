"""The invariant check's metrics, served with the ledger's at ``/replayable/metrics``.

A check reads the whole ledger (seconds at a million documents), so no scrape runs one: a
scrape reads the counts the last ``replayable check --record`` kept, one row per invariant
(``replayable.invariant_checks``, ADR 0135).

``replayable_invariant_violations{invariant}`` (gauge)
    rows that broke the invariant when the ledger was last checked; every invariant that
    check named, zeros included. No series before the first recorded check.
``replayable_invariant_check_timestamp_seconds`` (gauge)
    when the ledger was last checked (Unix time): alert when it gets old.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from replayable import db, invariants

Row = dict[str, Any]


def read_counts(conn: db.Connection) -> list[Row]:
    """The last recorded check's counts per invariant (a few rows)."""
    return invariants.recorded_counts(conn)


def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
    return (
        GaugeMetricFamily(
            "replayable_invariant_violations",
            "Rows that broke the invariant when the ledger was last checked.",
            labels=["invariant"],
        ),
        GaugeMetricFamily(
            "replayable_invariant_check_timestamp_seconds",
            "When the ledger was last checked against its invariants (Unix time).",
        ),
    )


INVARIANT_METRIC_NAMES: frozenset[str] = frozenset(family.name for family in _families())


class InvariantCollector:
    """A prometheus_client collector over the recorded counts, read once per collect."""

    def __init__(self, read: Callable[[], list[Row]]) -> None:
        self._read = read

    def describe(self) -> Iterable[Metric]:
        return _families()  # registering must not read the database

    def collect(self) -> Iterator[Metric]:
        violations, checked = _families()
        rows = self._read()
        for row in rows:
            violations.add_metric([row["invariant"]], int(row["violations"]))
        if rows:
            checked.add_metric([], max(float(row["checked_at"]) for row in rows))
        return iter((violations, checked))
