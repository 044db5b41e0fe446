"""Chaos results as JSON and Markdown: per scenario its time, facts, checks and reconciliation."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from chaos.reconcile import Reconciliation, RunTable, StageRow, format_table
from chaos.scenarios import ScenarioResult

ROOT = Path(__file__).resolve().parents[1]


def _commit() -> str | None:
    found = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    return found.stdout.strip() or None


def build(
    scenarios: Sequence[ScenarioResult], *, setup_s: float, total_s: float, size: int
) -> dict[str, Any]:
    return {
        "finished_at": datetime.now(UTC).replace(microsecond=0).isoformat(),
        "commit": _commit(),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "documents_per_run": size,
        "setup_seconds": round(setup_s, 1),
        "total_seconds": round(total_s, 1),
        "passed": all(s.passed for s in scenarios),
        "scenarios": [s.to_json() for s in scenarios],
    }


def charges(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Per scenario part: chunks the provider charged more than once, and the answers lost.

    Every part but (f)'s second runs with the provider's de-duplication off, so a chunk paid
    twice shows here; the physical minimum is the charged answers that never reached the
    ledger (ADR 0082).
    """
    rows = []
    for s in report["scenarios"]:
        for part in s["reconciliations"]:
            p = part["provider"]
            rows.append(
                {
                    "scenario": f"({s['key']}) {part['label']}",
                    "dedupe": "on" if part["dedupe"] else "off",
                    "chunks_charged": p["chunks_charged"],
                    "charged_twice": p["chunks_charged_more_than_once"],
                    "extra_charges": p["extra_chunk_charges"],
                    "lost_answers": part.get("lost_answers", 0),
                    "lost_inputs": part.get("lost_inputs", 0),
                    "lost_allowed": part.get("lost_allowed"),
                }
            )
    return rows


def charges_table(report: dict[str, Any]) -> list[str]:
    """The charged-twice table in Markdown."""
    lines = [
        "| scenario, part | de-dup | chunks charged | charged more than once | extra charges "
        "| charged answers never stored (requests / inputs) | the fault can lose |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in charges(report):
        allowed = "-" if r["lost_allowed"] is None else r["lost_allowed"]
        lines.append(
            f"| {r['scenario']} | {r['dedupe']} | {r['chunks_charged']} | {r['charged_twice']} "
            f"| {r['extra_charges']} | {r['lost_answers']} / {r['lost_inputs']} | {allowed} |"
        )
    return lines


def summary(report: dict[str, Any]) -> str:
    lines = [f"{'scenario':<72} {'result':>6} {'seconds':>8}"]
    for s in report["scenarios"]:
        verdict = "pass" if s["passed"] else "FAIL"
        lines.append(f"({s['key']}) {s['title']:<68} {verdict:>6} {s['seconds']:>8.0f}")
    lines.append(f"{'start-up':<72} {'':>6} {report['setup_seconds']:>8.0f}")
    lines.append(f"{'total':<72} {'':>6} {report['total_seconds']:>8.0f}")
    return "\n".join(lines)


def _table(data: dict[str, Any]) -> str:
    """Rebuild a reconciliation from its JSON form and format it like the live output."""
    runs = [
        RunTable(
            run["run_id"],
            run["documents"],
            run["state"],
            run["clears"],
            [StageRow(**row) for row in run["stages"]],
        )
        for run in data["runs"]
    ]
    fields = {k: v for k, v in data.items() if k not in ("runs", "label", "passed")}
    return format_table(Reconciliation(runs=runs, **fields))


def markdown(report: dict[str, Any]) -> str:
    minutes = report["total_seconds"] / 60
    lines = [
        "# Chaos results",
        "",
        f"`make chaos` at commit {report['commit']}, finished {report['finished_at']}, on "
        f"{report['machine']['cpus']} CPUs: {report['documents_per_run']} documents per run "
        f"(5 % poison), {minutes:.1f} minutes in all "
        f"({report['setup_seconds']:.0f} s of it starting the services). "
        f"Overall: **{'pass' if report['passed'] else 'FAIL'}**.",
        "",
        "| scenario | result | seconds |",
        "|---|---|---:|",
    ]
    for s in report["scenarios"]:
        verdict = "pass" if s["passed"] else "**FAIL**"
        lines.append(f"| ({s['key']}) {s['title']} | {verdict} | {s['seconds']:.0f} |")
    lines.append(f"| total, with start-up | | {report['total_seconds']:.0f} |")
    lines += [
        "",
        "## Chunks charged more than once",
        "",
        "The provider charges every request it answers (de-duplication off) except in the "
        "second part of (f). A chunk may be charged again only when an answer the provider "
        "charged never reached the ledger: a response lost on the way, a request given up "
        "at the deadline, a task killed with requests in flight. The last column is the most "
        "answers the scenario's fault can lose (requests in flight when it struck, responses "
        "dropped, requests given up).",
        "",
        *charges_table(report),
    ]
    for s in report["scenarios"]:
        lines += ["", f"## ({s['key']}) {s['title']}", ""]
        for key, value in s["facts"].items():
            lines.append(f"- {key}: {json.dumps(value) if not isinstance(value, str) else value}")
        for part in s["reconciliations"]:
            lines += ["", f"{part['label']}:", "", "```", _table(part), "```"]
        if s["problems"]:
            lines += ["", "Problems:", ""] + [f"- {p}" for p in s["problems"]]
    return "\n".join(lines) + "\n"


def write(report: dict[str, Any], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "latest.json").write_text(json.dumps(report, indent=2) + "\n")
    (folder / "latest.md").write_text(markdown(report))
