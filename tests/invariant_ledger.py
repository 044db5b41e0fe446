"""A small ledger that keeps every invariant, built by hand with the stages' real hashes.

The tests of ``replayable.invariants``, ``replayable check``, its endpoint and its metric
start from :func:`fill_clean_ledger` and break one thing each.
"""

from __future__ import annotations

import json
from typing import Any

from replayable.keys import config_hash, sha256_bytes
from replayable.stages import chunk, embed, extract
from replayable.stages.chunk.chunker import ChunkConfig
from replayable.stages.lineage import chunk_hash, embed_hash, extract_hash

A, B, C = "a" * 64, "b" * 64, "c" * 64
MODEL = "text-embedding-3-small"
CONFIG = ChunkConfig()
OWN = {doc: sha256_bytes(f"own {doc}".encode()) for doc in (A, B)}
SHARED = sha256_bytes(b"shared")


def run_sql(conn: Any, sql: str, *params: Any) -> None:
    with conn.cursor() as cur:
        cur.execute(sql, params)
    conn.commit()


def item(conn: Any, stage: str, doc: str, status: str, spec: str, **extra: Any) -> None:
    """A current row of ``doc`` in ``stage``, keyed ``<stage>-<doc>``."""
    config = {"extract": {"engine": "pdfium"}, "embed": {"model": MODEL, "dimensions": None}}
    version = {"extract": extract.VERSION, "chunk": chunk.VERSION, "embed": embed.VERSION}
    row = {
        "stage": stage,
        "item_key": f"{stage}-{doc[0]}",
        "doc_id": doc,
        "status": status,
        "attempts": 1,
        "code_version": version.get(stage, "1.0"),
        "config_hash": config_hash(config.get(stage, {"size": 800, "overlap": 100})),
        "spec_hash": spec,
        "is_current": True,
        **extra,
    }
    names = ", ".join(row)
    marks = ", ".join(f"%({name})s" for name in row)
    with conn.cursor() as cur:
        cur.execute(f"INSERT INTO replayable.stage_runs ({names}) VALUES ({marks})", row)  # noqa: S608


def letter(conn: Any, stage: str, doc: str, item_key: str, status: str = "open") -> None:
    run_sql(
        conn,
        "INSERT INTO replayable.dead_letters (stage, item_key, doc_id, error_class, error_kind,"
        " error, attempts, code_version, status) VALUES (%s, %s, %s, 'http_400', 'terminal',"
        " 'refused', 1, '1.0', %s)",
        stage,
        item_key,
        doc,
        status,
    )


def fill_clean_ledger(conn: Any) -> Any:
    """A done in every stage with its outputs, B dead in embed, C dead in chunk (each with its
    open letter), and a saved report of their run that equals the ledger."""
    run_sql(
        conn,
        "INSERT INTO replayable.documents (doc_id, uri, size_bytes)"
        " VALUES (%s, '/a.pdf', 1), (%s, '/b.pdf', 1), (%s, '/c.pdf', 1)",
        A,
        B,
        C,
    )
    for doc in (A, B, C):
        item(conn, "extract", doc, "done", extract_hash())
        run_sql(
            conn,
            "INSERT INTO replayable.extractions (doc_id, extractor_version, page_count, text,"
            " text_sha256, engine) VALUES (%s, %s, 1, 'text', 'sha', 'pdfium')",
            doc,
            extract.extractor_id(),
        )
    item(conn, "chunk", A, "done", chunk_hash(CONFIG))
    item(conn, "chunk", B, "done", chunk_hash(CONFIG))
    item(conn, "chunk", C, "dead", chunk_hash(CONFIG), error_class="empty_text")
    letter(conn, "chunk", C, "chunk-c")
    for doc in (A, B):
        for ordinal, chunk_id in enumerate((OWN[doc], SHARED)):
            run_sql(
                conn,
                "INSERT INTO replayable.chunks (chunk_id, text) VALUES (%s, 'x')"
                " ON CONFLICT DO NOTHING",
                chunk_id,
            )
            run_sql(
                conn,
                "INSERT INTO replayable.doc_chunks VALUES (%s, %s, %s, %s, %s)",
                doc,
                extract.extractor_id(),
                CONFIG.key,
                ordinal,
                chunk_id,
            )
    for chunk_id in (OWN[A], SHARED):
        run_sql(
            conn,
            "INSERT INTO replayable.embeddings (chunk_id, model, dim, embedding)"
            " VALUES (%s, %s, 3, '[1, 2, 3]')",
            chunk_id,
            MODEL,
        )
    item(conn, "embed", A, "done", embed_hash(MODEL, None, CONFIG))
    item(conn, "embed", B, "dead", embed_hash(MODEL, None, CONFIG), error_class="http_400")
    letter(conn, "embed", B, "embed-b")
    run_sql(
        conn,
        "INSERT INTO replayable.artifacts (stage, artifact_key, data)"
        " VALUES ('summarize', 'k', '{}')",
    )
    item(conn, "summarize", A, "done", "spec-summary")
    run_sql(
        conn,
        "INSERT INTO replayable.item_artifacts (stage, item_key, doc_id, artifact_key)"
        " VALUES ('summarize', 'summarize-a', %s, 'k')",
        A,
    )
    run_sql(conn, "INSERT INTO replayable.runs (dag_id, run_id, documents) VALUES ('d', 'r', 3)")
    run_sql(
        conn,
        "INSERT INTO replayable.run_docs (dag_id, run_id, doc_id)"
        " VALUES ('d', 'r', %s), ('d', 'r', %s), ('d', 'r', %s)",
        A,
        B,
        C,
    )
    report = {
        "documents": 3,
        "stages": {
            "extract": {"done": 3, "not_entered": 0},
            "chunk": {"done": 2, "dead": 1, "not_entered": 0},
            "embed": {"done": 1, "dead": 1, "not_entered": 1},
        },
    }
    run_sql(
        conn,
        "INSERT INTO replayable.run_reports (dag_id, run_id, report) VALUES ('d', 'r', %s)",
        json.dumps(report),
    )
    return conn
