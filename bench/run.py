"""Replayable's benchmarks: every figure is a ratio against a baseline from the same run.

``make bench`` runs this file (``PYTHONPATH=include .venv/bin/python bench/run.py``).
Each benchmark starts what it needs under a temporary folder and stops it before the next
one begins. The results are printed as a table and written to ``.local/bench.json``; the
exit status is 1 when a target is missed, naming it, and 0 otherwise. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import batching
import check_before_call
import guard_overhead
from harness import Row

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / ".local" / "bench.json"

Benchmark = Callable[[], tuple[list[Row], dict[str, Any]]]
BENCHMARKS: dict[str, Benchmark] = {
    "check-before-call": check_before_call.run,
    "guard-overhead": guard_overhead.run,
    "batching": batching.run,
}


def _ratio(row: Row) -> str:
    ratio = row.ratio
    if ratio is None:
        return "—"
    return f"{ratio:.3f}" if ratio < 0.1 else f"{ratio:.2f}"


def _verdict(row: Row) -> str:
    return {None: "info", True: "pass", False: "FAIL"}[row.passed]


def _print_section(name: str, rows: list[Row], details: dict[str, Any]) -> None:
    print(f"\n== {name} ==")
    for note in details.get("notes", []):
        print(f"  {note}")
    for row in rows:
        print(f"  {row.benchmark}")
        print(f"    baseline, {row.baseline_label}: {row.baseline.describe()}")
        print(f"    measured, {row.measured_label}: {row.measured.describe()}")
        target = f", target {row.target.text} ({row.target_on})" if row.target else ""
        print(f"    ratio {_ratio(row)}{target}: {_verdict(row)}")
        for note in row.notes:
            print(f"    {note}")
    sys.stdout.flush()


def _print_table(rows: list[Row]) -> None:
    header = ("benchmark", "baseline", "measured", "ratio", "target", "result")
    lines = [
        (
            row.benchmark,
            f"{row.baseline_label}: {row.baseline.short()}",
            f"{row.measured_label}: {row.measured.short()}",
            _ratio(row),
            "—" if row.target is None else row.target.text,
            _verdict(row),
        )
        for row in rows
    ]
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header))]
    print()
    for i, line in enumerate([header, *lines]):
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        )
        if i == 0:
            print("  ".join("-" * width for width in widths))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only",
        action="append",
        choices=list(BENCHMARKS),
        help="run only this benchmark (repeatable); default: all",
    )
    args = parser.parse_args(argv)
    # The benchmarks TRUNCATE tables in the Postgres that devenv starts for them; an
    # inherited REPLAYABLE_DATABASE_URL would point that at someone's real database.
    os.environ.pop("REPLAYABLE_DATABASE_URL", None)

    started = time.perf_counter()
    rows: list[Row] = []
    details: dict[str, Any] = {}
    for name in args.only or list(BENCHMARKS):
        section_started = time.perf_counter()
        section_rows, details[name] = BENCHMARKS[name]()
        details[name]["seconds"] = round(time.perf_counter() - section_started, 1)
        _print_section(name, section_rows, details[name])
        rows += section_rows
    duration = time.perf_counter() - started

    _print_table(rows)
    print(f"\n{len(rows)} figures in {duration:.0f} s on {os.cpu_count()} CPU(s)")
    missed = [row for row in rows if row.passed is False]
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "duration_s": round(duration, 1),
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "platform": platform.platform(),
                },
                "passed": not missed,
                "rows": [row.to_json() for row in rows],
                "details": details,
            },
            indent=2,
            ensure_ascii=False,
        )
        + "\n"
    )
    print(f"results written to {RESULTS.relative_to(ROOT)}")
    for row in missed:
        assert row.target is not None
        value = _ratio(row) if row.target_on == "ratio" else f"{row.measured.median:g}"
        print(
            f"bench: target missed: {row.benchmark}: {row.target_on} {value}, "
            f"target {row.target.text}",
            file=sys.stderr,
        )
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
