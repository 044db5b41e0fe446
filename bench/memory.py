"""B8, memory: a stage task's peak RSS does not grow with the size of its documents.

The extract stage runs, as a task would, in its own process with its guarded workers, over
50 documents of 20 MB and then over 50 of 100 KB (valid PDFs whose bulk the parser skips; the
20 MB ones are files that fit max_bytes). Every 20 ms the resident memory of the task and all
its workers is summed; the figure is the peak over the big documents against the small ones.
Target: at most 1.5 x the small peak plus one document's working set, the memory that
extracting one 20 MB document in a fresh process adds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from harness import ROOT, Row, Samples, Target, corpus, services, truncate

from replayable.keys import sha256_file

DOCUMENTS = 50
BIG = 20 * 2**20
SMALL = 100 * 2**10

# Runs one extract batch the way IdempotentStageOperator does, in a process of its own.
_TASK = """
import json, sys
from replayable import db, guards
from replayable.ledger import RunContext
from replayable.runner import Limits, run_batch
from replayable.stages.extract.spec import ExtractSpec
from replayable.stages.lineage import default_workers
dsn, ids = sys.argv[1], json.loads(sys.argv[2])
with guards.GuardedPool(timeout_s=120, memory_mb=1024,
                        workers=default_workers(len(ids))) as pool:
    result = run_batch(
        ExtractSpec(pool=pool, max_bytes=2**30),
        ids,
        connect=lambda: db.Database(dsn),
        ctx=RunContext(owner="bench-memory", run_id="memory"),
        limits=Limits(lease_s=600),
    )
print(json.dumps({"done": len(result.done), "failed": len(result.failed)}))
"""

# The memory one document needs: the peak RSS while extracting it, less the RSS before.
_ONE = """
import psutil, resource, sys
from replayable.stages.extract.pdf import extract_file
import pypdf  # noqa: F401 - loaded before the baseline, as in a warm worker
before = psutil.Process().memory_info().rss
extract_file(sys.argv[1])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before)
"""


def _corpus(size: int, n: int) -> Path:
    folder = ROOT / ".local" / "bench-corpus" / f"memory-{size}-{n}"
    done = folder / ".complete"
    if not done.exists():
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            text = f"Memory benchmark document {i} of {n}: a valid PDF of {size} bytes."
            (folder / f"doc-{i:03}.pdf").write_bytes(corpus().oversize_pdf_bytes(size, text))
        done.write_text("ok\n")
    return folder


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": str(ROOT / "include")}


def _peak_rss(dsn: str, ids: list[str]) -> tuple[int, dict[str, Any]]:
    """Run the task process; return the peak summed RSS of it and its workers, and its output."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _TASK, dsn, json.dumps(ids)],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    peak = 0
    per_process: dict[int, int] = {}
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        root = psutil.Process(proc.pid)
        while not stop.is_set():
            try:
                family = [root, *root.children(recursive=True)]
                now = {p.pid: p.memory_info().rss for p in family if p.is_running()}
                for pid, rss in now.items():
                    per_process[pid] = max(per_process.get(pid, 0), rss)
                peak = max(peak, sum(now.values()))
            except psutil.Error:
                pass
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = proc.communicate(timeout=1800)
    stop.set()
    sampler.join()
    result = json.loads(out.strip().splitlines()[-1])
    result["per_process_mib"] = sorted(round(v / 2**20) for v in per_process.values())
    return peak, result


def _record(dsn: str, folder: Path) -> list[str]:
    from replayable import db

    rows = [(sha256_file(p), str(p), p.stat().st_size) for p in sorted(folder.glob("*.pdf"))]
    conn = db.connect(dsn)
    try:
        db.execute_values(conn, "plan/upsert_documents", rows)
        conn.commit()
    finally:
        conn.close()
    return [row[0] for row in rows]


def run(
    documents: int = DOCUMENTS, big: int = BIG, small: int = SMALL
) -> tuple[list[Row], dict[str, Any]]:
    big_folder, small_folder = _corpus(big, documents), _corpus(small, documents)
    one = subprocess.run(
        [sys.executable, "-c", _ONE, str(next(big_folder.glob("*.pdf")))],
        env=_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    working_set = int(one.stdout.strip())
    peaks: dict[str, int] = {}
    outcome: dict[str, Any] = {}
    with services() as svc:
        for name, folder in (("small", small_folder), ("big", big_folder)):
            truncate(
                svc.dsn,
                ("stage_counts", "stage_runs", "dead_letters", "dead_letter_counts", "extractions"),
            )
            ids = _record(svc.dsn, folder)
            peaks[name], outcome[name] = _peak_rss(svc.dsn, ids)
            if outcome[name]["done"] != documents:
                raise RuntimeError(f"memory: {name} batch ended {outcome[name]}")
    allowed = 1.5 * peaks["small"] + working_set
    mib = 2**20
    rows = [
        Row(
            "B8",
            f"peak RSS of a stage task: {documents} x {big // mib} MB / {documents} x "
            f"{small // 1024} KB",
            f"{small // 1024} KB documents",
            Samples((peaks["small"] / mib,), unit="MiB"),
            f"{big // mib} MB documents",
            Samples((peaks["big"] / mib,), unit="MiB"),
            Target(
                f"≤ 1.5 + {working_set / peaks['small']:.2f} (one document)",
                at_most=allowed / peaks["small"],
            ),
            notes=[
                f"one {big // mib} MB document's working set: {working_set / mib:.0f} MiB; "
                f"allowed peak {allowed / mib:.0f} MiB"
            ],
        )
    ]
    details = {
        "documents": documents,
        "peak_mib": {k: round(v / mib, 1) for k, v in peaks.items()},
        "one_document_working_set_mib": round(working_set / mib, 1),
        "outcome": outcome,
        "notes": [
            f"peak {peaks['big'] / mib:.0f} MiB over {big // mib} MB documents, "
            f"{peaks['small'] / mib:.0f} MiB over {small // 1024} KB ones; one document "
            f"adds {working_set / mib:.0f} MiB"
        ],
    }
    return rows, details
