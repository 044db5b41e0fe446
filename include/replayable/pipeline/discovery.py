"""A run's documents: listed from its source (hashing only new or changed files), or selected
from the ledger for a re-run or a redrive, into ``run_docs`` (ADR 0010).
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

from replayable import mirror, sources
from replayable.db import Connection, execute, fetch_all
from replayable.keys import sha256_bytes, sha256_file
from replayable.settings import PipelineSettings

log = logging.getLogger(__name__)

# (path, size, mtime_ns, inode, device)
Stat = tuple[str, int, int, int, int]

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
