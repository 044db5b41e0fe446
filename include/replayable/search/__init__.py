"""Search the pipeline's output: the chunks nearest a question, by their embeddings.

The question is embedded through the model connection, as the embed stage embeds chunks
(the same model resolution, and a slot and send time of the same shared budget), then
compared (cosine) with the embeddings of current documents under the settings the pipeline
last asked for: those of its most recent complete run, or of a run named (ADR 0152). A
document is searched when an embed item of it is done for that model and dimensions, through
its chunks under that chunker and extractor, whichever run did it; the answer says how many
documents that covered and why the others were left out.

Vectors are found through an HNSW index per model, dimensions and length, built the first
time they are searched and kept current by Postgres as vectors are written (ADR 0119). The
dimensions a vector was asked at are part of its identity (ADR 0151): a search reads the
vectors asked at its settings' dimensions (0: the model's own size), never another size's.
The index gives the nearest vectors of the set; those of current documents are kept, and
when fewer than asked are left (a narrow ``source``, many stale vectors) the search is made
again exactly, so a hit the index would miss is still found.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from replayable.db import Connection, Database
from replayable.search.index import (
    BUILD_MEMORY_MAX_MB,
    ensure_index,
    ensure_text_index,
    index_name,
)
from replayable.search.model import (
    MAX_K,
    SNIPPET_CHARS,
    Answer,
    Coverage,
    Hit,
    RunSettings,
    Scope,
    SearchError,
    check_dimensions,
    check_k,
    check_query,
    dimensions_refused,
    searched,
)
from replayable.search.question import STAGE, embed_query, vector_for
from replayable.search.rate import TooManySearches, admit, cli_user
from replayable.search.text import (
    DEFAULT_MODE,
    MODES,
    check_mode,
    fuse,
    fusion_pool,
    text_hits,
)
from replayable.search.vectors import (
    coverage,
    current_model,
    has_vectors,
    no_vectors,
    run_settings,
    scope_of,
    search,
    vector_sets,
)
from replayable.stages.embed import stored_dimensions
from replayable.vocabulary import MODEL_CONN_ID, PIPELINE_DAG_ID

__all__ = [
    "BUILD_MEMORY_MAX_MB",
    "DEFAULT_MODE",
    "MAX_K",
    "MODES",
    "SNIPPET_CHARS",
    "STAGE",
    "Answer",
    "Coverage",
    "Hit",
    "RunSettings",
    "Scope",
    "SearchError",
    "TooManySearches",
    "admit",
    "answer",
    "check_dimensions",
    "check_k",
    "check_mode",
    "check_query",
    "cli_user",
    "coverage",
    "current_model",
    "described",
    "dimensions_refused",
    "embed_query",
    "ensure_index",
    "fuse",
    "has_vectors",
    "index_name",
    "no_vectors",
    "prepare",
    "ranked",
    "resolve",
    "run_settings",
    "scope_of",
    "search",
    "searched",
    "text_hits",
    "vector_for",
    "vector_sets",
]


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
    mode: str = DEFAULT_MODE,
    run_id: str | None = None,
    searched_by: str | None = None,
    dimensions: int | None = None,
) -> Answer:
    """Search for ``query`` in ``mode``: embed it (not in text mode), build the indexes it
    reads on first use, and read the ``k`` best chunks on ``conn``. ``dsn`` is the ledger's,
    on which the budget, the call's record and the index builds write; ``conn`` may be
    read-only. What it searched (:func:`resolve`) and how many documents that covers come
    with the answer. A search ``searched_by`` a user is counted as theirs once resolved,
    with no limit (:func:`.rate.admit`, ADR 0153).
    """
    text = check_query(query)
    check_k(k)
    check_mode(mode)
    scope, choice = resolve(
        conn, model, dag_id=dag_id, conn_id=conn_id, run_id=run_id, dimensions=dimensions
    )
    if searched_by is not None:
        admit(dsn, searched_by, None)
    vector = prepare(text, scope, choice, dsn, mode=mode, searched_by=searched_by)
    found = ranked(conn, text, scope, vector, mode=mode, k=k, source=source)
    return described(conn, found, scope, dsn)


def resolve(
    conn: Connection,
    model: str | None,
    *,
    dag_id: str = PIPELINE_DAG_ID,
    conn_id: str = MODEL_CONN_ID,
    run_id: str | None = None,
    dimensions: int | None = None,
    scope_for: Callable[..., tuple[Scope, Any]] = scope_of,
) -> tuple[Scope, Any]:
    """What a search reads, and the model choice that embeds its question (ADR 0152): the
    settings of ``run_id``, else of the pipeline's most recent complete run, else the
    defaults; ``model`` when named (checked for vectors first, so a name mistyped costs no
    model call and builds no index), else the run's, else the one that holds the current
    vectors (:func:`current_model`); ``dimensions`` when named (0: the model's own size,
    ADR 0151; checked for vectors first too), else the run's. ``scope_for`` builds a scope
    from (model, dag_id, conn_id, run, dimensions): the UI's answers its refusals as HTTP
    errors."""
    run = run_settings(conn, dag_id, run_id)
    if model is not None and not has_vectors(conn, model):
        raise no_vectors(model, vector_sets(conn))
    scope, choice = scope_for(model, dag_id, conn_id, run, dimensions)
    if model is None and (run is None or run.settings.get("model") is None):
        chosen = current_model(conn, choice.model)
        if chosen != choice.model:
            scope, choice = scope_for(chosen, dag_id, conn_id, run, dimensions)
    if (model is not None or dimensions is not None) and not has_vectors(
        conn, scope.model, stored_dimensions(scope.dimensions)
    ):
        raise no_vectors(scope.model, vector_sets(conn), stored_dimensions(scope.dimensions))
    return scope, choice


def described(conn: Connection, found: Answer, scope: Scope, dsn: str | None = None) -> Answer:
    """``found`` with what it searched: the run whose settings, the dimensions, and how many
    documents those cover and leave out (counted through ``dsn`` when stale, see
    :func:`coverage`)."""
    return dataclasses.replace(
        found,
        dimensions=scope.dimensions,
        run_id=scope.run_id,
        coverage=coverage(conn, scope, dsn),
    )


def prepare(
    query: str,
    scope: Scope,
    choice: Any,
    dsn: str,
    *,
    mode: str,
    searched_by: str | None = None,
) -> list[float] | None:
    """What a search in ``mode`` writes before it reads, through ``dsn`` only: the text index
    (built on first use), and the question's vector with its index (none in text mode), its
    call recorded as ``searched_by``'s."""
    if mode != "vector":
        builder = Database(dsn, autocommit=True)
        try:
            ensure_text_index(builder)
        finally:
            builder.close()
    if mode == "text":
        return None
    return vector_for(query, scope, choice, dsn, searched_by)


def ranked(
    conn: Connection,
    query: str,
    scope: Scope,
    vector: Sequence[float] | None,
    *,
    mode: str,
    k: int,
    source: str | None = None,
) -> Answer:
    """The ``k`` best chunks for ``query`` in ``mode``, read on ``conn``: by its ``vector``,
    by the words it shares with them, or both fused by reciprocal rank (ADR 0143)."""
    if mode == "text":
        hits = text_hits(conn, query, scope, k=k, source=source)
        return Answer(query=query, model=scope.model, hits=hits, mode=mode)
    if vector is None:
        raise ValueError(f"a {mode} search needs the question's vector")
    if mode == "vector":
        return search(conn, vector, scope, query=query, k=k, source=source)
    pool = fusion_pool(k)
    by_vector = search(conn, vector, scope, query=query, k=pool, source=source)
    by_text = text_hits(conn, query, scope, k=pool, source=source)
    hits = fuse([by_vector.hits, by_text], k)
    return Answer(query=query, model=scope.model, hits=hits, exact=by_vector.exact, mode=mode)
