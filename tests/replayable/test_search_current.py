"""A search answers under what the pipeline last asked for (ADR 0152): the settings of its
most recent complete run, or of a run it names; a run with other settings hides nothing
done under the settings searched, and the answer says what it covered."""

from __future__ import annotations

import pytest

from checks import TOPICS, rows, scalar, topic_pdfs
from replayable.search import SearchError, answer, searched

MODEL = "local-wordllama-256"
pytestmark = pytest.mark.db

QUESTION = "when do you collect honey from a hive"


@pytest.fixture
def folder(tmp_path):
    return topic_pdfs(tmp_path / "topics", TOPICS)


def _run(run_in_process, conf):
    report = run_in_process(conf)
    assert not report["_failed"], report
    return report["run_id"]


def _documents(found) -> set[str]:
    return {hit.uri.rsplit("/", 1)[-1] for hit in found.hits}


def test_a_run_with_another_chunk_size_hides_nothing_from_a_search(
    run_in_process, conn, dsn, folder
):
    """The whole folder under chunk_size 400: the search reads those settings (the run's),
    and finds every document; a re-run of one document under chunk_size 300 is not a
    complete run, and leaves the others where the search still finds them."""
    _run(run_in_process, {"source": str(folder), "model": MODEL})
    before = answer(conn, QUESTION, dsn=dsn, k=len(TOPICS) * 4)
    assert _documents(before) == set(TOPICS)

    second = _run(run_in_process, {"source": str(folder), "model": MODEL, "chunk_size": 400})
    found = answer(conn, QUESTION, dsn=dsn, k=len(TOPICS) * 4)
    assert found.run_id == second
    assert _documents(found) == set(TOPICS)
    assert found.coverage is not None and found.coverage.documents == len(TOPICS)

    bees = next(hit.doc_id for hit in found.hits if hit.uri.endswith("bees.pdf"))
    _run(
        run_in_process,
        {
            "source": str(folder),
            "model": MODEL,
            "chunk_size": 300,
            "rerun": {"doc_ids": [bees], "stage": "chunk", "status": ["done"]},
        },
    )
    after = answer(conn, QUESTION, dsn=dsn, k=len(TOPICS) * 4)
    assert after.run_id == second, "a re-run is not the pipeline's current settings"
    assert _documents(after) == set(TOPICS)
    assert after.coverage is not None and after.coverage.documents == len(TOPICS)


def test_a_search_says_what_it_searched_and_what_it_left_out(run_in_process, conn, dsn, folder):
    """Model, dimensions, whose settings, how many documents, and why the others are out."""
    first = _run(run_in_process, {"source": str(folder), "model": MODEL})
    two = sorted(TOPICS)[:2]
    subset = topic_pdfs(folder.parent / "subset", {name: TOPICS[name] for name in two})
    second = _run(run_in_process, {"source": str(subset), "model": MODEL, "chunk_size": 400})

    found = answer(conn, QUESTION, dsn=dsn)
    assert (found.model, found.run_id) == (MODEL, second)
    assert found.coverage is not None
    # The same documents (same bytes) done under the second run's settings; the rest are
    # done only under the first's, and their current item is the first run's.
    assert found.coverage.documents == 2
    assert found.coverage.left_out == {"other_settings": len(TOPICS) - 2}
    sentence = searched(found.as_dict())
    assert MODEL in sentence and second in sentence
    assert f"left out: {len(TOPICS) - 2} embedded only under other settings" in sentence

    named = answer(conn, QUESTION, dsn=dsn, run_id=first, k=len(TOPICS) * 4)
    assert named.run_id == first
    assert _documents(named) == set(TOPICS)
    assert named.coverage is not None and named.coverage.documents == len(TOPICS)
    assert named.as_dict()["coverage"]["left_out"] == {}


def test_what_a_search_covered_is_counted_again_only_when_stale(run_in_process, conn, dsn, folder):
    """The count reads every current embed item (seconds at a million documents): it is
    kept per settings, and counted again after a run's report or when older than the
    freshness bound."""
    _run(run_in_process, {"source": str(folder), "model": MODEL})
    first = answer(conn, QUESTION, dsn=dsn)
    assert first.coverage is not None and first.coverage.counted_at is not None
    assert first.coverage.documents == len(TOPICS)
    with conn.cursor() as cur:  # a count the next search can tell from a new one
        cur.execute("UPDATE replayable.search_coverage SET documents = 99")
    conn.commit()
    kept = answer(conn, QUESTION, dsn=dsn)
    assert kept.coverage is not None and kept.coverage.documents == 99
    assert "counted " in searched(kept.as_dict())

    _run(run_in_process, {"source": str(folder), "model": MODEL})  # a new report
    again = answer(conn, QUESTION, dsn=dsn)
    assert again.coverage is not None and again.coverage.documents == len(TOPICS)
    assert again.coverage.counted_at > first.coverage.counted_at


def test_a_run_that_does_not_exist_is_refused_naming_it(run_in_process, conn, dsn, folder):
    _run(run_in_process, {"source": str(folder), "model": MODEL})
    with pytest.raises(SearchError, match="run: document_pipeline has no finished run 'nope'"):
        answer(conn, QUESTION, dsn=dsn, run_id="nope")


def _hit_scores(conn, found, dimensions: int) -> list[float]:
    """The similarity of each hit's vector of ``MODEL`` at ``dimensions`` (0: its own size)
    with the question's vector cached at the same dimensions."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT 1 - (e.embedding <=> q.embedding)"
            " FROM unnest(%s::text[]) WITH ORDINALITY AS h (chunk_id, n)"
            " JOIN replayable.embeddings e ON e.chunk_id = h.chunk_id AND e.model = %s"
            "  AND e.dimensions = %s"
            " JOIN replayable.query_vectors q ON q.model = e.model AND q.dimensions = e.dimensions"
            " ORDER BY h.n",
            ([hit.chunk_id for hit in found.hits], MODEL, dimensions),
        )
        scores = [row[0] for row in cur.fetchall()]
    conn.rollback()
    return scores


def test_a_run_at_other_dimensions_embeds_again_and_search_reads_both(
    run_in_process, conn, dsn, folder, model
):
    """The model's own size, then 64 dimensions: the second run buys every chunk again at
    64 (each once), the ledger keeps both sets, a search of the current settings reads the
    64-d vectors and one that names the dimensions (0: the model's own) the others; a third
    run at 64 buys nothing."""
    first = _run(run_in_process, {"source": str(folder), "model": MODEL})
    chunks = scalar(conn, "SELECT count(DISTINCT chunk_id) FROM replayable.doc_chunks")
    model.reset_stats()

    second = _run(run_in_process, {"source": str(folder), "model": MODEL, "dimensions": 64})
    stats = model.stats()
    assert stats["inputs_embedded"] == chunks, stats
    assert set(stats["input_success_counts"].values()) == {1}
    assert rows(
        conn, "SELECT dim, count(*) FROM replayable.embeddings GROUP BY dim ORDER BY dim"
    ) == [(64, chunks), (256, chunks)]

    current = answer(conn, QUESTION, dsn=dsn, mode="vector", k=len(TOPICS) * 4)
    assert (current.run_id, current.dimensions) == (second, 64)
    assert _documents(current) == set(TOPICS)
    assert [h.score for h in current.hits] == pytest.approx(_hit_scores(conn, current, 64))

    own = answer(conn, QUESTION, dsn=dsn, mode="vector", k=len(TOPICS) * 4, dimensions=0)
    assert (own.run_id, own.dimensions) == (second, None)
    assert _documents(own) == set(TOPICS)
    assert [h.score for h in own.hits] == pytest.approx(_hit_scores(conn, own, 0))
    assert own.coverage is not None and own.coverage.documents == len(TOPICS)
    assert answer(conn, QUESTION, dsn=dsn, run_id=first, mode="vector").dimensions is None

    model.reset_stats()
    _run(run_in_process, {"source": str(folder), "model": MODEL, "dimensions": 64})
    assert model.stats()["charged"] == 0
