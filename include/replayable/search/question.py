"""A question's vector: kept in the ledger, or paid for once within the shared budget
(ADR 0142)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from replayable import db
from replayable.db import Database, fetch_all
from replayable.keys import sha256_bytes
from replayable.search.index import ensure_index
from replayable.search.model import Scope
from replayable.stages.embed import stored_dimensions
from replayable.stages.embed.store import vector_literal

if TYPE_CHECKING:
    from replayable.models.embeddings import HttpEmbeddingClient

STAGE = "search"  # the model_calls rows of query embeddings


def embed_query(
    query: str,
    choice: Any,
    dsn: str,
    searched_by: str | None = None,
) -> list[float]:
    """The query's vector: the one stored for this question, model and dimensions (ADR
    0142), or one from the model ``choice`` names, sent within the shared budget (a slot and
    a send time, as every model request), recorded as a ``search`` call of ``searched_by``
    (ADR 0153) and stored."""
    cached = {
        "model": choice.model,
        "dimensions": stored_dimensions(choice.dimensions),
        "query_hash": sha256_bytes(query.encode()),
    }
    database = Database(dsn)
    try:
        found = database.transaction(
            lambda conn: fetch_all(conn, "search/cached_query", cached), describe="search/cached"
        )
        if found:
            return [float(x) for x in str(found[0]["embedding"]).strip("[]").split(",")]
        vector = _paid_query_vector(query, choice, dsn, searched_by)
        stored = {**cached, "embedding": vector_literal(vector)}
        database.transaction(
            lambda conn: db.execute(conn, "search/store_query", stored), describe="search/store"
        )
    finally:
        database.close()
    return vector


def _paid_query_vector(query: str, choice: Any, dsn: str, searched_by: str | None) -> list[float]:
    """The query's vector from the provider, within the shared budget, recorded as a call."""
    from replayable.budget import RequestBudget
    from replayable.models.clients import embedding_client
    from replayable.models.http import CallRecord
    from replayable.stages.embed.packing import estimate_tokens
    from replayable.stages.model_calls import correct_tokens, record_calls

    # The dimensions are in the key: a provider that remembers keys would answer the same
    # question at another size with the vector it gave first (ADR 0151).
    dims = stored_dimensions(choice.dimensions)
    key = "replayable-search-" + sha256_bytes(f"{choice.model}\x00{dims}\x00{query}".encode())[:40]
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
    client: HttpEmbeddingClient = embedding_client(
        choice.provider, model=choice.model, dimensions=choice.dimensions, max_in_flight=1
    )
    # Exactly the choice's: None is the model's own size, whatever the connection's default.
    client.dimensions = choice.dimensions
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
                    conn,
                    calls,
                    stage=STAGE,
                    run_id=None,
                    attempt=1,
                    share={key: 1},
                    searched_by=searched_by,
                ),
                describe="record the query's model calls",
            )
        finally:
            database.close()
    return list(vector)


def vector_for(
    query: str,
    scope: Scope,
    choice: Any,
    dsn: str,
    searched_by: str | None = None,
) -> list[float]:
    """The question's vector (:func:`embed_query`), with the index of its model, dimensions
    and length built if this is their first search; writes through ``dsn`` only."""
    vector = embed_query(query, choice, dsn, searched_by)
    builder = Database(dsn, autocommit=True)
    try:
        dimensions = stored_dimensions(scope.dimensions)
        ensure_index(builder, scope.model, len(vector), dimensions=dimensions)
    finally:
        builder.close()
    return vector
