"""A search answers under what the pipeline last asked for (ADR 0152): the settings of its
most recent complete run, or of a run it names; a run with other settings hides nothing
done under the settings searched, and the answer says what it covered."""

from __future__ import annotations

import pytest

from checks import TOPICS, topic_pdfs
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
