"""Replayable's benchmarks: every figure is a ratio against a baseline from the same run.

``make bench`` runs this file at full size and writes ``bench/results/latest.json`` (each
figure with its ``id``, ``value``, ``target`` and ``pass``), ``latest.md`` (the table the
README shows) and ``latest.png`` (a chart of each figure against its target). Each benchmark
runs ``--repeat`` times, each time from scratch (its own services, Airflow, baseline): a
figure's value is the median over those runs, its ``pass`` the median's, and ``min``,
``max`` and ``runs`` say how far apart the runs landed. ``make
bench-smoke`` runs every benchmark at a reduced size, checks that it runs and that its
counts are right (calls, round trips, 429s), never its times, and writes
``.local/bench-smoke.json``. Each benchmark starts what it needs under a temporary folder
and stops it before the next one begins. The exit status is 1 when a checked target is
missed, naming it. See bench/README.md.
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

import bookkeeping
import check_before_call
import engines
import guard_overhead
import invariant_check
import ledger_reads
import memory
import mirror_plan
import retrieval
import saturation
import scheduler
import search_index
import token_budget
from harness import Row, across_runs

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SMOKE_RESULTS = ROOT / ".local" / "bench-smoke.json"
# Separate runs of each benchmark in a full run (a smoke run does one): enough for a median
# that one slow run cannot move, and a range that shows how far the runs land apart.
REPEAT = 3

Benchmark = Callable[..., tuple[list[Row], dict[str, Any]]]
# name: (function, full-size arguments, smoke-size arguments)
BENCHMARKS: dict[str, tuple[Benchmark, dict[str, Any], dict[str, Any]]] = {
    "scheduler": (
        scheduler.run,
        {},
        {
            "documents": 24,
            "per_doc_documents": 6,
            "scale_documents": 48,
            "poll_every_s": 0.05,
            "first_runs": 1,
            "reruns": 1,
            "realworld_documents": 0,
        },
    ),
    "check-before-call": (check_before_call.run, {}, {"repeats": 1, "docs": 24}),
    "bookkeeping": (bookkeeping.run, {}, {"repeats": 1, "batch": 50}),
    "saturation": (saturation.run, {}, {"repeats": 1, "docs": 40}),
    "guard-overhead": (guard_overhead.run, {}, {"repeats": 1, "documents": 16}),
    "ledger-reads": (ledger_reads.run, {}, {"repeats": 1, "documents": 20_000, "letters": 1000}),
    "memory": (memory.run, {}, {"documents": 4, "big": 2 * 2**20, "small": 20 * 2**10}),
    "engines": (engines.run, {}, {"repeats": 1, "samples": 3}),
    "tokens": (token_budget.run, {}, {"repeats": 1, "docs": 30}),
    "retrieval": (retrieval.run, {}, {"documents": 4, "per_document": 5}),
    "search-index": (search_index.run, {}, {"chunks": 5000, "queries": 10}),
    "invariant-check": (invariant_check.run, {}, {"repeats": 1, "documents": 20_000}),
    "mirror-plan": (mirror_plan.run, {}, {"files": 2000, "changes": 20, "repeats": 2}),
}


def _ratio(row: Row) -> str:
    ratio = row.ratio
    if ratio is None:
        return "—"
    return f"{ratio:.3f}" if ratio < 0.1 else f"{ratio:.2f}"


def _value(row: Row, value: float | None = None) -> str:
    """The row's figure (or ``value``, one of its runs') as the table shows it."""
    value = row.value if value is None else value
    if value is None:
        return "—"
    if row.target_on == "measured" and row.measured.unit == "s":
        return f"{value * 1000:.1f} ms"
    return f"{value:.3f}" if abs(value) < 0.1 else f"{value:.2f}"


def _range(row: Row) -> str:
    """The lowest and highest of the row's runs, or — for a single run."""
    values = row.values
    if len(values) < 2:
        return "—"
    return f"{_value(row, min(values))} to {_value(row, max(values))}"


COUNTS = frozenset({"calls", "round trips", "429s", "stmts", "violations", "rows"})


def _checked(row: Row, smoke: bool) -> bool:
    """Whether the row's target decides the exit status: in a smoke run, only counts do."""
    return row.target is not None and (not smoke or row.measured.unit in COUNTS)


def _verdict(row: Row, smoke: bool) -> str:
    if row.passed is None:
        return "info"
    if not _checked(row, smoke):
        return "(not checked in a smoke run)"
    return "pass" if row.passed else "FAIL"


def _print_section(name: str, rows: list[Row], details: dict[str, Any], smoke: bool) -> None:
    print(f"\n== {name} ==")
    for note in details.get("notes", []):
        print(f"  {note}")
    for row in rows:
        print(f"  {row.fig}  {row.benchmark}")
        print(f"    baseline, {row.baseline_label}: {row.baseline.describe()}")
        print(f"    measured, {row.measured_label}: {row.measured.describe()}")
        target = f", target {row.target.text} ({row.target_on})" if row.target else ""
        runs = f" (median of {len(row.values)} runs, {_range(row)})" if len(row.values) > 1 else ""
        print(f"    value {_value(row)}{runs}{target}: {_verdict(row, smoke)}")
        for note in row.notes:
            print(f"    {note}")
    sys.stdout.flush()


def _table(rows: list[Row], smoke: bool) -> list[str]:
    header = (
        *("id", "figure", "baseline", "measured", "median", "min to max", "runs", "target"),
        "result",
    )
    lines = [
        (
            row.fig,
            row.benchmark,
            f"{row.baseline_label}: {row.baseline.short()}",
            f"{row.measured_label}: {row.measured.short()}",
            _value(row),
            _range(row),
            str(len(row.values)),
            "—" if row.target is None else row.target.text,
            _verdict(row, smoke),
        )
        for row in rows
    ]
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cell.replace("|", "/") for cell in line) + " |" for line in lines]
    return out


def _share(row: Row, value: float) -> float:
    """How much of its target ``value`` uses: under 1 passes (over, for ≥, is turned round)."""
    assert row.target is not None
    bound = row.target.at_most or row.target.at_least or row.target.below or 1.0
    if row.target.at_least is not None:
        return bound / value if value else float("inf")
    return value / bound if bound else 0.0


def _chart(rows: list[Row], path: Path) -> None:
    """Each targeted figure as a bar of its median / target, with a line from its lowest to
    its highest run: a bar under 1 passes (for ≥ targets, target / value)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [
        r for r in rows if r.target is not None and r.value is not None and r.fig[1:].isdigit()
    ]
    cap = 3.0
    names, shares, lows, highs, colours = [], [], [], [], []
    for row in shown:
        assert row.target is not None and row.value is not None
        share = min(_share(row, row.value), cap)
        ends = sorted(min(_share(row, v), cap) for v in (min(row.values), max(row.values)))
        names.append(f"{row.fig}\n{row.target.text}")
        shares.append(share)
        lows.append(share - ends[0])
        highs.append(ends[1] - share)
        colours.append("#3b8c5a" if row.passed else "#c0392b")
    fig, ax = plt.subplots(figsize=(9, 4.2), dpi=110)
    ax.bar(names, shares, color=colours)
    ax.errorbar(
        range(len(shares)), shares, yerr=[lows, highs], fmt="none", ecolor="#222", capsize=3
    )
    ax.axhline(1.0, color="#333", linewidth=1, linestyle="--")
    ax.set_ylabel("share of the target used (≤ 1 passes)")
    ax.set_title("Replayable benchmarks: each figure's median against its target, runs' range")
    for i, share in enumerate(shares):
        ax.text(i + 0.25, share + 0.03, f"{share:.2f}", ha="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _merged(
    path: Path, rows: list[Row], details: dict[str, Any]
) -> tuple[list[Row], dict[str, Any], dict[str, Any]]:
    """This run's figures and details with those of ``path`` it did not measure again, and
    what was kept from which run (its time, the figures, the benchmarks)."""
    if not path.exists():
        return rows, details, {}
    earlier = json.loads(path.read_text())
    measured = {row.fig for row in rows}
    kept_rows = [
        Row.from_json(figure) for figure in earlier["figures"] if figure["id"] not in measured
    ]
    kept_details = {name: d for name, d in earlier["details"].items() if name not in details}
    kept = {
        "finished_at": earlier.get("finished_at"),
        "figures": [row.fig for row in kept_rows],
        "benchmarks": sorted(kept_details),
    }
    if "kept_from" in earlier:
        kept["kept_from"] = earlier["kept_from"]
    return [*kept_rows, *rows], {**kept_details, **details}, kept


def _repeated(name: str, repeat: int, smoke: bool) -> tuple[list[Row], dict[str, Any]]:
    """``repeat`` separate runs of one benchmark, each starting what it needs afresh; its
    figures across them, and the last run's details with every run's time."""
    fn, full, reduced = BENCHMARKS[name]
    runs: list[list[Row]] = []
    seconds: list[float] = []
    details: dict[str, Any] = {}
    for n in range(repeat):
        started = time.perf_counter()
        rows, details = fn(**(reduced if smoke else full))
        seconds.append(round(time.perf_counter() - started, 1))
        details["seconds"] = seconds[-1]
        title = f"{name} (run {n + 1} of {repeat})" if repeat > 1 else name
        _print_section(title, rows, details, smoke)
        runs.append(rows)
    if repeat > 1:
        details = {**details, "runs": repeat, "seconds": round(sum(seconds), 1)}
        details["seconds_per_run"] = seconds
    return across_runs(runs), details


def measured_in(kept: dict[str, Any]) -> dict[str, list[str]]:
    """The kept figures by the finishing time of the run that measured them: a figure one
    merge kept from a run that had itself kept it was measured further back."""
    runs: dict[str, list[str]] = {}
    for fig in kept.get("figures", []):
        level = kept
        while fig in level.get("kept_from", {}).get("figures", []):
            level = level["kept_from"]
        runs.setdefault(str(level["finished_at"]), []).append(fig)
    return dict(sorted(runs.items()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only",
        action="append",
        choices=list(BENCHMARKS),
        help="run only this benchmark (repeatable); default: all",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="reduced sizes; check counts, never times"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        metavar="N",
        help=f"separate runs of each benchmark, each from scratch; a figure is the median of "
        f"its runs (default: {REPEAT}, or 1 with --smoke)",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=RESULTS,
        help="folder for latest.json, .md and .png (default: %(default)s); a partial run "
        "(--only) can write elsewhere and leave the full results as they are",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the figures of the results folder's latest.json that this run does not "
        "measure again (with --only): the file then says which figures came from which run",
    )
    args = parser.parse_args(argv)
    if args.merge and (args.smoke or not args.only):
        parser.error("--merge adds the figures of an --only run to the full results")
    repeat = args.repeat or (1 if args.smoke else REPEAT)
    if repeat < 1:
        parser.error("--repeat must be at least 1")
    # The benchmarks TRUNCATE tables in the Postgres that devenv starts for them; an
    # inherited REPLAYABLE_DATABASE_URL would point that at someone's real database.
    os.environ.pop("REPLAYABLE_DATABASE_URL", None)

    started = time.perf_counter()
    rows: list[Row] = []
    details: dict[str, Any] = {}
    for name in args.only or list(BENCHMARKS):
        section_rows, details[name] = _repeated(name, repeat, args.smoke)
        if repeat > 1:
            _print_section(f"{name}: {repeat} runs", section_rows, {}, args.smoke)
        rows += section_rows
    duration = time.perf_counter() - started
    # The exit status is this run's; a merged file's "passed" covers the figures kept too.
    missed = [row for row in rows if _checked(row, args.smoke) and row.passed is False]
    kept: dict[str, Any] = {}
    if args.merge:
        rows, details, kept = _merged(args.results.resolve() / "latest.json", rows, details)

    table = _table(rows, args.smoke)
    print("\n" + "\n".join(table))
    print(f"\n{len(rows)} figures in {duration:.0f} s on {os.cpu_count()} CPU(s)")
    result = {
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "duration_s": round(duration, 1),
        "smoke": args.smoke,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "passed": not any(_checked(row, args.smoke) and row.passed is False for row in rows),
        "figures": [row.to_json() for row in rows],
        "details": details,
    }
    if kept:
        result["kept_from"] = kept
    text = json.dumps(result, indent=2, ensure_ascii=False, default=str) + "\n"
    if args.smoke:
        SMOKE_RESULTS.parent.mkdir(exist_ok=True)
        SMOKE_RESULTS.write_text(text)
        print(f"results written to {SMOKE_RESULTS.relative_to(ROOT)}")
    else:
        results = args.results.resolve()
        results.mkdir(parents=True, exist_ok=True)
        (results / "latest.json").write_text(text)
        when = result["finished_at"]
        header = [
            f"# Benchmark results ({when}, {os.cpu_count()} CPUs, {duration / 60:.0f} min)",
            "",
            "Produced by `make bench`; each value is a ratio against a baseline measured in",
            "the same run, or a count (see bench/README.md).",
            "",
        ]
        if kept:
            header[-1:] = [
                *(
                    f"Measured in the run that finished {when}: {', '.join(figs)}."
                    for when, figs in measured_in(kept).items()
                ),
                "The others were measured in this one (`--merge`).",
                "",
            ]
        (results / "latest.md").write_text("\n".join([*header, *table]) + "\n")
        _chart(rows, results / "latest.png")
        print(f"results written to {results / 'latest.json'} (+ .md, .png)")
    for row in missed:
        assert row.target is not None
        print(
            f"bench: target missed: {row.fig} {row.benchmark}: {_value(row)}, "
            f"target {row.target.text}",
            file=sys.stderr,
        )
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
