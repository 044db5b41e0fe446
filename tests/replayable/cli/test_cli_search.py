"""``replayable search`` against vectors the pipeline stored, through the model connection
(the local server's real model, ``local-wordllama-256``; ADR 0118)."""

from __future__ import annotations

import json

import pytest

from checks import TOPICS, subset, topic_pdfs
from replayable.cli import main

MODEL = "local-wordllama-256"
pytestmark = pytest.mark.db


def _search(capsys, dsn, *args):
    capsys.readouterr()
    code = main(["--dsn", dsn, "--json", "search", *args])
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if code == 0 else captured.err)


def test_a_question_finds_the_document_that_answers_it_first(
    run_in_process, conn, dsn, model, tmp_path, capsys
):
    folder = topic_pdfs(tmp_path / "topics", TOPICS)
    subset(tmp_path, 4)  # other documents, in docs/: --source leaves them out
    assert not run_in_process({"source": str(tmp_path), "model": MODEL})["_failed"]
    for question, answer in (
        ("How can a loaf rise without yeast from a shop?", "bread.pdf"),
        ("creatures that hide in rock pools by the seaside", "tides.pdf"),
        ("when do you collect honey from a hive", "bees.pdf"),
    ):
        code, found = _search(capsys, dsn, question, "--model", MODEL, "--k", "3")
        assert code == 0, found
        assert found["hits"][0]["uri"].endswith(answer), (question, found["hits"])
    code, found = _search(
        capsys, dsn, "closing the books", "--model", MODEL, "--source", str(folder)
    )
    assert code == 0 and found["model"] == MODEL
    hits = found["hits"]
    assert hits[0]["uri"].endswith("ledger.pdf")
    assert len(hits) == len(TOPICS)  # only the four under --source, one chunk each
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    assert "invoice and payment" in hits[0]["snippet"]


def test_an_empty_query_or_a_model_without_vectors_is_refused_naming_the_input(
    run_in_process, conn, dsn, model, tmp_path, capsys
):
    assert not run_in_process({"source": str(subset(tmp_path, 2))})["_failed"]
    code, error = _search(capsys, dsn, "   ")
    assert code == 2 and "query:" in error
    code, error = _search(capsys, dsn, "anything", "--model", "no-such-model")
    assert code == 2 and "model: the ledger has no vectors for 'no-such-model'" in error


def test_cli_searches_count_under_the_os_user_and_are_not_rated(
    run_in_process, conn, dsn, model, tmp_path, capsys, monkeypatch
):
    """ADR 0153: the CLI's searches are counted, as ``cli:<OS user>``, past any UI limit."""
    import getpass

    from checks import rows

    monkeypatch.setenv("AIRFLOW__REPLAYABLE__SEARCHES_PER_USER_PER_MINUTE", "1")
    assert not run_in_process({"source": str(subset(tmp_path, 2)), "model": MODEL})["_failed"]
    for _ in range(3):
        code, found = _search(capsys, dsn, "a report on the warehouse", "--model", MODEL)
        assert code == 0, found
    user = f"cli:{getpass.getuser()}"
    counted = rows(conn, "SELECT username, searches, paid_calls FROM replayable.search_counts")
    assert counted == [(user, 3, 1)]
    paid = rows(conn, "SELECT searched_by FROM replayable.model_calls WHERE stage = 'search'")
    assert paid == [(user,)]


def test_dimensions_names_the_vectors_of_another_size_and_a_size_without_any_is_refused(
    run_in_process, conn, dsn, model, tmp_path, capsys
):
    """After runs at the model's own size and at 64 dimensions, a search reads the last
    run's 64; ``--dimensions 0`` the own size's; a size with no vectors is refused naming
    those the ledger holds (ADR 0151)."""
    folder = topic_pdfs(tmp_path / "topics", TOPICS)
    for dimensions in (None, 64):
        conf = {"source": str(folder), "model": MODEL, "dimensions": dimensions}
        assert not run_in_process(conf)["_failed"]
    question = "when do you collect honey from a hive"
    code, found = _search(capsys, dsn, question, "--mode", "vector")
    assert code == 0 and found["dimensions"] == 64, found
    code, own = _search(capsys, dsn, question, "--mode", "vector", "--dimensions", "0")
    assert code == 0 and own["dimensions"] is None, own
    assert own["hits"][0]["uri"].endswith("bees.pdf")
    assert {h["score"] for h in own["hits"]}.isdisjoint(h["score"] for h in found["hits"])

    code, error = _search(capsys, dsn, question, "--dimensions", "32")
    assert code == 2
    assert (
        f"dimensions: the ledger has no vectors for '{MODEL}' at 32 dimensions; it has vectors "
        f"of '{MODEL}' at its own size (256 dimensions), '{MODEL}' at 64 dimensions" in error
    )
    with pytest.raises(SystemExit):
        main(["--dsn", dsn, "search", question, "--dimensions", "-1"])
    assert "--dimensions: a whole number from 1 to 8192, or 0" in capsys.readouterr().err
