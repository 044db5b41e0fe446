"""The pipeline's non-stage steps: discover documents, plan batches, report a run."""

from __future__ import annotations

import glob
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from replayable.db import Connection, execute, execute_values, fetch_all
from replayable.keys import sha256_file
from replayable.settings import STAGES, PipelineSettings


def find_pdfs(source: str) -> list[Path]:
    """List the PDFs under a folder (recursively) or matching a glob, in a stable order."""
    path = Path(source).expanduser()
    if path.is_dir():
        found = [p for p in path.rglob("*") if p.is_file() and p.suffix.lower() == ".pdf"]
    elif any(ch in source for ch in "*?["):
        found = [Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file()]
    elif path.is_file():
        found = [path]
    else:
        raise FileNotFoundError(f"source: {source!r} is neither a folder, a file nor a glob")
    return sorted(p.resolve() for p in found)


def discover(conn: Connection, source: str) -> list[str]:
    """Hash every PDF of ``source``, record new documents, and return their ids, sorted.

    The same bytes under two names are one document (its first name is kept).
    """
    rows: dict[str, tuple[str, str, int]] = {}
    for path in find_pdfs(source):
        doc_id = sha256_file(path)
        rows.setdefault(doc_id, (doc_id, str(path), path.stat().st_size))
    execute_values(conn, "upsert_documents", list(rows.values()))
    conn.commit()
    return sorted(rows)


def rerun_params(rerun: Mapping[str, Any]) -> dict[str, Any]:
    """The values a ``rerun`` conf binds to ``select_rerun_docs.sql`` (None: any)."""
    return {
        "stage": rerun["stage"],
        "statuses": rerun.get("status"),
        "error_classes": rerun.get("error_class"),
        "code_version_lt": rerun.get("code_version_lt"),
        "since": rerun.get("since"),
        "doc_ids": rerun.get("doc_ids"),
    }


def select_documents(conn: Connection, settings: PipelineSettings, *, by: str) -> list[str]:
    """The documents of a partial re-run or a redrive, chosen by a bound query over the ledger."""
    if settings.rerun:
        found = fetch_all(conn, "select_rerun_docs", rerun_params(settings.rerun))
    elif settings.redrive:
        redrive = settings.redrive
        found = fetch_all(
            conn,
            "redrive_dead_letters",
            {
                "stage": redrive["stage"],
                "error_classes": redrive.get("error_class"),
                "ids": redrive.get("ids"),
                "by": redrive.get("by") or by,
                "reason": redrive["reason"],
            },
        )
    else:
        raise ValueError("select_documents needs a rerun or a redrive")
    conn.commit()
    return [row["doc_id"] for row in found]


def plan_batches(
    doc_ids: Sequence[str], batch_size: int, max_map_length: int = 1024
) -> list[dict[str, Any]]:
    """Split ids into batches of ``batch_size``, growing the size to stay within max_map_length."""
    if not doc_ids:
        return []
    size = max(batch_size, math.ceil(len(doc_ids) / max_map_length))
    batches = []
    for index, start in enumerate(range(0, len(doc_ids), size)):
        ids = list(doc_ids[start : start + size])
        label = f"batch {index}: docs {start}-{start + len(ids) - 1}"
        batches.append({"index": index, "label": label, "doc_ids": ids})
    return batches


def build_report(
    conn: Connection, *, dag_id: str, run_id: str, doc_ids: Sequence[str]
) -> dict[str, Any]:
    """Summarise a run: per stage, documents by status (and error class); model calls made."""
    stages: dict[str, dict[str, Any]] = {
        stage: {"done": 0, "failed": 0, "dead": 0, "running": 0, "pending": 0, "errors": {}}
        for stage in STAGES
    }
    for row in fetch_all(conn, "report_stage_status", {"doc_ids": list(doc_ids)}):
        entry = stages.setdefault(row["stage"], {"errors": {}})
        entry[row["status"]] = entry.get(row["status"], 0) + row["n"]
        if row["error_class"] and row["status"] != "done":
            errors = entry["errors"]
            errors[row["error_class"]] = errors.get(row["error_class"], 0) + row["n"]
    for entry in stages.values():
        entry["not_entered"] = len(doc_ids) - sum(
            entry.get(s, 0) for s in ("done", "failed", "dead", "running", "pending")
        )
    calls = fetch_all(conn, "report_model_calls", {"run_id": run_id})[0]
    dead = fetch_all(conn, "report_dead_letters", {"run_id": run_id})[0]
    report = {
        "dag_id": dag_id,
        "run_id": run_id,
        "documents": len(doc_ids),
        "stages": stages,
        "model_calls": {k: int(v) for k, v in calls.items()},
        "dead_letters_opened": int(dead["opened"]),
    }
    execute(conn, "save_report", {"dag_id": dag_id, "run_id": run_id, "report": json.dumps(report)})
    conn.commit()
    return report


def format_report(report: dict[str, Any]) -> str:
    """Render a report as a small table a person can read at a glance."""
    lines = [
        f"run {report['run_id']}: {report['documents']} documents",
        f"{'stage':<8} {'done':>6} {'failed':>7} {'dead':>6} {'other':>6}  errors",
    ]
    order = {stage: n for n, stage in enumerate(STAGES)}
    for stage, entry in sorted(report["stages"].items(), key=lambda kv: order.get(kv[0], 99)):
        other = entry.get("running", 0) + entry.get("pending", 0) + entry.get("not_entered", 0)
        errors = ", ".join(f"{k}={v}" for k, v in sorted(entry.get("errors", {}).items()))
        lines.append(
            f"{stage:<8} {entry.get('done', 0):>6} {entry.get('failed', 0):>7} "
            f"{entry.get('dead', 0):>6} {other:>6}  {errors or '-'}"
        )
    calls = report["model_calls"]
    lines.append(
        f"model calls: {calls['calls']} ({calls['ok']} ok, {calls['inputs']} inputs embedded, "
        f"{calls['tokens']} tokens); dead letters opened: {report['dead_letters_opened']}"
    )
    return "\n".join(lines)
