"""The ledger the CLI tests read: three documents in a few stages, runs and dead letters.

Each test module of the CLI wraps :func:`fill_ledger` in its own ``ledger`` fixture.
"""

from __future__ import annotations

import json
from typing import Any

from replayable.cli import main

A, B, C = "a" * 64, "b" * 64, "c" * 64


def _insert(conn: Any, sql: str, rows: list[tuple[Any, ...]]) -> None:
    with conn.cursor() as cur:
        for row in rows:
            cur.execute(sql, row)


def fill_ledger(conn: Any) -> None:
    """A, B and C in a few stages and runs: r1 touched A and B, r2 touched C."""
    _insert(
        conn,
        "INSERT INTO replayable.documents (doc_id, uri, size_bytes) VALUES (%s, %s, 10)",
        [(A, "/data/a.pdf"), (B, "/data/b.pdf"), (C, "/data/c.pdf")],
    )
    _insert(
        conn,
        "INSERT INTO replayable.stage_runs (stage, item_key, doc_id, status, attempts,"
        " error_class, last_error, code_version, config_hash, run_id, is_current, updated_at)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, 'cfg', %s, %s,"
        " now() - make_interval(mins => %s))",
        [
            # A's older extract row failed; its newer one is done and is the current one.
            ("extract", "ea-old", A, "failed", 1, "http_503", "old", "1.0", "r1", False, 120),
            ("extract", "ea", A, "done", 1, None, None, "1.1", "r1", True, 60),
            ("extract", "eb", B, "failed", 1, "http_503", "503 upstream", "1.1", "r1", True, 30),
            ("extract", "ec", C, "dead", 3, "encrypted", "locked", "1.1", "r2", True, 10),
            ("chunk", "ca", A, "running", 1, None, None, "1.1", "r1", True, 5),
            ("embed", "ma", A, "failed", 2, "http_429", "429 [slow] down", "2.0", "r1", True, 1),
        ],
    )
    _insert(
        conn,
        "INSERT INTO replayable.runs (dag_id, run_id, documents) VALUES ('d', %s, %s)",
        [("r1", 2), ("r2", 1)],
    )
    _insert(
        conn,
        "INSERT INTO replayable.run_docs (dag_id, run_id, doc_id) VALUES ('d', %s, %s)",
        [("r1", A), ("r1", B), ("r2", C)],
    )
    _insert(
        conn,
        "INSERT INTO replayable.dead_letters (stage, item_key, doc_id, error_class, error_kind,"
        " error, attempts, code_version, run_id, map_index, status, owner)"
        " VALUES (%s, %s, %s, %s, 'terminal', 'boom', 3, %s, %s, %s, %s, %s)",
        [
            ("extract", "ec", C, "encrypted", "1.1", "r2", 0, "open", "alice"),
            ("embed", "m-old", A, "http_500", "1.0", "r1", 1, "redriven", None),
        ],
    )
    _insert(
        conn,
        "INSERT INTO replayable.model_calls (stage, item_key, attempt, status, latency_ms,"
        " n_inputs, tokens, idempotency_key, run_id, model, cost_usd)"
        " VALUES ('embed', %s, 1, %s, 5, 1, %s, 'k', %s, %s, %s)",
        [
            ("ma", "ok", 100, "r1", EMBED_MODEL, 0.000002),
            ("ma", "http_429", 0, "r1", EMBED_MODEL, None),
            ("other", "ok", 50, "r2", "unpriced-model", None),  # no price: unpriced
        ],
    )
    conn.commit()


EMBED_MODEL = "text-embedding-3-small"


def run_json(capsys: Any, dsn: str, *args: str) -> Any:
    """Run the command with ``--json``, expect exit 0, and return what it printed."""
    assert main(["--dsn", dsn, "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def by_stage(data: dict[str, Any]) -> dict[str, Any]:
    """``status --json``'s stages by name."""
    return {s["stage"]: s for s in data["stages"]}
