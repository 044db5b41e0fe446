"""The search indexes: one HNSW index per model, dimensions and vector length, built on first
use by one search at a time, never waited for (ADR 0119, 0120, 0137, 0151)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg2
from psycopg2 import sql

from replayable import db
from replayable.db import Connection, Database, fetch_all
from replayable.keys import sha256_bytes

log = logging.getLogger(__name__)

# The memory one index build may use: the graph of every vector, so that it is built in
# memory (2.5 min at a million vectors of 256 dimensions, against 8-10 min on disk with
# 1 GB), within bounds. Per vector: the vector, its 2m neighbours at layer 0 (16 bytes
# each, m = 16), the element's bookkeeping, and half as much again for the allocator.
BUILD_MEMORY_MIN_MB = 64
BUILD_MEMORY_MAX_MB = 4096
HNSW_M = 16  # pgvector's default, which the index is built with
# How long after a failed index build the searches read every vector before one of them
# builds it again (ADR 0137): a build that fails (say, out of shared memory) fails again
# at once, and every search would otherwise pay for the attempt.
BUILD_RETRY_AFTER_S = 600
# The full-text index of the chunks (ADR 0143): one GIN index of their words under the
# text search configuration below, built on first use like the vector indexes.
TEXT_INDEX = "chunks_text_search"
TEXT_CONFIG = "english"
TEXT_BUILD_MEMORY_MB = 256


def build_memory_mb(vectors: int, dim: int) -> int:
    """``maintenance_work_mem`` in MB for building the graph of ``vectors`` of ``dim``."""
    per_vector = (8 + 4 * dim + 2 * HNSW_M * 16 + 200) * 3 // 2
    needed = -(-vectors * per_vector // 2**20)
    return min(BUILD_MEMORY_MAX_MB, max(BUILD_MEMORY_MIN_MB, needed))


def index_name(model: str, dim: int, *, dimensions: int = 0) -> str:
    """The name of the search index of ``model``'s vectors of length ``dim`` asked at
    ``dimensions`` (as stored: 0 for the model's own size, ADR 0151)."""
    return "embeddings_hnsw_" + sha256_bytes(f"{model}\x00{dimensions}\x00{dim}".encode())[:16]


def ensure_index(database: Database, model: str, dim: int, *, dimensions: int = 0) -> bool:
    """Build the HNSW index of ``model``'s vectors of length ``dim`` asked at ``dimensions``
    (0: the model's own size) unless it exists and is valid; return whether this call
    built it. It is partial on the three, so a search of one set never reads another's.

    It is built concurrently (writers go on) on ``database``, which must be in autocommit,
    by one builder at a time. No search waits for it (ADR 0137): while another builds it,
    or for ``BUILD_RETRY_AFTER_S`` after a build failed, this returns at once and the search
    reads every vector. A build that failed leaves an invalid index, recorded as failed; the
    first search after the pause drops it and builds it again.
    """

    def memory(conn: Connection) -> int:
        params = {"model": model, "dimensions": dimensions, "dim": dim}
        vectors = fetch_all(conn, "search/vectors_of", params)
        return build_memory_mb(int(vectors[0]["vectors"]), dim)

    name = index_name(model, dim, dimensions=dimensions)
    create = sql.SQL(
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON replayable.embeddings"
        " USING hnsw ((embedding::vector({dim})) vector_cosine_ops)"
        " WITH (m = {m}) WHERE model = {model} AND dimensions = {dimensions} AND dim = {dim}"
    ).format(
        name=sql.Identifier(name),
        dim=sql.Literal(dim),
        m=sql.Literal(HNSW_M),
        model=sql.Literal(model),
        dimensions=sql.Literal(dimensions),
    )
    asked = f"asked at {dimensions}" if dimensions else "its own size"
    return _ensure(database, name, create, memory, f"{model} at {dim} dimensions ({asked})")


def ensure_text_index(database: Database) -> bool:
    """Build the full-text index of the chunks (ADR 0143) as :func:`ensure_index` builds a
    vector index: on first use, concurrently, never waited for; return whether it built it."""
    create = sql.SQL(
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON replayable.chunks"
        " USING gin (to_tsvector({config}::regconfig, text))"
    ).format(name=sql.Identifier(TEXT_INDEX), config=sql.Literal(TEXT_CONFIG))
    return _ensure(database, TEXT_INDEX, create, lambda conn: TEXT_BUILD_MEMORY_MB, "the text")


def _ensure(
    database: Database,
    name: str,
    create: sql.Composed,
    memory: Callable[[Connection], int],
    what: str,
) -> bool:
    """Build the index ``name`` with ``create`` unless it exists and is valid, another
    builder holds it, or its last build failed within the pause; see :func:`ensure_index`."""

    def state(conn: Connection) -> bool | None:
        rows = fetch_all(conn, "search/index_of", {"name": name})
        return bool(rows[0]["valid"]) if rows else None

    if database.transaction(state, describe="search/index_of"):
        return False

    def build(conn: Connection) -> bool:
        key = int(sha256_bytes(f"replayable-search-index\x00{name}".encode())[:15], 16)
        with conn.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(%s)", (key,))
            (locked,) = cur.fetchone() or (False,)
            if not locked:
                return False  # another search is building it: this one reads every row
            try:
                found = state(conn)
                if found:
                    return False
                paused = {"name": name, "pause_s": BUILD_RETRY_AFTER_S}
                if fetch_all(conn, "search/build_paused", paused)[0]["paused"]:
                    return False
                if found is not None:  # an invalid index, left by a failed build
                    cur.execute(
                        sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS replayable.{}").format(
                            sql.Identifier(name)
                        )
                    )
                megabytes = memory(conn)
                cur.execute(
                    "SELECT set_config('maintenance_work_mem', %s, false)", (f"{megabytes}MB",)
                )
                return _create(conn, cur, name, create, f"{what} ({megabytes} MB)")
            finally:
                cur.execute("RESET maintenance_work_mem")
                cur.execute("SELECT pg_advisory_unlock(%s)", (key,))

    return database.transaction(build, describe=f"build {name}")


def _create(conn: Connection, cur: Any, name: str, create: sql.Composed, what: str) -> bool:
    """Run ``create``; record a failure (not a lost connection) instead of raising it."""
    started = time.monotonic()
    try:
        cur.execute(create)
    except psycopg2.DatabaseError as error:
        if db.connection_lost(conn, error):
            raise
        log.warning("the search index of %s failed to build: %s", what, error)
        db.execute(conn, "search/build_failed", {"name": name, "error": str(error).strip()})
        return False
    db.execute(conn, "search/build_done", {"name": name})
    # Debug: under Airflow's logging this would reach the CLI's --json stdout.
    log.debug("built the search index of %s in %.1f s", what, time.monotonic() - started)
    return True
