"""A run's report: what each stage did, what it cost, its first dead letters, and whether its
dead share fails it (ADR 0116).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from replayable import mirror, views
from replayable.db import Connection, execute, fetch_all
from replayable.stage import STAGE_BUILD
from replayable.vocabulary import DEFAULT_STAGES, STAGES

log = logging.getLogger(__name__)

# The dead letters a run's report lists (the rest are the dead-letter view's).
REPORT_LETTERS = 20


def build_report(
    conn: Connection,
    *,
    dag_id: str,
    run_id: str,
    stages_run: Sequence[str] = DEFAULT_STAGES,
    pipeline_stages: Sequence[str] = STAGES,
) -> dict[str, Any]:
    """Summarise a run: per stage of its pipeline, its documents by current status (and
    error class).

    The stages the run executed (``stages_run``) are listed even where no item entered them;
    another stage of ``pipeline_stages`` is listed when the run's documents have items in it.
    """
    stages: dict[str, dict[str, Any]] = {
        stage: {"done": 0, "failed": 0, "dead": 0, "running": 0, "pending": 0, "errors": {}}
        for stage in pipeline_stages
        if stage in stages_run
    }
    run = fetch_all(conn, "report/run", {"dag_id": dag_id, "run_id": run_id})
    documents = int(run[0]["documents"]) if run else 0
    for row in fetch_all(
        conn,
        "report/stage_status",
        {"dag_id": dag_id, "run_id": run_id, "stages": list(pipeline_stages)},
    ):
        entry = stages.setdefault(row["stage"], {"errors": {}})
        entry[row["status"]] = entry.get(row["status"], 0) + row["n"]
        if row["error_class"] and row["status"] != "done":
            errors = entry["errors"]
            errors[row["error_class"]] = errors.get(row["error_class"], 0) + row["n"]
    for entry in stages.values():
        entry["not_entered"] = documents - sum(
            entry.get(s, 0) for s in ("done", "failed", "dead", "running", "pending")
        )
    # A stage that could not be built: its documents never entered it, and this is why
    # (unless a later try, the stage fixed, entered them after all).
    for stage, message in ((run[0]["stage_errors"] or {}) if run else {}).items():
        entry = stages.setdefault(stage, {"errors": {}, "not_entered": documents})
        if entry["not_entered"] > 0:
            entry["not_built"] = str(message)
            entry["errors"][STAGE_BUILD] = entry["not_entered"]
    calls = dict(fetch_all(conn, "report/model_calls", {"run_id": run_id})[0])
    by_stage = {str(k): int(v) for k, v in (calls.pop("by_stage") or {}).items()}
    which = {"dag_id": dag_id, "run_id": run_id}
    dead = fetch_all(conn, "report/dead_letters", which)[0]
    letters = fetch_all(conn, "report/dead_letter_list", {**which, "limit": REPORT_LETTERS})
    to_do = int(run[0]["to_do"] or 0) if run else 0
    costs = views.model_costs(conn, run_id).as_dict()
    report = {
        "dag_id": dag_id,
        "run_id": run_id,
        "documents": documents,
        "batches": int(run[0]["batches"] or 0) if run else 0,
        "to_do": to_do,
        "stages": stages,
        "model_calls": {k: int(v) for k, v in calls.items()},
        "model_calls_by_stage": by_stage,
        "cost": costs,
        "dead_letters_opened": int(dead["opened"]),
        "dead": dead_share(int(dead["documents"]), to_do, [dict(row) for row in letters]),
        "mirror": mirror.run_counts(conn, dag_id=dag_id, run_id=run_id),
    }
    execute(
        conn,
        "report/save_report",
        {"dag_id": dag_id, "run_id": run_id, "report": json.dumps(report)},
    )
    conn.commit()
    return report


def dead_share(documents: int, to_do: int, letters: list[dict[str, Any]]) -> dict[str, Any]:
    """The documents a run dead-lettered, as a share of those it had work for (ADR 0116),
    and its first letters (``REPORT_LETTERS`` of them)."""
    fraction = documents / max(to_do, documents) if documents else 0.0
    return {
        "documents": documents,
        "of": max(to_do, documents),
        "fraction": fraction,
        "letters": letters,
    }


def over_dead_fraction(report: Mapping[str, Any], threshold: float | None) -> str | None:
    """Why the run fails its ``max_dead_fraction``, or None when it does not."""
    dead = report.get("dead") or {}
    if threshold is None or dead.get("fraction", 0.0) <= threshold:
        return None
    return (
        f"dead letters: {dead['documents']} of {dead['of']} documents with work in this run "
        f"(a fraction of {dead['fraction']:.4g}) were dead-lettered, over max_dead_fraction "
        f"{threshold:g}"
    )


def format_cost(cost: dict[str, Any]) -> str:
    """``$0.000123``, by model and mode, and the calls no price covered, if any."""
    text = f"${cost['usd']:.6f}"
    by_model = cost.get("by_model") or []
    if by_model:
        text += (
            " ("
            + "; ".join(
                f"{e['model']} {e['mode']}: {e['calls']} calls, ${e['usd'] or 0:.6f}"
                for e in by_model
            )
            + ")"
        )
    if cost.get("unpriced_calls"):
        unpriced = sorted({e["model"] for e in cost.get("by_model", ()) if e["unpriced_calls"]})
        text += (
            f" + {cost['unpriced_calls']} unpriced call(s) ({', '.join(unpriced)}: no price in"
            " the model connection's extra prices)"
        )
    return text


def format_report(report: dict[str, Any]) -> str:
    """Render a report as a small table a person can read at a glance."""
    lines = [
        f"run {report['run_id']}: {report['documents']} documents, "
        f"{report.get('to_do', report['documents'])} with work in "
        f"{report.get('batches', '?')} batches",
        f"{'stage':<10} {'done':>6} {'failed':>7} {'dead':>6} {'other':>6}  errors",
    ]
    # The shipped stages in pipeline order, then the others as build_report lists them.
    order: dict[str, int] = {}
    for stage in (*STAGES, *report["stages"]):
        order.setdefault(stage, len(order))
    for stage, entry in sorted(report["stages"].items(), key=lambda kv: order[kv[0]]):
        other = entry.get("running", 0) + entry.get("pending", 0) + entry.get("not_entered", 0)
        errors = ", ".join(f"{k}={v}" for k, v in sorted(entry.get("errors", {}).items()))
        lines.append(
            f"{stage:<10} {entry.get('done', 0):>6} {entry.get('failed', 0):>7} "
            f"{entry.get('dead', 0):>6} {other:>6}  {errors or '-'}"
        )
        if entry.get("not_built"):
            lines.append(f"  {entry['not_built']}")
    calls = report["model_calls"]
    lines.append(
        f"model calls: {calls['calls']} ({calls['ok']} ok, {calls['inputs']} inputs embedded, "
        f"{calls['tokens']} tokens); dead letters opened: {report['dead_letters_opened']}"
    )
    if calls.get("truncated"):
        lines.append(
            f"answers cut off at max_tokens: {calls['truncated']} (class truncated; "
            "summary_max_tokens sets the limit)"
        )
    by_stage = report.get("model_calls_by_stage") or {}
    if len(by_stage) > 1 or set(by_stage) - {"embed"}:
        lines.append(
            "model calls by stage: " + ", ".join(f"{k}={v}" for k, v in sorted(by_stage.items()))
        )
    cost = report.get("cost")
    if cost and cost.get("by_model"):
        lines.append(f"cost: {format_cost(cost)}")
    if (index := mirror.report_line(report.get("mirror"))) is not None:
        lines.append(index)
    dead = report.get("dead") or {}
    if dead.get("documents"):
        lines.append(
            f"dead letters: {dead['documents']} of {dead['of']} documents ({dead['fraction']:.1%})"
        )
        for letter in dead["letters"]:
            lines.append(
                f"  #{letter['id']} {letter['stage']} {letter['error_class']} "
                f"{letter['uri'] or letter['doc_id']}"
            )
        if dead["documents"] > len(dead["letters"]):
            lines.append("  (the rest: the dead-letter view, filtered by this run)")
    return "\n".join(lines)
