"""Guard overhead (B6): guarded extraction on every core vs bare PDFium on the same cores.

A corpus of ``documents`` PDFs, generated into a temporary folder with the test corpus
generator (``tests/corpus.py``), is extracted on all cores:

- baseline: bare pypdfium2 (open, every page's text, nothing else) in a
  ``concurrent.futures.ProcessPoolExecutor(max_workers=cores)``, no guards;
- measured: the extract stage's ``extract_file`` (PDFium, the default engine, with its
  normalisation and checks) on ``GuardedPool(workers=cores)`` driven by ``cores`` threads,
  a few documents per call (``run_each``, as many as ``items_per_call`` gives a batch of the
  corpus's size), the shape the extract stage uses (each document under its own wall-clock,
  CPU and memory limits, and the parent-death signal, all in force).

Both pools are started and warmed by one untimed pass first, so worker start-up and the
engine import are not what is measured. A repeat is one pass over the corpus on each side, made of
``SLICES`` slices that alternate between the two sides (A B, B A, A B, ...), so that a burst
of other work on the shared machine lands on both sides alike; a side's sample is the sum of
its slices. For contrast (info only), a new ``GuardedPool`` per item, from as many threads,
over the first ``FRESH_DOCUMENTS`` documents, per item against the baseline's time per item.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from harness import BenchError, Row, Samples, Target, corpus, timed

from replayable.guards import GuardedPool
from replayable.stages.extract.pdf import Extraction, extract_file
from replayable.stages.extract.spec import items_per_call

TIMEOUT_S = 60.0
MEMORY_MB = 1024
DOCUMENTS = 200
REPEATS = 5
SLICES = 8
FRESH_DOCUMENTS = 32
FRESH_REPEATS = 3
POOL_TARGET = Target("≤ 1.10", at_most=1.10)

Extractor = Callable[[list[str]], list[Any]]


def _pages(result: Extraction | int) -> int:
    """The page count of a guarded extraction, or of a bare one (its pages already)."""
    return result if isinstance(result, int) else result.page_count


def _bare_pdfium(path: str) -> int:
    """Pages of the PDF at ``path`` read by pypdfium2 alone: every page's text, unchecked."""
    import pypdfium2

    document = pypdfium2.PdfDocument(path)
    try:
        for number in range(len(document)):
            page = document[number]
            textpage = page.get_textpage()
            textpage.get_text_bounded()
            textpage.close()
            page.close()
        return len(document)
    finally:
        document.close()


def _fresh_pool_per_item(path: str) -> Extraction:
    with GuardedPool(timeout_s=TIMEOUT_S, memory_mb=MEMORY_MB) as pool:
        return pool.run(extract_file, path)


def _interleaved_pass(
    sides: tuple[Extractor, Extractor], slices: list[list[str]], expected: list[Any]
) -> tuple[list[float], list[float]]:
    """Extract every slice on both sides, alternating which goes first.

    Each side's results are reduced to page counts, which must be ``expected``. Return each
    side's (wall seconds, CPU seconds of this process), summed over the slices.
    """
    wall = [0.0, 0.0]
    cpu = [0.0, 0.0]
    got: list[list[int]] = [[], []]
    for i, items in enumerate(slices):
        for side in (0, 1) if i % 2 == 0 else (1, 0):
            cpu_started = time.process_time()
            seconds, extracted = timed(partial(sides[side], items))
            cpu[side] += time.process_time() - cpu_started
            wall[side] += seconds
            got[side] += [_pages(e) for e in extracted]
    if not got[0] == got[1] == expected:
        raise BenchError("a timed pass extracted different text")
    return wall, cpu


def run(repeats: int = REPEATS, documents: int = DOCUMENTS) -> tuple[list[Row], dict[str, Any]]:
    """Extract ``documents`` generated PDFs on all cores, unguarded and through GuardedPool."""
    if repeats < 1 or documents < 1:
        raise ValueError(f"repeats and documents must be positive, not {repeats}, {documents}")
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="replayable-bench-guard-") as tmp:
        paths = [str(p) for p in corpus().write_sample_corpus(Path(tmp), n=documents)]
        size = math.ceil(len(paths) / SLICES)
        slices = [paths[i : i + size] for i in range(0, len(paths), size)]
        fresh_paths = paths[:FRESH_DOCUMENTS]
        per_call = items_per_call(len(paths), cores)
        wall: tuple[list[float], list[float]] = ([], [])
        cpu: tuple[list[float], list[float]] = ([], [])
        fresh: list[float] = []
        with (
            GuardedPool(timeout_s=TIMEOUT_S, memory_mb=MEMORY_MB, workers=cores) as pool,
            ThreadPoolExecutor(max_workers=cores, thread_name_prefix="bench-guard") as threads,
        ):

            def guarded(items: list[str]) -> list[Any]:
                calls = [
                    [(path,) for path in items[i : i + per_call]]
                    for i in range(0, len(items), per_call)
                ]
                ended = threads.map(partial(pool.run_each, extract_file), calls)
                return [outcome.result() for outcomes in ended for outcome in outcomes]

            # Warming the guarded pool first starts the forkserver while GuardedPool keeps the
            # bench script out of it, so the baseline's workers below (forked by the same
            # server) start from the same clean interpreter as the guarded ones.
            warm = guarded(paths)
            with ProcessPoolExecutor(
                max_workers=cores, mp_context=multiprocessing.get_context("forkserver")
            ) as executor:

                def unguarded(items: list[str]) -> list[Any]:
                    return list(executor.map(_bare_pdfium, items))

                expected = [_pages(e) for e in unguarded(paths)]
                if [_pages(e) for e in warm] != expected:
                    raise BenchError("the guarded pool read other pages than bare PDFium")
                for r in range(repeats):
                    sides = (unguarded, guarded) if r % 2 == 0 else (guarded, unguarded)
                    seconds, used = _interleaved_pass(sides, slices, expected)
                    if r % 2:
                        seconds, used = seconds[::-1], used[::-1]
                    for side in (0, 1):
                        wall[side].append(seconds[side])
                        cpu[side].append(used[side])
            for _ in range(min(repeats, FRESH_REPEATS)):
                seconds_fresh, got = timed(
                    lambda: list(threads.map(_fresh_pool_per_item, fresh_paths))
                )
                fresh.append(seconds_fresh)
                if got != warm[: len(fresh_paths)]:
                    raise BenchError("a fresh worker extracted different text")

    plain, through_guard = (Samples(tuple(samples)) for samples in wall)
    per_item = {
        "unguarded_pool": Samples(tuple(s / len(paths) for s in wall[0])),
        "guarded_pool": Samples(tuple(s / len(paths) for s in wall[1])),
        "fresh_per_item": Samples(tuple(s / len(fresh_paths) for s in fresh)),
    }
    caller_cpu = {
        "unguarded_pool": Samples(tuple(s / len(paths) for s in cpu[0])),
        "guarded_pool": Samples(tuple(s / len(paths) for s in cpu[1])),
    }
    pages = sum(expected)
    rows = [
        Row(
            "B6",
            "guarded PDFium extraction / bare pypdfium2, all cores, warm",
            f"{len(paths)} PDFs, bare pypdfium2, ProcessPoolExecutor({cores})",
            plain,
            f"GuardedPool({cores} workers), {cores} threads, {per_call} documents per call",
            through_guard,
            POOL_TARGET,
        ),
        Row(
            "B6.fresh",
            "guard: fresh process per item (per item)",
            f"per item, bare pypdfium2, ProcessPoolExecutor({cores})",
            per_item["unguarded_pool"],
            f"per item, new GuardedPool per item, {cores} threads",
            per_item["fresh_per_item"],
        ),
    ]
    paired = [g / p for p, g in zip(wall[0], wall[1], strict=True)]

    def ms(samples: dict[str, Samples]) -> dict[str, float]:
        return {name: round(1000 * s.median, 3) for name, s in samples.items()}

    details: dict[str, Any] = {
        "pdfs": len(paths),
        "documents_per_call": per_call,
        "pages": pages,
        "slices": len(slices),
        "fresh_pdfs": len(fresh_paths),
        "cores": cores,
        "repeats": repeats,
        "timeout_s": TIMEOUT_S,
        "memory_mb": MEMORY_MB,
        "per_item_ms": ms(per_item),
        "caller_cpu_per_item_ms": ms(caller_cpu),
        "paired_ratios": paired,
        "notes": [
            f"{len(paths)} PDFs, {pages} pages on {cores} core(s), {len(slices)} interleaved "
            "slices per repeat; the same text came back on every path (checked)",
            "wall time per item: "
            + ", ".join(f"{k.replace('_', ' ')} {v:.1f} ms" for k, v in ms(per_item).items()),
            "CPU of this (calling) process per item: "
            + ", ".join(f"{k.replace('_', ' ')} {v:.2f} ms" for k, v in ms(caller_cpu).items()),
            "guarded / unguarded, repeat by repeat: " + ", ".join(f"{x:.3f}" for x in paired),
        ],
    }
    return rows, details
