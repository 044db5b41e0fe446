"""Search the pipeline's output: the chunks nearest a question, by their embeddings.

The question is embedded through the model connection, as the embed stage embeds chunks
(the same model resolution, and a slot and send time of the same shared budget), then
compared (cosine) with the current embeddings of current documents: those of the documents
whose embed item is done under the spec a run with these settings has now (the model and
dimensions, the chunker and the extractor), so a document re-chunked or re-embedded under
other settings is searched under the current ones only (ADR 0118).

Vectors are found through an HNSW index per model and dimension, built the first time that
model and dimension are searched and kept current by Postgres as vectors are written (ADR
0119). The index gives the nearest vectors of the model; those of current documents are kept,
and when fewer than asked are left (a narrow ``source``, many stale vectors) the search is
made again exactly, so a hit the index would miss is still found.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg2
from psycopg2 import sql

from replayable import db
from replayable.db import Connection, Database, fetch_all
from replayable.keys import sha256_bytes
from replayable.stages.embed.store import vector_literal
from replayable.vocabulary import MODEL_CONN_ID, PIPELINE_DAG_ID

if TYPE_CHECKING:
    from replayable.stages.embed.client import HttpEmbeddingClient

log = logging.getLogger(__name__)

SNIPPET_CHARS = 300
MAX_K = 100
STAGE = "search"  # the model_calls rows of query embeddings
# The nearest vectors the index is asked for, per hit wanted (and its bounds: pgvector's
# hnsw.ef_search goes up to 1,000). Stale vectors and other documents are dropped from them.
# 400 for 10 hits: at a million chunks of real text, recall@10 was 0.875 at 100, 0.938 at
# 200, 0.956 at 300 and 0.968 at 400, for p95 times of 10, 14, 19 and 24 ms (ADR 0120).
POOL_PER_HIT = 40
MIN_POOL = 400
MAX_POOL = 1000
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


def build_memory_mb(vectors: int, dim: int) -> int:
    """``maintenance_work_mem`` in MB for building the graph of ``vectors`` of ``dim``."""
    per_vector = (8 + 4 * dim + 2 * HNSW_M * 16 + 200) * 3 // 2
    needed = -(-vectors * per_vector // 2**20)
    return min(BUILD_MEMORY_MAX_MB, max(BUILD_MEMORY_MIN_MB, needed))


@dataclass(frozen=True)
class Hit:
    """One chunk found: its document, its place in it, its similarity, and its start."""

    doc_id: str
    uri: str
    ordinal: int
    chunk_id: str
    score: float
    snippet: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Scope:
    """What is searched: the vectors of ``model`` under the embed spec ``spec_hash``."""

    model: str
    spec_hash: str
    extractor_version: str
    chunker_key: str


@dataclass(frozen=True)
class Answer:
    """A search's answer: the question as searched, the model, and the chunks, best first."""

    query: str
    model: str
    hits: list[Hit] = field(default_factory=list)
    exact: bool = False  # whether the index's candidates fell short and every vector was read

    def as_dict(self) -> dict[str, Any]:
        return {
            "query": self.query,
            "model": self.model,
            "exact": self.exact,
            "hits": [hit.as_dict() for hit in self.hits],
        }


class SearchError(ValueError):
    """A search that cannot be made: the message says which input is wrong."""


def check_query(query: str) -> str:
    text = " ".join(query.split())
    if not text:
        raise SearchError("query: give a question or some words to search for")
    return text


def check_k(k: int) -> int:
    if not 1 <= k <= MAX_K:
        raise SearchError(f"k: ask for between 1 and {MAX_K} chunks, not {k}")
    return k


def index_name(model: str, dim: int) -> str:
    """The name of the search index of ``model`` at ``dim`` dimensions."""
    return "embeddings_hnsw_" + sha256_bytes(f"{model}\x00{dim}".encode())[:16]


def ensure_index(database: Database, model: str, dim: int) -> bool:
    """Build the HNSW index of ``model`` at ``dim`` dimensions unless it exists and is
    valid; return whether this call built it.

    It is built concurrently (writers go on) on ``database``, which must be in autocommit,
    by one builder at a time. No search waits for it (ADR 0137): while another builds it,
    or for ``BUILD_RETRY_AFTER_S`` after a build failed, this returns at once and the search
    reads every vector. A build that failed leaves an invalid index, recorded as failed; the
    first search after the pause drops it and builds it again.
    """
    name = index_name(model, dim)

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
                return False  # another search is building it: this one reads every vector
            try:
                return _build(conn, cur, name, model, dim, state(conn))
            finally:
                cur.execute("RESET maintenance_work_mem")
                cur.execute("SELECT pg_advisory_unlock(%s)", (key,))

    return database.transaction(build, describe=f"build {name}")


def _build(conn: Connection, cur: Any, name: str, model: str, dim: int, found: bool | None) -> bool:
    """The build of :func:`ensure_index`, under its lock: ``found`` is the index's state."""
    if found:
        return False
    paused = {"name": name, "pause_s": BUILD_RETRY_AFTER_S}
    if fetch_all(conn, "search/build_paused", paused)[0]["paused"]:
        return False
    if found is not None:  # an invalid index, left by a failed build
        cur.execute(
            sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS replayable.{}").format(sql.Identifier(name))
        )
    vectors = fetch_all(conn, "search/vectors_of", {"model": model, "dim": dim})
    memory = build_memory_mb(int(vectors[0]["vectors"]), dim)
    cur.execute("SELECT set_config('maintenance_work_mem', %s, false)", (f"{memory}MB",))
    started = time.monotonic()
    try:
        cur.execute(
            sql.SQL(
                "CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON replayable.embeddings"
                " USING hnsw ((embedding::vector({dim})) vector_cosine_ops)"
                " WITH (m = {m}) WHERE model = {model} AND dim = {dim}"
            ).format(
                name=sql.Identifier(name),
                dim=sql.Literal(dim),
                m=sql.Literal(HNSW_M),
                model=sql.Literal(model),
            )
        )
    except psycopg2.DatabaseError as error:
        if db.connection_lost(conn, error):
            raise
        log.warning(
            "the search index of %s at %d dimensions failed to build: %s", model, dim, error
        )
        db.execute(conn, "search/build_failed", {"name": name, "error": str(error).strip()})
        return False
    db.execute(conn, "search/build_done", {"name": name})
    # Debug: under Airflow's logging this would reach the CLI's --json stdout.
    log.debug(
        "built the search index of %s at %d dimensions in %.1f s with %d MB",
        model,
        dim,
        time.monotonic() - started,
        memory,
    )
    return True


def search(
    conn: Connection,
    vector: Sequence[float],
    scope: Scope,
    *,
    query: str = "",
    k: int = 10,
    source: str | None = None,
) -> Answer:
    """The ``k`` chunks nearest ``vector`` in ``scope``, best first; ``source`` keeps only
    documents whose URI starts with it. Through the index of the model and dimension when
    it has one; exactly when it has none or its candidates fall short."""
    check_k(k)
    params: dict[str, Any] = {
        "vector": vector_literal(vector),
        "model": scope.model,
        "spec_hash": scope.spec_hash,
        "extractor_version": scope.extractor_version,
        "chunker_key": scope.chunker_key,
        "source": source,
        "k": k,
        "snippet": SNIPPET_CHARS,
        "dim": len(vector),
    }
    dim = len(vector)
    rows: list[dict[str, Any]] | None = None
    if fetch_all(conn, "search/index_of", {"name": index_name(scope.model, dim)}) == [
        {"valid": True}
    ]:
        pool = min(MAX_POOL, max(MIN_POOL, k * POOL_PER_HIT))
        # One string, so one transaction even in autocommit: the setting is the query's.
        nearest = sql.SQL("SELECT set_config('hnsw.ef_search', {pool}, true);\n{query}").format(
            pool=sql.Literal(str(pool)),
            query=sql.SQL(db.sql("search/nearest_chunks")).format(dim=sql.Literal(dim)),
        )
        with conn.cursor() as cur:
            cur.execute(nearest, {**params, "pool": pool})
            rows = db.dict_rows(cur)
        # Fewer than k left, out of a full pool: vectors beyond it may be current ones.
        if len(rows) < k and (not rows or int(rows[0]["pooled"]) >= pool):
            rows = None
    exact = rows is None
    if rows is None:
        rows = fetch_all(conn, "search/best_chunks", params)
    if not rows:
        held = vector_sets(conn)
        if (scope.model, dim) not in held:
            raise no_vectors(scope.model, held, dim)
    hits = [
        Hit(
            doc_id=row["doc_id"],
            uri=row["uri"],
            ordinal=int(row["ordinal"]),
            chunk_id=row["chunk_id"],
            score=_finite(float(row["score"])),
            snippet=" ".join(str(row["snippet"]).split()),
        )
        for row in rows
    ]
    return Answer(query=query, model=scope.model, hits=hits, exact=exact)


def _finite(score: float) -> float:
    """A similarity, or 0 where it has none (a vector of zeros has no direction)."""
    return score if math.isfinite(score) else 0.0


def scope_of(
    model: str | None, dag_id: str = PIPELINE_DAG_ID, conn_id: str = MODEL_CONN_ID
) -> tuple[Scope, Any]:
    """What a run of ``dag_id`` with default settings (and ``model``) embeds, and the model
    choice it makes on the model connection ``conn_id``."""
    # Imported here: the hook loads Airflow's task SDK, which only a search needs.
    from replayable.hooks import EmbeddingsHook, model_choice
    from replayable.settings import PipelineSettings
    from replayable.stage import Models, pipeline_of
    from replayable.stages import extract

    settings = PipelineSettings(model=model)
    choice = model_choice(settings, EmbeddingsHook(conn_id))
    models = Models(choice.model, choice.dimensions, "")
    scope = Scope(
        model=choice.model,
        spec_hash=pipeline_of(dag_id).spec_hashes(settings, models)["embed"],
        extractor_version=extract.extractor_id(settings.extractor),
        chunker_key=settings.chunk_config.key,
    )
    return scope, choice


def embed_query(query: str, choice: Any, dsn: str, conn_id: str = MODEL_CONN_ID) -> list[float]:
    """The query's vector: the one stored for this question, model and dimensions (ADR
    0142), or one from the model ``choice`` names, sent within the shared budget (a slot and
    a send time, as every model request), recorded as a ``search`` call and stored."""
    cached = {
        "model": choice.model,
        "dimensions": choice.dimensions or 0,
        "query_hash": sha256_bytes(query.encode()),
    }
    database = Database(dsn)
    try:
        found = database.transaction(
            lambda conn: fetch_all(conn, "search/cached_query", cached), describe="search/cached"
        )
        if found:
            return [float(x) for x in str(found[0]["embedding"]).strip("[]").split(",")]
        vector = _paid_query_vector(query, choice, dsn, conn_id)
        stored = {**cached, "embedding": vector_literal(vector)}
        database.transaction(
            lambda conn: db.execute(conn, "search/store_query", stored), describe="search/store"
        )
    finally:
        database.close()
    return vector


def _paid_query_vector(query: str, choice: Any, dsn: str, conn_id: str) -> list[float]:
    """The query's vector from the provider, within the shared budget, recorded as a call."""
    from replayable.budget import RequestBudget
    from replayable.hooks import EmbeddingsHook
    from replayable.stages.embed.packing import estimate_tokens
    from replayable.stages.model_calls import correct_tokens, record_calls
    from replayable.stages.model_http import CallRecord

    key = "replayable-search-" + sha256_bytes(f"{choice.model}\x00{query}".encode())[:40]
    estimate = estimate_tokens(len(query.encode()))
    budget = RequestBudget(
        choice.provider.base_url,
        choice.shared_in_flight,
        max_rps=choice.shared_rps,
        connect=lambda: Database(dsn),
        max_tpm=choice.provider.max_tpm,
    )
    database = Database(dsn)
    calls: list[CallRecord] = []
    client: HttpEmbeddingClient = EmbeddingsHook(conn_id).get_client(
        model=choice.model, dimensions=choice.dimensions, max_in_flight=1
    )
    try:
        vector = client.embed(
            [query],
            idempotency_key=key,
            on_call=calls.append,
            gate=lambda: budget.slot(database.conn, estimate),
        ).vectors[0]
    finally:
        client.close()
        correct_tokens(budget, estimate, calls, STAGE)
        budget.close()
        try:
            database.transaction(
                lambda conn: record_calls(
                    conn, calls, stage=STAGE, run_id=None, attempt=1, share={key: 1}
                ),
                describe="record the query's model calls",
            )
        finally:
            database.close()
    return list(vector)


def has_vectors(conn: Connection, model: str) -> bool:
    """Whether the ledger holds any vector of ``model``: a search asks before it pays the
    provider for the question's vector, and before it builds that model's index."""
    return bool(fetch_all(conn, "search/has_model", {"model": model})[0]["found"])


def vector_sets(conn: Connection) -> list[tuple[str, int]]:
    """The models and dimensions the ledger holds vectors of, in order."""
    return [(row["model"], int(row["dim"])) for row in fetch_all(conn, "search/vector_sets")]


def no_vectors(model: str, held: Sequence[tuple[str, int]], dim: int | None = None) -> SearchError:
    """The refusal of a model (at ``dim`` dimensions) the ledger has no vectors of, naming
    the models and dimensions it has."""
    asked = repr(model) if dim is None else f"{model!r} at {dim} dimensions"
    if not held:
        return SearchError(
            f"model: the ledger has no vectors for {asked}; it holds no vectors yet: run the "
            "pipeline's embed stage first"
        )
    have = ", ".join(f"{m!r} ({d} dimensions)" for m, d in held)
    return SearchError(
        f"model: the ledger has no vectors for {asked}; it has vectors of {have}: search "
        f"one of those, or embed documents with {model!r} first"
    )


def current_model(conn: Connection, default: str) -> str:
    """The model a search that names none reads: the one the newest paid embedding used,
    where its vectors are still held; else ``default`` (the model connection's) when it has
    vectors, or the only model that has; else a refusal naming them."""
    held = vector_sets(conn)
    models = list(dict.fromkeys(model for model, _ in held))
    latest = fetch_all(conn, "search/latest_embed_model", {"stage": "embed"})
    if latest and latest[0]["model"] in models:
        return str(latest[0]["model"])
    if default in models or not models:
        return default
    if len(models) == 1:
        return models[0]
    raise no_vectors(default, held)


def vector_for(
    query: str, scope: Scope, choice: Any, dsn: str, conn_id: str = MODEL_CONN_ID
) -> list[float]:
    """The question's vector (:func:`embed_query`), with the index of its model and
    dimension built if this is their first search; writes through ``dsn`` only."""
    vector = embed_query(query, choice, dsn, conn_id)
    builder = Database(dsn, autocommit=True)
    try:
        ensure_index(builder, scope.model, len(vector))
    finally:
        builder.close()
    return vector


def answer(
    conn: Connection,
    query: str,
    *,
    dsn: str,
    model: str | None = None,
    k: int = 10,
    source: str | None = None,
    dag_id: str = PIPELINE_DAG_ID,
    conn_id: str = MODEL_CONN_ID,
) -> Answer:
    """Search for ``query``: embed it, build the index of its model and dimension on first
    use, and read the ``k`` nearest chunks on ``conn``. ``dsn`` is the ledger's, on which the
    budget, the call's record and the index build write; ``conn`` may be read-only.

    A model asked for by name is checked for vectors first, so a name mistyped costs no
    model call and builds no index; without one, the search reads the model that holds the
    current vectors (:func:`current_model`).
    """
    text = check_query(query)
    check_k(k)
    scope, choice = scope_of(model, dag_id, conn_id)
    if model is None:
        chosen = current_model(conn, choice.model)
        if chosen != choice.model:
            scope, choice = scope_of(chosen, dag_id, conn_id)
    elif not has_vectors(conn, model):
        raise no_vectors(model, vector_sets(conn))
    vector = vector_for(text, scope, choice, dsn, conn_id)
    return search(conn, vector, scope, query=text, k=k, source=source)
