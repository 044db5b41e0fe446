"""Guard overhead: what running each PDF in a killable, memory-capped worker costs.

Baseline: ``extract_file`` called in this process over the 32 sample PDFs. Measured: the
same calls through ``GuardedPool(timeout_s=60, memory_mb=1024)`` with one reused worker
(the shape the extract stage uses), warm and including the worker's start; and, for
contrast, a fresh pool (a new process) per item.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness import BenchError, Row, Samples, Target, timed

from replayable.guards import GuardedPool
from replayable.stages.extract import Extraction, extract_file

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "samples"
TIMEOUT_S = 60.0
MEMORY_MB = 1024
REPEATS = 5
FRESH_REPEATS = 3  # a fresh process per item costs about 10 s per pass on 2 cores
POOL_TARGET = Target("≤ 1.5", at_most=1.5)


def _in_process(paths: list[str]) -> list[Extraction]:
    return [extract_file(p) for p in paths]


def _through(pool: GuardedPool, paths: list[str]) -> list[Extraction]:
    return [pool.run(extract_file, p) for p in paths]


def _fresh_per_item(paths: list[str]) -> list[Extraction]:
    out = []
    for path in paths:
        with GuardedPool(timeout_s=TIMEOUT_S, memory_mb=MEMORY_MB) as pool:
            out.append(pool.run(extract_file, path))
    return out


def run(repeats: int = REPEATS) -> tuple[list[Row], dict[str, Any]]:
    """Extract the sample PDFs in-process, through a reused pool, and a process per item."""
    paths = sorted(str(p) for p in SAMPLES.glob("*.pdf"))
    if not paths:
        raise FileNotFoundError(f"no sample PDFs in {SAMPLES}")
    # Warm the page cache and this process's imports, so the baseline is not charged for them.
    expected = _in_process(paths)
    inproc: list[float] = []
    warm: list[float] = []
    cold: list[float] = []
    fresh: list[float] = []
    for r in range(repeats):
        seconds, got = timed(lambda: _in_process(paths))
        inproc.append(seconds)
        with GuardedPool(timeout_s=TIMEOUT_S, memory_mb=MEMORY_MB) as pool:
            # First pass pays the worker's start and its pypdf import; the second does not.
            seconds, cold_got = timed(lambda: _through(pool, paths))
            cold.append(seconds)
            seconds, warm_got = timed(lambda: _through(pool, paths))
            warm.append(seconds)
        if r < FRESH_REPEATS:
            seconds, fresh_got = timed(lambda: _fresh_per_item(paths))
            fresh.append(seconds)
            if fresh_got != expected:
                raise BenchError("a fresh worker extracted different text than in-process")
        if not got == cold_got == warm_got == expected:
            raise BenchError("the guarded worker extracted different text than in-process")

    base = Samples(tuple(inproc))
    label = f"{len(paths)} PDFs in-process"
    rows = [
        Row(
            "guard: reused pool, warm worker",
            label,
            base,
            "GuardedPool, 1 worker",
            Samples(tuple(warm)),
            POOL_TARGET,
        ),
        Row(
            "guard: reused pool incl. worker start",
            label,
            base,
            "GuardedPool, cold",
            Samples(tuple(cold)),
        ),
        Row(
            "guard: fresh process per item",
            label,
            base,
            "new GuardedPool per item",
            Samples(tuple(fresh)),
        ),
    ]
    per_item_ms = {
        "in_process": 1000 * base.median / len(paths),
        "reused_warm": 1000 * Samples(tuple(warm)).median / len(paths),
        "fresh_per_item": 1000 * Samples(tuple(fresh)).median / len(paths),
    }
    details: dict[str, Any] = {
        "pdfs": len(paths),
        "pages": sum(e.page_count for e in expected),
        "timeout_s": TIMEOUT_S,
        "memory_mb": MEMORY_MB,
        "per_item_ms": per_item_ms,
        "notes": [
            f"{len(paths)} PDFs, {sum(e.page_count for e in expected)} pages; the same text "
            "came back on every path (checked)",
            "per item: "
            + ", ".join(
                f"{name.replace('_', ' ')} {ms:.1f} ms" for name, ms in per_item_ms.items()
            ),
        ],
    }
    return rows, details
