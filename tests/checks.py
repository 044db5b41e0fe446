"""Ledger checks shared by the end-to-end tests."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from conftest import ROOT

SAMPLES = ROOT / "data" / "samples"


def rows(conn: Any, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(sql, params)
        found = cur.fetchall()
    conn.commit()
    return list(found)


def scalar(conn: Any, sql: str, *params: Any) -> Any:
    return rows(conn, sql, *params)[0][0]


def output_rows(conn: Any) -> dict[str, int]:
    tables = ("documents", "extractions", "chunks", "doc_chunks", "embeddings", "dead_letters")
    # Table names are the constants above, not input.
    return {t: scalar(conn, f"SELECT count(*) FROM replayable.{t}") for t in tables}  # noqa: S608


def assert_nothing_lost(conn: Any, *, one_version: bool = True) -> None:
    """Per stage, items in = done + failed + dead: nothing pending, running or vanished.

    With ``one_version`` (every row under one code version per stage) it also checks that a
    document entered each stage exactly when the stage before finished it.
    """
    documents = scalar(conn, "SELECT count(*) FROM replayable.documents")
    entered = dict(rows(conn, "SELECT stage, count(*) FROM replayable.stage_runs GROUP BY stage"))
    ended = dict(
        rows(
            conn,
            "SELECT stage, count(*) FROM replayable.stage_runs"
            " WHERE status IN ('done', 'failed', 'dead') GROUP BY stage",
        )
    )
    assert entered == ended
    if not one_version:
        return
    assert entered.get("extract") == documents
    for before, after in (("extract", "chunk"), ("chunk", "embed")):
        done_before = scalar(
            conn,
            "SELECT count(*) FROM replayable.stage_runs WHERE stage = %s AND status = 'done'",
            before,
        )
        assert entered.get(after, 0) == done_before
    # Every dead item has one letter still on the work list (open, or ignored on purpose).
    unresolved = scalar(
        conn, "SELECT count(*) FROM replayable.dead_letters WHERE status IN ('open', 'ignored')"
    )
    assert unresolved == scalar(
        conn, "SELECT count(*) FROM replayable.stage_runs WHERE status = 'dead'"
    )


def subset(tmp_path: Path, n: int) -> Path:
    folder = tmp_path / "docs"
    folder.mkdir(exist_ok=True)
    for path in sorted(SAMPLES.glob("*.pdf"))[:n]:
        shutil.copy(path, folder / path.name)
    return folder
