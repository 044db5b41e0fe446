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


def ledger_metrics(conn: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """What /replayable/metrics must say, counted from the ledger's own tables.

    Keyed like a parsed scrape: (sample name, sorted labels). Counts come from stage_runs,
    dead_letters and model_calls directly, never from the counters the endpoint reads.
    """
    from replayable.settings import STAGES
    from replayable.web.metrics import LATENCY_BOUNDS_MS

    def key(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
        return name, tuple(sorted(labels.items()))

    expected: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    current = dict(
        ((stage, status), n)
        for stage, status, n in rows(
            conn,
            "SELECT stage, status, count(*) FROM replayable.stage_runs WHERE is_current"
            " GROUP BY stage, status",
        )
    )
    for stage in STAGES:
        for status in ("pending", "running", "done", "failed", "dead"):
            expected[key("replayable_items", stage=stage, status=status)] = current.get(
                (stage, status), 0
            )
    letters = {
        stage: (n_open, n)
        for stage, n_open, n in rows(
            conn,
            "SELECT stage, count(*) FILTER (WHERE status = 'open'), count(*)"
            " FROM replayable.dead_letters GROUP BY stage",
        )
    }
    for stage in STAGES:
        n_open, n = letters.get(stage, (0, 0))
        expected[key("replayable_dead_letters_open", stage=stage)] = n_open
        expected[key("replayable_dead_letters_created_total", stage=stage)] = n
    for stage, outcome, n in rows(
        conn, "SELECT stage, status, count(*) FROM replayable.model_calls GROUP BY stage, status"
    ):
        expected[key("replayable_model_calls_total", stage=stage, outcome=outcome)] = n
    latency = "replayable_model_call_latency_seconds"
    for stage, retries, tokens, n, total_ms in rows(
        conn,
        "SELECT stage, count(*) FILTER (WHERE call_try > 1), sum(tokens), count(*),"
        " sum(latency_ms) FROM replayable.model_calls GROUP BY stage",
    ):
        expected[key("replayable_model_call_retries_total", stage=stage)] = retries
        expected[key("replayable_model_tokens_total", stage=stage)] = tokens
        expected[key(f"{latency}_count", stage=stage)] = n
        expected[key(f"{latency}_sum", stage=stage)] = total_ms / 1000
        expected[key(f"{latency}_bucket", stage=stage, le="+Inf")] = n
        for bound in LATENCY_BOUNDS_MS:
            expected[key(f"{latency}_bucket", stage=stage, le=str(bound / 1000))] = scalar(
                conn,
                "SELECT count(*) FROM replayable.model_calls WHERE stage = %s AND latency_ms <= %s",
                stage,
                bound,
            )
    return expected
