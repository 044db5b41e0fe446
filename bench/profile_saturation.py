"""Where B5's time per request goes: the saturation run with every step timed.

``PYTHONPATH=include:. .venv/bin/python bench/profile_saturation.py [--docs N]``

Runs :func:`saturation.run` once (one repeat) with timestamps around each step a request
takes: its transaction's checks, the wait for this task's turn and for a budget slot, the
HTTP call, the slot's release, storing the vectors and the call records, the commit. Then
prints, per request, the mean of each step, and how the provider's C slots were used over
the run: busy (a request on the wire), idle before the first request (plan, claim, the
first check), during the first request sent alone, between requests, and in the tail.
Instrumentation costs a little itself; read the shares, not the absolute milliseconds.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import saturation

import replayable.budget as budget_module
import replayable.models.http as http_module
import replayable.stages.embed.spec as embed_spec

_spans: list[tuple[str, int, float, float]] = []  # (step, thread id, start, end)
_lock = threading.Lock()
_baselines: dict[str, float] = {}  # the plain client's seconds per request, by what it sent


def _record(step: str, started: float) -> None:
    with _lock:
        _spans.append((step, threading.get_ident(), started, time.perf_counter()))


def _timed(step: str | Callable[..., str], fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _record(step(*args, **kwargs) if callable(step) else step, started)

    return wrapper


def _timed_cm(enter: str, body: str, leave: str, cm: Callable[..., Any]) -> Callable[..., Any]:
    """A context manager timed in three: entering, its block, leaving."""

    @functools.wraps(cm)
    @contextlib.contextmanager
    def wrapper(*args: Any, **kwargs: Any) -> Iterator[Any]:
        started = time.perf_counter()
        manager = cm(*args, **kwargs)
        value = manager.__enter__()
        _record(enter, started)
        inside = time.perf_counter()
        try:
            yield value
        except BaseException as error:
            _record(body, inside)
            left = time.perf_counter()
            if not manager.__exit__(type(error), error, error.__traceback__):
                raise
            _record(leave, left)
        else:
            _record(body, inside)
            left = time.perf_counter()
            manager.__exit__(None, None, None)
            _record(leave, left)

    return wrapper


def _install() -> None:
    batch = embed_spec._EmbedBatch
    batch._send = _timed("request: whole (transaction + commit)", batch._send)
    batch._send_in = _timed("request: in its transaction", batch._send_in)
    batch._turn = _timed_cm("wait: this task's turn", "turn held", "turn: leave", batch._turn)
    budget_module.RequestBudget.slot = _timed_cm(
        "budget: take slot", "slot held", "budget: release slot", budget_module.RequestBudget.slot
    )
    http_module.HttpModelClient._post = _timed(
        "client: HTTP + parse", http_module.HttpModelClient._post
    )
    http_module.parse_json = _timed("client: parse JSON", http_module.parse_json)
    embed_spec.fetch_all = _timed(
        lambda conn, query, params=None: f"sql: {query}", embed_spec.fetch_all
    )
    embed_spec.store_vectors = _timed("store: vectors", embed_spec.store_vectors)
    embed_spec.record_calls = _timed("store: call records", embed_spec.record_calls)
    embed_spec.EmbedSpec.plan = _timed("run: plan", embed_spec.EmbedSpec.plan)
    embed_spec.EmbedSpec.process = _timed("run: process", embed_spec.EmbedSpec.process)
    saturation.run_batch = _timed("run: run_batch", saturation.run_batch)
    raw = saturation._raw

    def compared(base_url: str, inputs: list[list[str]], *, run: int = 0) -> float:
        # The plain client once with a tiny input list (what the server's latency alone
        # costs), then with the pipeline's own texts (latency plus the server's work on them).
        tiny = [["a plain request"] * saturation.PER_CALL] * len(inputs)
        _baselines["tiny inputs"] = raw(base_url, tiny, run=run + 1000) / len(inputs)
        seconds = raw(base_url, inputs, run=run)
        _baselines["the pipeline's inputs"] = seconds / len(inputs)
        return seconds

    saturation._raw = compared


def _report() -> None:
    by_step: dict[str, list[float]] = defaultdict(list)
    for step, _, start, end in _spans:
        by_step[step].append(end - start)
    requests = len(by_step["client: HTTP + parse"])
    print(f"\n{requests} HTTP requests")
    print(f"{'step':48} {'count':>6} {'mean ms':>8} {'p50 ms':>8} {'max ms':>8} {'total s':>8}")
    for step in sorted(by_step):
        values = by_step[step]
        print(
            f"{step:48} {len(values):6d} {1000 * statistics.mean(values):8.2f} "
            f"{1000 * statistics.median(values):8.2f} {1000 * max(values):8.2f} "
            f"{sum(values):8.2f}"
        )
    for sent, seconds in _baselines.items():
        print(f"plain client, C={saturation.C}, {sent}: {seconds * 1000:.2f} ms/request")
    _occupancy()


def _occupancy() -> None:
    """How the C slots were used over the (last) run_batch, in slot-seconds."""
    runs = [(s, e) for step, _, s, e in _spans if step == "run: run_batch"]
    run_start, run_end = runs[-1]
    http = sorted(
        (s, e) for step, _, s, e in _spans if step == "client: HTTP + parse" and s >= run_start
    )
    c = saturation.C
    wall = run_end - run_start
    busy = sum(e - s for s, e in http)
    first_start, first_end = http[0]
    second_start = http[1][0] if len(http) > 1 else first_end
    last_end = max(e for _, e in http)
    # The tail: from the moment fewer than C requests remain open until the last answer.
    starts = [s for s, _ in http]
    tail_from = sorted(e for _, e in http)[-c] if len(http) >= c else first_start
    tail_from = max(tail_from, max(starts))
    in_tail = sum(max(0.0, e - max(s, tail_from)) for s, e in http)
    before = (first_start - run_start) * c
    alone = (second_start - first_start) * c - (min(first_end, second_start) - first_start)
    after = (run_end - last_end) * c
    tail_idle = (last_end - tail_from) * c - in_tail
    steady = wall * c - busy - before - alone - after - tail_idle
    rows = [
        ("slot-seconds available (wall x C)", wall * c),
        ("busy: a request on the wire (client HTTP + parse)", busy),
        ("idle before the first request (plan, claim, check)", before),
        ("idle while the first request goes alone (slow start)", alone),
        ("idle between requests (steady state)", steady),
        ("idle in the tail (fewer than C left)", tail_idle),
        ("idle after the last answer (store, finish)", after),
    ]
    per_request = wall / len(http) * 1000
    print(f"\nrun_batch {wall:.2f} s, {len(http)} requests, C={c}: {per_request:.2f} ms/request")
    for label, value in rows:
        print(
            f"  {label:56} {value:7.2f} slot-s  {100 * value / (wall * c):5.1f} %  "
            f"{1000 * value / c / len(http):6.2f} ms/request"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=saturation.DOCS)
    args = parser.parse_args()
    _install()
    rows, details = saturation.run(repeats=1, docs=args.docs)
    for row in rows:
        print(f"{row.fig}: {row.value:.3f}  ({row.baseline.short()} / {row.measured.short()})")
    print(details)
    _report()


if __name__ == "__main__":
    main()
