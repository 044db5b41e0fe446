"""The pipeline's non-stage steps: discover documents, plan batches, report a run.

A run's documents live in ``run_docs`` (ADR 0010): discover (or a re-run's selection) puts
them there, plan numbers the batches of those with work left, and each mapped task reads
its batch by number. Only references travel through XCom.
"""

from __future__ import annotations

import io
import json
import logging
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from replayable import config, mirror, sources, views
from replayable.db import Connection, execute, fetch_all
from replayable.keys import sha256_bytes, sha256_file
from replayable.pipelines import pipeline_of
from replayable.settings import AUTO, BOUNDS, PipelineSettings
from replayable.stage import STAGE_BUILD, Pipeline
from replayable.vocabulary import DEFAULT_STAGES, STAGES

log = logging.getLogger(__name__)

# (path, size, mtime_ns, inode, device)
Stat = tuple[str, int, int, int, int]

# The dead letters a run's report lists (the rest are the dead-letter view's).
REPORT_LETTERS = 20

# How long a run's documents and batches are kept (its report is kept for good).
RUN_RETENTION_DAYS = 30


def _stat_rows(found: Iterable[os.DirEntry[str] | Path]) -> list[Stat]:
    rows: list[Stat] = []
    for entry in found:
        try:
            info = entry.stat()
        except OSError:
            continue  # vanished between listing and stat
        if not stat.S_ISREG(info.st_mode):
            continue
        path = str(Path(entry).resolve()) if isinstance(entry, Path) else entry.path
        rows.append((path, info.st_size, info.st_mtime_ns, info.st_ino, info.st_dev))
    return rows


def _copy_text(value: object) -> str:
    return (
        str(value)
        .replace("\\", "\\\\")
        .replace("\t", "\\t")
        .replace("\n", "\\n")
        .replace("\r", "\\r")
    )


def _copy(conn: Connection, table: str, rows: Iterable[Sequence[object]]) -> None:
    """COPY rows into a temporary table (``table`` is a constant of this module)."""
    buffer = io.StringIO()
    for row in rows:
        buffer.write("\t".join(_copy_text(v) for v in row) + "\n")
    buffer.seek(0)
    with conn.cursor() as cur:
        cur.copy_expert(f"COPY {table} FROM STDIN", buffer)


def _oversize_id(row: Stat) -> str:
    """The id of a file too large to read: it names the file and its stat, not its bytes."""
    path, size, mtime_ns, inode, _device = row
    return sha256_bytes(f"oversize\x00{path}\x00{size}\x00{mtime_ns}\x00{inode}".encode())


def _unreadable_id(row: Stat) -> str:
    """The id of a file that could not be read: like an oversize file's, from its stat."""
    path, size, mtime_ns, inode, _device = row
    return sha256_bytes(f"unreadable\x00{path}\x00{size}\x00{mtime_ns}\x00{inode}".encode())


def _digest(row: Stat, roots: Sequence[str]) -> tuple[str, bool] | None:
    """The id of a listed file and whether it is named from its stat; None if it is gone.

    A file that is there but cannot be read (its mode, a FIFO or a link swapped in since it
    was listed) is still a document of the run (ADR 0074), named from its stat: the extract
    stage then dead-letters it as ``unreadable``, and the next discover tries it again.
    """
    path = row[0]
    if not sources.is_inside(path, roots):
        return None  # a link re-pointed out of the roots since the listing: skipped as it is
    try:
        return sha256_file(path), False
    except FileNotFoundError:
        return None  # removed since the listing: no longer part of the source
    except OSError as error:
        log.warning("%s cannot be read (%s); the extract stage dead-letters it", path, error)
        return _unreadable_id(row), True


def discover(
    conn: Connection,
    source: str,
    *,
    dag_id: str,
    run_id: str,
    roots: Sequence[str],
    max_bytes: int,
    workers: int | None = None,
    policy: mirror.Policy | None = None,
) -> int:
    """Record ``source``'s PDFs as the run's documents; return how many distinct ones.

    Files are stat'ed, not read, when ``(size, mtime, inode, device)`` matches the cache;
    new or changed files are hashed in parallel. A file larger than ``max_bytes`` is never
    read: it gets an id from its stat, and the extract stage dead-letters it as ``oversize``;
    so does a file that cannot be read, which extract dead-letters as ``unreadable``.
    The same bytes under two names are one document; its ``uri`` follows the file when the
    old path is gone (a move), and a ``missing_file`` letter it left is reopened. Retracted
    documents found again are restored, and with a ``policy`` a whole source's listing is
    mirrored into the index (:func:`replayable.mirror.mirror`).
    """
    unlisted: list[str] = []
    scanned = _stat_rows(sources.find_pdfs(source, roots, unlisted))
    with conn.cursor() as cur:
        cur.execute(
            "CREATE TEMP TABLE discover_scan (path text PRIMARY KEY, size_bytes bigint,"
            " mtime_ns bigint, inode bigint, device bigint) ON COMMIT DROP"
        )
    _copy(conn, "discover_scan", scanned)
    stale = {row["path"] for row in fetch_all(conn, "plan/discover_stale_paths")}
    to_hash = [row for row in scanned if row[0] in stale]
    readable = [row for row in to_hash if row[1] <= max_bytes]

    with ThreadPoolExecutor(workers or min(8, (os.cpu_count() or 1) * 2)) as pool:
        hashed = list(pool.map(lambda row: _digest(row, roots), readable))
    # (…, doc_id, named from its stat, unreadable): only an unreadable file is both.
    fresh = [
        (*row, found[0], "t" if found[1] else "f", "t" if found[1] else "f")
        for row, found in zip(readable, hashed, strict=True)
        if found is not None
    ]
    fresh += [(*row, _oversize_id(row), "t", "f") for row in to_hash if row[1] > max_bytes]
    with conn.cursor() as cur:
        cur.execute(
            "CREATE TEMP TABLE discover_hashed (path text PRIMARY KEY, size_bytes bigint,"
            " mtime_ns bigint, inode bigint, device bigint, doc_id text, stat_id boolean,"
            " unreadable boolean) ON COMMIT DROP"
        )
    _copy(conn, "discover_hashed", fresh)
    params = {
        "dag_id": dag_id,
        "run_id": run_id,
        "source": source,
        "retention_days": RUN_RETENTION_DAYS,
    }
    found = fetch_all(conn, "plan/discover_record", params)
    mirror.mirror(conn, source, dag_id=dag_id, run_id=run_id, unlisted=unlisted, policy=policy)
    conn.commit()
    return int(found[0]["documents"]) if found else 0


def select_documents(
    conn: Connection, settings: PipelineSettings, *, dag_id: str, run_id: str
) -> int:
    """Record the documents of a partial re-run or a redrive, chosen by a bound query.

    Nothing is closed here, so selecting again (a retried ``plan``, a replayed transaction)
    chooses the same documents: a redrive's letters are closed by the claim that takes their
    items back to work, or by :func:`plan/plan_batches` for items already done (ADR 0083).
    """
    common = {
        "dag_id": dag_id,
        "run_id": run_id,
        "selection": json.dumps({"rerun": settings.rerun, "redrive": settings.redrive}),
    }
    if settings.rerun:
        found = fetch_all(
            conn, "plan/select_rerun_docs", {**common, **rerun_params(settings.rerun)}
        )
    elif settings.redrive:
        redrive = settings.redrive
        found = fetch_all(
            conn,
            "plan/redrive_dead_letters",
            {
                **common,
                "stage": redrive["stage"],
                "error_classes": redrive.get("error_class"),
                "ids": redrive.get("ids"),
                "since": redrive.get("since"),
                "until": redrive.get("until"),
            },
        )
    else:
        raise ValueError("select_documents needs a rerun or a redrive")
    conn.commit()
    documents = int(found[0]["documents"]) if found else 0
    _reidentify(conn, dag_id=dag_id, run_id=run_id, max_bytes=settings.max_bytes)
    return documents


def _reidentify(conn: Connection, *, dag_id: str, run_id: str, max_bytes: int) -> None:
    """Hash the run's documents that were too large to read before and fit ``max_bytes`` now.

    Each becomes the document its bytes name, in this run instead of the stat-named one,
    whose rows stop being current and whose open letters are closed (the file was re-read).
    """
    for row in fetch_all(conn, "report/run_stat_documents", {"dag_id": dag_id, "run_id": run_id}):
        try:
            info = os.stat(row["uri"])
        except OSError:
            continue  # gone: the extract stage says so as missing_file
        if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
            continue
        try:
            new_id = sha256_file(row["uri"])
        except OSError:
            continue  # still unreadable: the extract stage says so as unreadable (ADR 0074)
        execute(
            conn,
            "plan/reidentify_document",
            {
                "dag_id": dag_id,
                "run_id": run_id,
                "old_id": row["doc_id"],
                "new_id": new_id,
                "path": row["uri"],
                "size_bytes": info.st_size,
                "mtime_ns": info.st_mtime_ns,
                "inode": info.st_ino,
                "device": info.st_dev,
            },
        )
        conn.commit()


def rerun_params(rerun: Mapping[str, Any]) -> dict[str, Any]:
    """The values a ``rerun`` conf binds to ``plan/select_rerun_docs.sql`` (None: any)."""
    return {
        "stage": rerun["stage"],
        "statuses": rerun.get("status"),
        "error_classes": rerun.get("error_class"),
        "code_version_lt": rerun.get("code_version_lt"),
        "since": rerun.get("since"),
        "doc_ids": rerun.get("doc_ids"),
    }


def record_embed_mode(
    conn: Connection, settings: PipelineSettings, *, dag_id: str, run_id: str
) -> None:
    """Record the run's embed mode with the run, for a sweep to re-run what it leaves in the
    same mode (ADR 0130). The caller commits."""
    execute(
        conn,
        "plan/run_embed_mode",
        {"dag_id": dag_id, "run_id": run_id, "embed_mode": settings.embed_mode},
    )


# batch_size "auto" (ADR 0104): this many batches per parallel slot, each of at least
# AUTO_MIN_BATCH documents (a small run is one batch) and at most the largest batch_size.
BATCHES_PER_SLOT = 2
AUTO_MIN_BATCH = 25


def plan_batches(
    conn: Connection,
    settings: PipelineSettings,
    *,
    dag_id: str,
    run_id: str,
    spec_hashes: Mapping[str, str],
    stages: Pipeline | None = None,
    max_map_length: int = config.DEFAULT_MAX_MAP_LENGTH,
    slots: int = 1,
    revived_by: str | None = None,
) -> list[dict[str, Any]]:
    """Number the batches of the run's documents that have work left; return their refs.

    A document has work when, walking some chain of inputs of ``stages`` (the pipeline of
    ``dag_id`` unless given; :meth:`Pipeline.paths`) in order, the
    first stage not done under its current spec is one this run executes and is not dead
    there (unless the run revives dead items of that stage). One query decides it for all
    stages at once; an identical re-run of a finished corpus therefore maps no batch at all.

    Batches hold ``batch_size`` documents each; under ``"auto"`` the size is chosen from the
    number of documents with work: ``BATCHES_PER_SLOT`` batches for each of ``slots``, within
    ``AUTO_MIN_BATCH`` and the largest ``batch_size``. Either way it grows when needed so that
    no more than ``max_map_length`` batches result.

    A run that revives dead items closes, as redriven by ``revived_by``, the open letters
    of its first stage whose documents are done there under the current spec already: no
    claim will take those items, and their work is done (ADR 0083).
    """
    stages = stages or pipeline_of(dag_id)
    effective = stages.effective_stages(settings)
    first = settings.first_stage
    revive = settings.revives_dead or bool(settings.redrive)
    closes = revive and first is not None and first in effective
    # Every chain of inputs, flattened: each stage's path number, input first (ADR 0107).
    cells = [(n, stage) for n, path in enumerate(stages.paths()) for stage in path]
    params = {
        "dag_id": dag_id,
        "run_id": run_id,
        "paths": [n for n, _ in cells],
        "stages": [stage for _, stage in cells],
        "spec_hashes": [spec_hashes[stage] for _, stage in cells],
        "effective": [stage in effective for _, stage in cells],
        "revive": [revive and stage == first for _, stage in cells],
        "batch_size": None if settings.batch_size == AUTO else settings.batch_size,
        "auto_batches": max(1, slots) * BATCHES_PER_SLOT,
        "auto_min": AUTO_MIN_BATCH,
        "auto_max": int(BOUNDS["batch_size"][1]),
        "max_map_length": max_map_length,
        "close_stage": first if closes else None,
        "close_spec_hash": spec_hashes[first] if closes and first else None,
        "closed_by": revived_by or "redrive",
    }
    rows = fetch_all(conn, "plan/plan_batches", params)
    conn.commit()
    batches = []
    for row in rows:
        first_doc, size = int(row["first_position"]), int(row["size"])
        label = f"batch {row['batch']}: docs {first_doc}-{first_doc + size - 1}"
        batches.append({"index": int(row["batch"]), "label": label, "size": size})
    return batches


def batch_doc_ids(conn: Connection, *, dag_id: str, run_id: str, batch: int) -> list[str]:
    """The documents of one batch of a run, in order."""
    rows = fetch_all(
        conn, "ledger/batch_doc_ids", {"dag_id": dag_id, "run_id": run_id, "batch": batch}
    )
    conn.commit()
    return [row["doc_id"] for row in rows]


# Params that select a run's documents rather than shape its work: not kept for the sweep.
_SELECTION_PARAMS = ("rerun", "redrive", "source", "stages")


def record_run_settings(
    conn: Connection, *, dag_id: str, run_id: str, params: Mapping[str, Any]
) -> None:
    """Keep the params a run was planned with, less its selection, in its ``runs`` row: the
    sweep re-runs an item this run left failed under them (ADR 0135)."""
    kept = {k: v for k, v in params.items() if k not in _SELECTION_PARAMS}
    execute(
        conn,
        "plan/record_run_settings",
        {
            "dag_id": dag_id,
            "run_id": run_id,
            "settings": json.dumps(kept, sort_keys=True, default=str),
        },
    )


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
