"""Prometheus metrics of the ledger at ``/replayable/metrics``, read from counters per scrape.

Airflow has no Prometheus endpoint of its own, so the Replayable UI app serves one. Each
scrape builds a fresh registry with one :class:`LedgerCollector`, which reads the counter
tables that triggers keep in the transaction of every change (``stage_counts``,
``dead_letter_counts``, ``model_call_counts``, ``model_cost_counts``): there is no global
mutable metric, every API server worker answers the same, and a scrape costs the same at a
thousand documents as at a million (ADR 0050).

Exported families (every label value comes from the ledger):

``replayable_items{stage,status}`` (gauge)
    items whose current row in the stage has the status (pending, running, done, failed,
    dead); every pipeline stage and status is present, zeros included.
``replayable_dead_letters_open{stage}`` (gauge)
    open dead letters: the work list's depth.
``replayable_dead_letters_created_total{stage}`` (counter)
    dead letters ever created, whatever became of them: alert on its rate, not the depth.
``replayable_model_calls_total{stage,outcome}`` (counter)
    billable model requests, ``outcome`` being ``ok`` or the error class (``http_503``, …).
``replayable_model_call_retries_total{stage}`` (counter)
    requests that were a retry inside an item's attempt (``call_try > 1``).
``replayable_model_tokens_total{stage}`` (counter)
    tokens the provider billed.
``replayable_model_cost_total{model,mode}`` (counter)
    USD the answered calls cost at the model connection's prices when they were made
    (ADR 0110); ``mode`` is ``sync``. A model with no price adds nothing here and counts in
``replayable_model_unpriced_calls_total{model,mode}`` (counter)
    answered calls no price covered.
``replayable_model_call_latency_seconds{stage}`` (histogram)
    request latency of every call, failed ones included; buckets from 5 ms to 30 s.
``replayable_outbox_events{status}`` (gauge)
    outbox events by status (pending: the backlog; published; dead), zeros included.
``replayable_outbox_oldest_pending_age_seconds`` (gauge)
    age of the oldest pending event; 0 when nothing waits.
``replayable_outbox_published_total`` (counter)
    events ever published: a backlog that does not drain shows as no increase.
``replayable_outbox_dead_lettered_total`` (counter)
    events ever dead-lettered, also those requeued since (ADR 0072).
``replayable_invariant_violations{invariant}``, ``replayable_invariant_check_timestamp_seconds``
    the last recorded invariant check (:mod:`.check_metrics`, ADR 0150).

**Who may scrape.** An Airflow user allowed to see plugins, or a Prometheus server with
the scrape token (:mod:`.scrape_auth`, ADR 0071), checked before any read.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from starlette.concurrency import run_in_threadpool

from replayable import db
from replayable.views import stage_order
from replayable.vocabulary import ITEM_STATUSES, OUTBOX_STATUSES
from replayable.web.check_metrics import INVARIANT_METRIC_NAMES, InvariantCollector, read_counts
from replayable.web.scrape_auth import TOKEN_VARIABLE, authorize

__all__ = [
    "LATENCY_BOUNDS_MS",
    "METRIC_NAMES",
    "TOKEN_VARIABLE",
    "LedgerCollector",
    "LedgerSnapshot",
    "authorize",
    "read_snapshot",
    "render",
    "router",
]

log = logging.getLogger(__name__)

# replayable.latency_bucket()'s upper bounds (migration 0002); -1 in the counters is +Inf.
LATENCY_BOUNDS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)
_INF = -1

Row = dict[str, Any]


@dataclass(frozen=True)
class LedgerSnapshot:
    """The counter rows one scrape reads (see the ``metrics_*`` queries)."""

    items: list[Row]
    dead_letters: list[Row]
    model_calls: list[Row]
    outbox: list[Row] = dataclasses.field(default_factory=list)
    model_costs: list[Row] = dataclasses.field(default_factory=list)
    oldest_pending_age_s: float = 0.0


def read_snapshot(conn: db.Connection) -> LedgerSnapshot:
    """Read the counters, and the oldest pending event through its partial index."""
    oldest = db.fetch_all(conn, "outbox/oldest_pending")
    return LedgerSnapshot(
        items=db.fetch_all(conn, "metrics/items"),
        dead_letters=db.fetch_all(conn, "metrics/dead_letters"),
        model_calls=db.fetch_all(conn, "metrics/model_calls"),
        outbox=db.fetch_all(conn, "metrics/outbox"),
        model_costs=db.fetch_all(conn, "metrics/model_costs"),
        oldest_pending_age_s=max(float(oldest[0]["age_s"]), 0.0) if oldest else 0.0,
    )


@dataclass(frozen=True)
class _Families:
    """Every family this endpoint exports, empty; :class:`LedgerCollector` fills them."""

    items: GaugeMetricFamily
    open: GaugeMetricFamily
    created: CounterMetricFamily
    calls: CounterMetricFamily
    retries: CounterMetricFamily
    tokens: CounterMetricFamily
    cost: CounterMetricFamily
    unpriced: CounterMetricFamily
    latency: HistogramMetricFamily
    outbox: GaugeMetricFamily
    outbox_age: GaugeMetricFamily
    outbox_published: CounterMetricFamily
    outbox_dead: CounterMetricFamily

    @classmethod
    def empty(cls) -> _Families:
        return cls(
            items=GaugeMetricFamily(
                "replayable_items",
                "Items whose current row in the stage has the status.",
                labels=["stage", "status"],
            ),
            open=GaugeMetricFamily(
                "replayable_dead_letters_open",
                "Open dead letters (the work list's depth).",
                labels=["stage"],
            ),
            created=CounterMetricFamily(
                "replayable_dead_letters_created",
                "Dead letters ever created, whatever their status now.",
                labels=["stage"],
            ),
            calls=CounterMetricFamily(
                "replayable_model_calls",
                "Billable model requests by outcome: ok or the error class.",
                labels=["stage", "outcome"],
            ),
            retries=CounterMetricFamily(
                "replayable_model_call_retries",
                "Model requests that retried a failed request of the same item attempt.",
                labels=["stage"],
            ),
            tokens=CounterMetricFamily(
                "replayable_model_tokens",
                "Tokens the model provider billed.",
                labels=["stage"],
            ),
            cost=CounterMetricFamily(
                "replayable_model_cost",
                "USD the answered model calls cost at the connection's prices.",
                labels=["model", "mode"],
            ),
            unpriced=CounterMetricFamily(
                "replayable_model_unpriced_calls",
                "Answered model calls whose model had no price in the connection.",
                labels=["model", "mode"],
            ),
            latency=HistogramMetricFamily(
                "replayable_model_call_latency_seconds",
                "Model request latency, failed requests included.",
                labels=["stage"],
            ),
            outbox=GaugeMetricFamily(
                "replayable_outbox_events",
                "Outbox events by status (pending is the backlog).",
                labels=["status"],
            ),
            outbox_age=GaugeMetricFamily(
                "replayable_outbox_oldest_pending_age_seconds",
                "Age of the oldest pending outbox event; 0 when none waits.",
            ),
            outbox_published=CounterMetricFamily(
                "replayable_outbox_published",
                "Outbox events ever published.",
            ),
            outbox_dead=CounterMetricFamily(
                "replayable_outbox_dead_lettered",
                "Outbox events ever dead-lettered, requeued ones included.",
            ),
        )

    def all(self) -> list[Metric]:
        return [
            self.items,
            self.open,
            self.created,
            self.calls,
            self.retries,
            self.tokens,
            self.cost,
            self.unpriced,
            self.latency,
            self.outbox,
            self.outbox_age,
            self.outbox_published,
            self.outbox_dead,
        ]


def _sample_name(family: Metric) -> str:
    return f"{family.name}_total" if family.type == "counter" else family.name


METRIC_NAMES: frozenset[str] = INVARIANT_METRIC_NAMES | frozenset(
    name
    for family in _Families.empty().all()
    for name in (
        [f"{family.name}_bucket", f"{family.name}_sum", f"{family.name}_count"]
        if family.type == "histogram"
        else [_sample_name(family)]
    )
)
"""The sample names a scrape can hold, as PromQL sees them (the alert rules' vocabulary)."""


class LedgerCollector:
    """A prometheus_client collector over one :class:`LedgerSnapshot` read per collect."""

    def __init__(self, read: Callable[[], LedgerSnapshot]) -> None:
        self._read = read

    def describe(self) -> Iterable[Metric]:
        # Registering must not read the database: describe with empty families.
        return _Families.empty().all()

    def collect(self) -> Iterator[Metric]:
        snapshot = self._read()
        families = _Families.empty()

        items: dict[tuple[str, str], int] = defaultdict(int)
        for row in snapshot.items:
            items[(row["stage"], row["status"])] += int(row["n"])
        # Every stage and status, zeros included, so that a series never vanishes.
        for stage in stage_order(stage for stage, _ in items):
            for status in ITEM_STATUSES:
                families.items.add_metric([stage, status], items.get((stage, status), 0))

        letters = {row["stage"]: row for row in snapshot.dead_letters}
        for stage in stage_order(letters):
            row = letters.get(stage, {})
            families.open.add_metric([stage], int(row.get("open", 0)))
            families.created.add_metric([stage], int(row.get("created", 0)))

        calls: dict[tuple[str, str], int] = defaultdict(int)
        per_stage: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        by_bucket: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        for row in snapshot.model_calls:
            stage = row["stage"]
            calls[(stage, row["status"])] += int(row["calls"])
            totals = per_stage[stage]
            totals["retries"] += int(row["retries"])
            totals["tokens"] += int(row["tokens"])
            totals["latency_ms"] += int(row["latency_ms"])
            totals["count"] += int(row["calls"])
            by_bucket[stage][int(row["le_ms"])] += int(row["calls"])
        for (stage, outcome), n in sorted(calls.items()):
            families.calls.add_metric([stage, outcome], n)
        for stage in sorted(per_stage):
            totals = per_stage[stage]
            families.retries.add_metric([stage], totals["retries"])
            families.tokens.add_metric([stage], totals["tokens"])
            families.latency.add_metric(
                [stage],
                buckets=_cumulative(by_bucket[stage], totals["count"]),
                sum_value=totals["latency_ms"] / 1000,
            )

        for row in snapshot.model_costs:
            families.cost.add_metric([row["model"], row["mode"]], float(row["cost_usd"]))
            families.unpriced.add_metric([row["model"], row["mode"]], int(row["unpriced_calls"]))

        outbox = {row["status"]: row for row in snapshot.outbox}
        for status in OUTBOX_STATUSES:
            families.outbox.add_metric([status], int(outbox.get(status, {}).get("n", 0)))
        families.outbox_age.add_metric([], snapshot.oldest_pending_age_s)
        families.outbox_published.add_metric([], int(outbox.get("published", {}).get("entered", 0)))
        families.outbox_dead.add_metric([], int(outbox.get("dead", {}).get("entered", 0)))
        return iter(families.all())


def _cumulative(counts: dict[int, int], total: int) -> list[tuple[str, float]]:
    """Histogram buckets as Prometheus wants them: cumulative, in seconds, ending at +Inf."""
    buckets: list[tuple[str, float]] = []
    running = 0
    for bound in LATENCY_BOUNDS_MS:
        running += counts.get(bound, 0)
        buckets.append((str(bound / 1000), running))  # Go-style: 0.005, 1.0
    buckets.append(("+Inf", total))
    return buckets


def render(conn: db.Connection, accept: str | None = None) -> tuple[bytes, str]:
    """One scrape: the exposition text (format chosen by ``accept``) and its content type."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LedgerCollector(lambda: read_snapshot(conn)))
    registry.register(InvariantCollector(lambda: read_counts(conn)))
    encode, content_type = choose_encoder(accept or "")
    return encode(registry), content_type


# ---- the route -----------------------------------------------------------------------------


def _open(stack: ExitStack, state: Any) -> db.Connection:
    """A read-only connection for one scrape, closed or given back when ``stack`` ends."""
    pool = getattr(state, "pool", None)
    if pool is not None:  # the app's shared connections, when it keeps a pool
        conn: db.Connection = stack.enter_context(pool.connection(readonly=True))
        return conn
    provider: Callable[[], str] = state.dsn_provider
    conn = db.connect(provider())
    stack.callback(conn.close)
    conn.set_session(readonly=True, autocommit=True)
    return conn


def _scrape(request: Request) -> tuple[bytes, str]:
    with ExitStack() as stack:
        try:
            conn = _open(stack, request.app.state)
        # A missing Airflow connection or an unreachable server: Prometheus records the
        # failed scrape (up == 0), the details go to the API server's log.
        except Exception as err:
            log.warning("replayable metrics cannot reach the database: %s", err)
            raise HTTPException(
                HTTPStatus.SERVICE_UNAVAILABLE, "The replayable database is unavailable."
            ) from err
        return render(conn, request.headers.get("accept"))


async def metrics_endpoint(request: Request) -> Response:
    """``GET /metrics``: Prometheus exposition text of the ledger's counters."""
    await authorize(request)
    body, content_type = await run_in_threadpool(_scrape, request)
    return Response(body, headers={"Content-Type": content_type, "Cache-Control": "no-store"})


router = APIRouter()
router.add_route("/metrics", metrics_endpoint, methods=["GET"], include_in_schema=False)
