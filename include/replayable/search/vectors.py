"""The vector search: the chunks nearest a question's vector among the embeddings of current
documents under the settings searched (ADR 0118, 0119, 0152), which settings and model a
search reads, and what it covered."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from typing import Any

import psycopg2
import psycopg2.errors
from psycopg2 import sql

from replayable import db
from replayable.db import Connection, Database, fetch_all
from replayable.keys import config_hash, sha256_bytes
from replayable.search.index import index_name
from replayable.search.model import (
    SNIPPET_CHARS,
    Answer,
    Coverage,
    Hit,
    RunSettings,
    Scope,
    SearchError,
    check_k,
)
from replayable.stages.chunk.chunker import chunk_config_of
from replayable.stages.embed import stored_dimensions
from replayable.stages.embed.store import vector_literal
from replayable.vocabulary import MODEL_CONN_ID, PIPELINE_DAG_ID

# The nearest vectors the index is asked for, per hit wanted (and its bounds: pgvector's
# hnsw.ef_search goes up to 1,000). Stale vectors and other documents are dropped from them.
# 400 for 10 hits: at a million chunks of real text, recall@10 was 0.875 at 100, 0.938 at
# 200, 0.956 at 300 and 0.968 at 400, for p95 times of 10, 14, 19 and 24 ms (ADR 0120).
POOL_PER_HIT = 40
MIN_POOL = 400
MAX_POOL = 1000
# What a search covered is counted again when its last count is older than this (or than the
# newest run report), and the count gives up after COVERAGE_TIMEOUT_S: it reads every
# current embed item, about 5 s at a million documents on two cores (ADR 0152).
COVERAGE_FRESH_S = 300
COVERAGE_TIMEOUT_S = 30

log = logging.getLogger(__name__)


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
    documents whose URI starts with it. Only vectors of the scope's model asked at its
    dimensions, of the question's length, are read (ADR 0151): through their index when it
    exists; exactly when it does not or its candidates fall short. With none stored, a
    refusal naming the sets the ledger holds."""
    check_k(k)
    dimensions = stored_dimensions(scope.dimensions)
    params: dict[str, Any] = {
        "vector": vector_literal(vector),
        "model": scope.model,
        "dimensions": dimensions,
        **scope.documents(),
        "source": source,
        "k": k,
        "snippet": SNIPPET_CHARS,
        "dim": len(vector),
    }
    dim = len(vector)
    rows: list[dict[str, Any]] | None = None
    name = index_name(scope.model, dim, dimensions=dimensions)
    if fetch_all(conn, "search/index_of", {"name": name}) == [{"valid": True}]:
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
        if (scope.model, dimensions, dim) not in held:
            raise no_vectors(scope.model, held, dimensions, dim)
    hits = [Hit.of(row) for row in rows]
    return Answer(query=query, model=scope.model, hits=hits, exact=exact)


def scope_of(
    model: str | None,
    dag_id: str = PIPELINE_DAG_ID,
    conn_id: str = MODEL_CONN_ID,
    run: RunSettings | None = None,
    dimensions: int | None = None,
) -> tuple[Scope, Any]:
    """What a run of ``dag_id`` with ``run``'s settings (the defaults when None) embeds,
    with ``model`` when one is named, and the model choice it makes on the model
    connection ``conn_id``. A model other than the run's drops the run's ``dimensions``:
    they were asked of that model. ``dimensions``, when named, wins over both the run's and
    the connection's: 0 is the model's own size (ADR 0151)."""
    # Imported here: the hook loads Airflow's task SDK, which only a search needs.
    from replayable.airflow.hooks import choice_of
    from replayable.settings import PipelineSettings
    from replayable.stages import extract
    from replayable.stages.embed import key_config

    params = dict(run.settings) if run is not None else {}
    if model is not None and model != params.get("model"):
        params.update(model=model, dimensions=None)
    settings = PipelineSettings.from_params(params)
    choice = choice_of(settings, conn_id)
    if dimensions is not None:
        choice = dataclasses.replace(choice, dimensions=dimensions or None)
    scope = Scope(
        model=choice.model,
        config_hash=config_hash(key_config(choice.model, choice.dimensions)),
        extractor_version=extract.extractor_id(settings.extractor),
        chunker_key=chunk_config_of(settings).key,
        dimensions=choice.dimensions,
        run_id=run.run_id if run is not None else None,
    )
    return scope, choice


def run_settings(
    conn: Connection, dag_id: str = PIPELINE_DAG_ID, run_id: str | None = None
) -> RunSettings | None:
    """The settings a search of ``dag_id`` reads (ADR 0152): ``run_id``'s, or when None
    those of its most recent complete run (over its whole source, embed among its stages,
    its report written); None when it has none. A run named but not found is refused."""
    rows = fetch_all(conn, "search/current_run", {"dag_id": dag_id, "run_id": run_id})
    if not rows:
        if run_id is not None:
            raise SearchError(
                f"run: {dag_id} has no finished run {run_id!r} that embedded documents; "
                "`replayable status` lists its runs"
            )
        return None
    return RunSettings(run_id=rows[0]["run_id"], settings=dict(rows[0]["settings"]))


def coverage(conn: Connection, scope: Scope, dsn: str | None = None) -> Coverage | None:
    """How many documents ``scope`` searches, and how many it leaves out and why (ADR 0152).

    Counted on ``conn`` when no ``dsn`` is given. Otherwise read from the last count of
    these settings while it is fresh (:data:`COVERAGE_FRESH_S`, and no run report since),
    else counted again through ``dsn`` by one search at a time, within
    :data:`COVERAGE_TIMEOUT_S`; a search that cannot count (another is counting, or the
    ledger is too large to count in time) answers with the last count, or None.
    """
    params: dict[str, Any] = scope.documents()
    if dsn is None:
        return Coverage.of(fetch_all(conn, "search/coverage", params)[0])
    counted = fetch_all(conn, "search/coverage_counted", {**params, "fresh_s": COVERAGE_FRESH_S})
    if counted and counted[0]["fresh"]:
        return Coverage.of(counted[0])
    last = Coverage.of(counted[0]) if counted else None

    def count(writer: Connection) -> Coverage | None:
        lock = int(sha256_bytes(json.dumps(params, sort_keys=True).encode())[:15], 16)
        with writer.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_xact_lock(%s)", (lock,))
            if not cur.fetchone()[0]:
                return last
            cur.execute("SET LOCAL statement_timeout = %s", (f"{COVERAGE_TIMEOUT_S * 1000:.0f}ms",))
        row = fetch_all(writer, "search/coverage", params)[0]
        found = Coverage.of(row)
        stored = fetch_all(
            writer,
            "search/store_coverage",
            {**params, "documents": found.documents, "left_out": json.dumps(found.left_out)},
        )
        return dataclasses.replace(found, counted_at=stored[0]["counted_at"])

    writer = Database(dsn)
    try:
        return writer.transaction(count, describe="count what a search covers")
    except psycopg2.errors.QueryCanceled:
        log.warning(
            "counting what a search covers took over %s s; answering with the last count",
            COVERAGE_TIMEOUT_S,
        )
        return last
    finally:
        writer.close()


def has_vectors(conn: Connection, model: str, dimensions: int | None = None) -> bool:
    """Whether the ledger holds any vector of ``model`` (asked at ``dimensions`` as stored,
    0 for its own size; any when None): a search asks before it pays the provider for the
    question's vector, and before it builds that model's index."""
    params = {"model": model, "dimensions": dimensions}
    return bool(fetch_all(conn, "search/has_model", params)[0]["found"])


def vector_sets(conn: Connection) -> list[tuple[str, int, int]]:
    """The sets of vectors the ledger holds, in order: (model, dimensions as stored, 0 for
    the model's own size; the vectors' length)."""
    return [
        (row["model"], int(row["dimensions"]), int(row["dim"]))
        for row in fetch_all(conn, "search/vector_sets")
    ]


def _described(model: str, dimensions: int | None, dim: int | None = None) -> str:
    """A set of vectors as a sentence names it: ``'m' at 64 dimensions``, or ``'m' at its
    own size (256 dimensions)``; ``dimensions`` None names the model alone."""
    if dimensions is None:
        return repr(model)
    if dimensions:
        return f"{model!r} at {dimensions} dimensions"
    return f"{model!r} at its own size" + (f" ({dim} dimensions)" if dim else "")


def no_vectors(
    model: str,
    held: Sequence[tuple[str, int, int]],
    dimensions: int | None = None,
    dim: int | None = None,
) -> SearchError:
    """The refusal of a model (asked at ``dimensions`` as stored, for vectors of length
    ``dim``, when given) the ledger has no vectors of, naming the sets it has (ADR 0151).
    It blames ``dimensions`` when the model has vectors at other ones, else ``model``."""
    asked = _described(model, dimensions, dim)
    field = "dimensions" if any(m == model for m, _, _ in held) else "model"
    if not held:
        return SearchError(
            f"{field}: the ledger has no vectors for {asked}; it holds no vectors yet: run "
            "the pipeline's embed stage first"
        )
    have = ", ".join(_described(m, d, n) for m, d, n in held)
    if field == "model":
        then = f"search one of those, or embed documents with {model!r} first"
    else:
        then = (
            "search one of those (dimensions 0 is a model's own size), or embed documents "
            f"with {asked} first"
        )
    return SearchError(
        f"{field}: the ledger has no vectors for {asked}; it has vectors of {have}: {then}"
    )


def current_model(conn: Connection, default: str) -> str:
    """The model a search that names none reads: the one the newest paid embedding used,
    where its vectors are still held; else ``default`` (the model connection's) when it has
    vectors, or the only model that has; else a refusal naming them."""
    held = vector_sets(conn)
    models = list(dict.fromkeys(model for model, _, _ in held))
    latest = fetch_all(conn, "search/latest_embed_model", {"stage": "embed"})
    if latest and latest[0]["model"] in models:
        return str(latest[0]["model"])
    if default in models or not models:
        return default
    if len(models) == 1:
        return models[0]
    raise no_vectors(default, held)
