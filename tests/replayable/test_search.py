"""Search through the HNSW index of a model and dimension (ADR 0119): built on first use,
read through when it has candidates enough, and exact when it has not; the query's vector
is one budgeted request, recorded, and charged once by the provider."""

from __future__ import annotations

import json
import os
import random
import threading
import time

import pytest
from psycopg2.extras import execute_values

from checks import TOPICS, rows, scalar, topic_pdfs
from replayable import db
from replayable.budget import RequestBudget
from replayable.keys import sha256_bytes
from replayable.search import (
    Scope,
    SearchError,
    answer,
    ensure_index,
    index_name,
    scope_of,
    search,
)
from replayable.search import index as search_index
from replayable.search.vectors import MIN_POOL
from replayable.stages.embed.store import vector_literal

MODEL = "local-wordllama-256"
DIM = 256
pytestmark = pytest.mark.db

QUESTION = "when do you collect honey from a hive"


@pytest.fixture
def topics(run_in_process, conn, tmp_path):
    folder = topic_pdfs(tmp_path / "topics", TOPICS)
    assert not run_in_process({"source": str(folder), "model": MODEL})["_failed"]
    return folder


def _stale_vectors(conn, near: list[float], n: int) -> None:
    """``n`` vectors of the model nearer ``near`` than any document's, of chunks no current
    document holds (as a re-chunk leaves them)."""
    rng = random.Random(5)
    rows_ = []
    for i in range(n):
        noisy = [x + rng.gauss(0, 0.001) for x in near]
        rows_.append((f"stale-{i}", "stale text", noisy))
    with conn.cursor() as cur:
        execute_values(
            cur,
            "INSERT INTO replayable.chunks (chunk_id, text) VALUES %s",
            [(chunk_id, text) for chunk_id, text, _ in rows_],
        )
        execute_values(
            cur,
            "INSERT INTO replayable.embeddings (chunk_id, model, dim, embedding) VALUES %s",
            [(chunk_id, MODEL, DIM, vector_literal(vector)) for chunk_id, _, vector in rows_],
            template="(%s, %s, %s, %s::vector)",
        )
    conn.commit()


def _query_vector(conn, dsn) -> tuple[Scope, list[float]]:
    from replayable.search import embed_query

    scope, choice = scope_of(MODEL)
    return scope, embed_query(QUESTION, choice, dsn)


def test_the_first_search_builds_the_index_and_the_next_ones_read_through_it(
    topics, conn, dsn, model
):
    name = index_name(MODEL, DIM)
    assert not rows(conn, "SELECT 1 FROM pg_indexes WHERE indexname = %s", name)
    found = answer(conn, QUESTION, dsn=dsn, model=MODEL, k=3)
    assert found.hits[0].uri.endswith("bees.pdf") and not found.exact
    assert rows(
        conn,
        "SELECT indisvalid FROM pg_index WHERE indexrelid = %s::regclass",
        f"replayable.{name}",
    ) == [(True,)]
    assert not ensure_index(db.Database(dsn, autocommit=True), MODEL, DIM)  # built once

    # With enough vectors for the planner to prefer it, the search reads the index.
    scope, vector = _query_vector(conn, dsn)
    _stale_vectors(conn, [random.Random(i).uniform(-1, 1) for i in range(DIM)], 2000)
    params = {
        "vector": vector_literal(vector),
        "model": MODEL,
        "dimensions": 0,
        "config_hash": scope.config_hash,
        "extractor_version": scope.extractor_version,
        "chunker_key": scope.chunker_key,
        "source": None,
        "k": 3,
        "dim": DIM,
        "snippet": 300,
    }
    with conn.cursor() as cur:
        cur.execute("ANALYZE replayable.embeddings")
        nearest = db.sql("search/nearest_chunks").replace("{dim}", str(DIM))
        cur.execute("EXPLAIN " + nearest, {**params, "pool": 100})
        plan = "\n".join(row[0] for row in cur.fetchall())
    conn.rollback()
    assert f"Index Scan using {name}" in plan, plan
    through_index = search(conn, vector, scope, k=3)
    conn.rollback()
    assert not through_index.exact
    exact = db.fetch_all(conn, "search/best_chunks", params)
    conn.rollback()
    assert [h.chunk_id for h in through_index.hits] == [r["chunk_id"] for r in exact]


def test_when_the_index_candidates_are_all_stale_the_search_reads_every_vector(
    topics, conn, dsn, model
):
    scope, vector = _query_vector(conn, dsn)
    # More vectors nearer the question than any document's than the index gives
    # candidates: they are all of chunks no current document holds.
    _stale_vectors(conn, vector, MIN_POOL + 100)
    ensure_index(db.Database(dsn, autocommit=True), MODEL, DIM)
    found = search(conn, vector, scope, k=3)
    conn.rollback()
    assert found.exact
    assert found.hits[0].uri.endswith("bees.pdf")
    assert len(found.hits) == 3


def test_a_query_is_one_request_within_the_shared_budget_recorded_and_asked_once(
    topics, conn, dsn, model, monkeypatch
):
    key = "AIRFLOW_CONN_REPLAYABLE_MODEL"
    connection = json.loads(os.environ[key])
    connection["extra"] = {**connection.get("extra", {}), "max_in_flight": 1}
    monkeypatch.setenv(key, json.dumps(connection))
    _, choice = scope_of(MODEL)
    budget = RequestBudget(choice.provider.base_url, 1)
    holder = db.connect(dsn, autocommit=True)
    model.reset_stats()
    found: list = []
    try:
        with budget.slot(holder):  # the budget's only slot is taken by another sender
            searcher = threading.Thread(
                target=lambda: found.append(
                    answer(db.connect(dsn), QUESTION, dsn=dsn, model=MODEL, k=1)
                )
            )
            searcher.start()
            time.sleep(1.0)
            assert model.stats()["charged"] == 0  # it waits for the slot
            assert searcher.is_alive()
        searcher.join(30)
    finally:
        holder.close()
    assert found and found[0].hits[0].uri.endswith("bees.pdf")
    again = answer(conn, QUESTION, dsn=dsn, model=MODEL, k=1)  # the same question again
    assert again.hits == found[0].hits
    # Its vector is the ledger's (ADR 0142): no second request, whatever the provider
    # de-duplicates.
    stats = model.stats()
    assert stats["charged"] == 1 and stats["succeeded"] == 1
    assert scalar(conn, "SELECT count(*) FROM replayable.model_calls WHERE stage = 'search'") == 1
    assert scalar(conn, "SELECT count(*) FROM replayable.query_vectors") == 1


def test_a_model_without_vectors_is_refused_before_the_provider_is_paid(topics, conn, dsn, model):
    """The refusal names the models and dimensions the ledger has vectors of."""
    model.reset_stats()
    with pytest.raises(
        SearchError,
        match=f"model: the ledger has no vectors for 'mistyped'; it has vectors of '{MODEL}' "
        f"at its own size \\({DIM} dimensions\\)",
    ):
        answer(conn, QUESTION, dsn=dsn, model="mistyped")
    assert model.stats()["charged"] == 0
    assert not rows(conn, "SELECT 1 FROM pg_indexes WHERE indexname LIKE 'embeddings_hnsw_%%'")


def test_a_search_that_names_no_model_reads_the_model_that_holds_the_vectors(topics, conn, dsn):
    """The run embedded with another model than the connection's default: a search without
    a model reads that one, as the demo's search does after `make demo`."""
    default_model = scope_of(None)[0].model
    assert default_model != MODEL
    found = answer(conn, QUESTION, dsn=dsn)
    assert found.model == MODEL
    assert found.hits


def test_a_question_of_another_dimension_is_refused_naming_the_dimensions_held(topics, conn, dsn):
    """Vectors at the model's own size (256), a search at 64 dimensions: no comparison across
    dimensions (which Postgres refuses), but a refusal that blames the dimensions and names
    what the ledger holds; and a question whose length is not the vectors' is refused too."""
    scope, vector = _query_vector(conn, dsn)
    at_64, _ = scope_of(MODEL, dimensions=64)
    with pytest.raises(
        SearchError,
        match=f"dimensions: the ledger has no vectors for '{MODEL}' at 64 dimensions; it has "
        f"vectors of '{MODEL}' at its own size \\(256 dimensions\\)",
    ):
        search(conn, vector[:64], at_64, query=QUESTION)
    with pytest.raises(SearchError, match=f"'{MODEL}' at its own size \\(64 dimensions\\)"):
        search(conn, vector[:64], scope, query=QUESTION)


def test_the_index_build_is_given_the_memory_of_its_whole_graph(conn, dsn, monkeypatch):
    """An HNSW graph that outgrows maintenance_work_mem is built on disk, several times
    slower (8-10 min against 2.5 at a million vectors): the build's memory is sized from
    the vectors it will hold, not fixed."""
    import numpy as np
    from psycopg2.extras import execute_values

    monkeypatch.setattr(search_index, "BUILD_MEMORY_MIN_MB", 1)
    vectors = np.random.default_rng(3).normal(size=(5_000, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    with conn.cursor() as cur:
        ids = [f"fits-{i}" for i in range(len(vectors))]
        execute_values(
            cur, "INSERT INTO replayable.chunks (chunk_id, text) VALUES %s", [(i, "x") for i in ids]
        )
        execute_values(
            cur,
            "INSERT INTO replayable.embeddings (chunk_id, model, dim, embedding) VALUES %s",
            [(f"fits-{i}", "fits", DIM, vector_literal(v.tolist())) for i, v in enumerate(vectors)],
            template="(%s, %s, %s, %s::vector)",
        )
    conn.commit()
    database = db.Database(dsn, autocommit=True)
    try:
        assert ensure_index(database, "fits", DIM)
        assert not [n for n in database.conn.notices if "no longer fits" in n]
    finally:
        database.close()
    name = f"replayable.{index_name('fits', DIM)}"
    assert scalar(conn, "SELECT indisvalid FROM pg_index WHERE indexrelid = %s::regclass", name)


def _vector_rows(conn, model: str, vectors: list[list[float]], dim: int) -> None:
    """Vectors of ``model`` recorded at ``dim`` dimensions, of chunks of their own."""
    with conn.cursor() as cur:
        for i, vector in enumerate(vectors):
            cur.execute(
                "INSERT INTO replayable.chunks (chunk_id, text) VALUES (%s, 'x')", (f"{model}-{i}",)
            )
            cur.execute(
                "INSERT INTO replayable.embeddings (chunk_id, model, dim, embedding)"
                " VALUES (%s, %s, %s, %s::vector)",
                (f"{model}-{i}", model, dim, vector_literal(vector)),
            )
    conn.commit()


def test_a_search_never_waits_for_an_index_another_search_is_building(conn, dsn):
    """While a builder holds the index's build, ensure_index returns at once without
    building: the search reads every vector instead of holding a UI slot (ADR 0137)."""
    _vector_rows(conn, "building", [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], 3)
    name = index_name("building", 3)
    key = int(sha256_bytes(f"replayable-search-index\x00{name}".encode())[:15], 16)
    holder = db.connect(dsn, autocommit=True)
    outcome: dict[str, bool] = {}
    try:
        with holder.cursor() as cur:
            cur.execute("SELECT pg_advisory_lock(%s)", (key,))

        def call() -> None:
            outcome["built"] = ensure_index(db.Database(dsn, autocommit=True), "building", 3)

        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        thread.join(timeout=60)
        assert not thread.is_alive(), "ensure_index waited for the other builder"
        assert outcome == {"built": False}
        assert not rows(conn, "SELECT 1 FROM pg_indexes WHERE indexname = %s", name)
    finally:
        holder.close()  # ends the session, and so its lock: a waiting call would go on
    thread.join(timeout=60)


def test_a_failed_index_build_is_not_tried_again_by_every_search(conn, dsn, monkeypatch):
    """A build that fails leaves an invalid index, recorded as failed: the searches after it
    read every vector and leave it be; the first after the pause builds it again."""
    # A vector recorded at 3 dimensions that has 2: the build's cast to vector(3) fails.
    _vector_rows(conn, "broken", [[1.0, 0.0, 0.0], [0.0, 1.0]], 3)
    name = index_name("broken", 3)
    database = db.Database(dsn, autocommit=True)

    def failures() -> list[tuple[int, int]]:
        return rows(
            conn,
            "SELECT b.failures, c.oid::int FROM replayable.search_index_builds b"
            " JOIN pg_class c ON c.relname = b.name WHERE b.name = %s",
            name,
        )

    try:
        assert ensure_index(database, "broken", 3) is False
        first = failures()
        assert [n for n, _ in first] == [1]
        for _ in range(3):
            assert ensure_index(database, "broken", 3) is False
        assert failures() == first  # not dropped, not built again

        monkeypatch.setattr(search_index, "BUILD_RETRY_AFTER_S", 0)
        assert ensure_index(database, "broken", 3) is False
        assert [n for n, _ in failures()] == [2]
    finally:
        database.close()


CODED = {**TOPICS, "remittance.pdf": "Remittance advice QX-4417-B: the supplier was paid twice."}


@pytest.fixture
def coded(run_in_process, conn, tmp_path):
    """The topics and a document that holds a code no embedding model knows."""
    folder = topic_pdfs(tmp_path / "coded", CODED)
    assert not run_in_process({"source": str(folder), "model": MODEL})["_failed"]
    return folder


def test_a_text_search_finds_the_chunks_that_share_the_questions_words_with_no_model_call(
    coded, conn, dsn, model
):
    model.reset_stats()
    found = answer(conn, "which payment was QX-4417-B", dsn=dsn, model=MODEL, mode="text")
    assert found.mode == "text"
    # The code in one, "payment" in the ledger's: each word counts, the most matched first.
    assert [hit.uri.rsplit("/", 1)[-1] for hit in found.hits] == ["remittance.pdf", "ledger.pdf"]
    assert model.stats()["charged"] == 0
    assert rows(conn, "SELECT 1 FROM pg_indexes WHERE indexname = 'chunks_text_search'")


def test_a_hybrid_search_puts_first_what_both_rankings_find(coded, conn, dsn):
    """By default a search fuses the two rankings: the chunk that holds the question's code
    comes first, and a question in other words still finds its document by meaning."""
    coded_first = answer(conn, "which payment was QX-4417-B", dsn=dsn, model=MODEL)
    assert coded_first.mode == "hybrid"
    assert coded_first.hits[0].uri.endswith("remittance.pdf")
    scores = [hit.score for hit in coded_first.hits]
    assert scores == sorted(scores, reverse=True)
    by_meaning = answer(conn, QUESTION, dsn=dsn, model=MODEL)
    assert by_meaning.hits[0].uri.endswith("bees.pdf")


def test_a_search_in_an_unknown_mode_is_refused_naming_the_modes(coded, conn, dsn):
    with pytest.raises(SearchError, match="mode: one of vector, text, hybrid, not 'fuzzy'"):
        answer(conn, QUESTION, dsn=dsn, model=MODEL, mode="fuzzy")


def test_fusion_ranks_by_reciprocal_rank_and_breaks_ties_by_document_and_chunk():
    from replayable.search import Hit, fuse

    def hit(doc: str, ordinal: int = 0) -> Hit:
        return Hit(doc, f"/{doc}", ordinal, f"{doc}{ordinal}", 0.5, "")

    vector = [hit("a"), hit("b"), hit("c")]
    text = [hit("c"), hit("d")]
    fused = fuse([vector, text], 3)
    # c: 1/8 + 1/6 beats a's 1/6 alone; b and d tie at 1/7, b's document first.
    assert [(h.doc_id, round(h.score, 5)) for h in fused] == [
        ("c", round(1 / 8 + 1 / 6, 5)),
        ("a", round(1 / 6, 5)),
        ("b", round(1 / 7, 5)),
    ]
