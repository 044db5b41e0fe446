"""embed_mode "batch" where documents share chunks and the provider refuses or loses lines
(ADR 0146): a refused chunk ends every document that holds it, whoever collects the line,
and a line is never bought twice. Charges are counted at the local provider."""

from __future__ import annotations

import pytest
from test_batch_mode import _batch_spec, _charged_twice, _try

from checks import assert_nothing_lost, rows, seed_extraction
from replayable.keys import sha256_bytes
from replayable.stages.chunk.chunker import ChunkConfig, chunk_text

pytestmark = pytest.mark.db

BOILERPLATE = " ".join(f"Standard clause {j} applies to every shipment." for j in range(8))


def _body(tag: str, poison: str = "") -> str:
    """Sentences of the same shape for every ``tag`` of the same length, so that the
    boilerplate after them is cut into the same chunks."""
    words = [f"{tag} sentence {j:02d} about item {j % 7}." for j in range(12)]
    if poison:
        words[5] = f"{tag} sentence 05 about {poison}"
    return " ".join(words)


def _seed(conn, dsn, texts: dict[str, str]) -> dict[str, str]:
    """Documents (by name) with these texts, extracted and chunked; return their ids."""
    import test_batch_mode
    from test_embed_sessions import CHUNKS

    from replayable import db
    from replayable.ledger import RunContext
    from replayable.runner import run_batch
    from replayable.stages.chunk.spec import ChunkSpec

    test_batch_mode.CHUNKS = CHUNKS
    ids = {}
    for name, text in texts.items():
        doc_id = sha256_bytes(f"{name}\n{text}".encode())  # byte-different files
        seed_extraction(conn, doc_id, f"/docs/{name}.pdf", text)
        ids[name] = doc_id
    conn.commit()

    def connect():
        return db.Database(dsn, outage_s=30)

    run_batch(
        ChunkSpec(config=CHUNKS, connect=connect),
        sorted(ids.values()),
        connect=connect,
        ctx=RunContext(owner="chunker", run_id="r"),
    )
    return ids


def _chunks(text: str) -> set[str]:
    from test_embed_sessions import CHUNKS

    return {chunk.chunk_id for chunk in chunk_text(text, ChunkConfig(CHUNKS.size, CHUNKS.overlap))}


def _settle(spec, connect, doc_ids, passes=8, first=1):
    """Run a task's passes until it stops waiting for a batch; return the last result."""
    for n in range(first, first + passes):
        result = _try(spec, connect, doc_ids, n)
        if result.systemic is None or result.systemic.error_class != "batch_waiting":
            return result
    pytest.fail(f"still waiting for a batch after {passes} passes: {spec.waiting_on}")


def _states(conn) -> dict[str, tuple[str, int]]:
    return {
        doc: (status, attempts)
        for doc, status, attempts in rows(
            conn, "SELECT doc_id, status, attempts FROM replayable.stage_runs WHERE stage = 'embed'"
        )
    }


def _lines_with(conn, chunk_id: str) -> int:
    return len(
        rows(
            conn,
            "SELECT 1 FROM replayable.provider_batch_lines WHERE %s = ANY(chunk_ids)",
            chunk_id,
        )
    )


def test_a_refused_chunk_two_documents_share_ends_both_dead_naming_it(conn, dsn, model):
    """Two copies of one text hold a chunk the provider refuses: each ends dead with the
    chunk named in its letter, after a bounded number of lines, and the clean document is
    done."""
    poisoned = _body("alpha", poison="POISON-400.") + " " + BOILERPLATE
    ids = _seed(conn, dsn, {"d1": poisoned, "d2": poisoned, "clean": _body("gamma")})
    (bad,) = {c for c in _chunks(poisoned) if "POISON" in _text(conn, c)}
    model.set_faults(batch_delay_s=0, batch_fail_inputs_containing={"POISON-400": 400})
    spec, connect = _batch_spec(dsn, model, inputs_per_call=64)
    _settle(spec, connect, sorted(ids.values()))
    states = _states(conn)
    assert states[ids["clean"]] == ("done", 1)
    assert states[ids["d1"]][0] == states[ids["d2"]][0] == "dead"
    letters = rows(
        conn, "SELECT doc_id, error_class, error FROM replayable.dead_letters ORDER BY doc_id"
    )
    assert sorted(doc for doc, _, _ in letters) == sorted([ids["d1"], ids["d2"]])
    for _, error_class, error in letters:
        assert error_class == "http_400" and bad in error
    assert _lines_with(conn, bad) <= 2  # the line it was packed in, then alone
    assert _charged_twice(model) == {}
    assert_nothing_lost(conn, one_version=False)


def _text(conn, chunk_id: str) -> str:
    return rows(conn, "SELECT text FROM replayable.chunks WHERE chunk_id = %s", chunk_id)[0][0]


def test_a_task_that_collects_anothers_refused_line_does_not_dead_letter_its_clean_document(
    conn, dsn, model
):
    """A and C share boilerplate chunks; A's line holds A's bad input and the shared chunks.
    C's task collects that line first: C is done, and only A is dead, naming its chunk."""
    a_text = _body("alpha", poison="POISON-400.") + " " + BOILERPLATE
    c_text = _body("gamma", poison="CLEAN-0000.") + " " + BOILERPLATE  # the same lengths
    ids = _seed(conn, dsn, {"a": a_text, "c": c_text})
    shared = _chunks(a_text) & _chunks(c_text)
    (bad,) = {c for c in _chunks(a_text) if "POISON" in _text(conn, c)}
    assert shared and bad not in shared
    model.set_faults(batch_delay_s=0, batch_fail_inputs_containing={"POISON-400": 400})
    spec, connect = _batch_spec(dsn, model, inputs_per_call=64)
    first = _try(spec, connect, [ids["a"]], 1)  # A's task sends one line with all its chunks
    assert first.systemic is not None and first.systemic.error_class == "batch_waiting"
    _settle(spec, connect, [ids["c"]], first=10)  # C's task collects A's line first
    assert _states(conn)[ids["c"]] == ("done", 1)
    _settle(spec, connect, [ids["a"]], first=20)
    assert _states(conn)[ids["a"]][0] == "dead"
    ((doc, error),) = rows(conn, "SELECT doc_id, error FROM replayable.dead_letters")
    assert doc == ids["a"] and bad in error
    assert _charged_twice(model) == {}
    assert_nothing_lost(conn, one_version=False)


def test_a_line_a_completed_batch_does_not_return_is_never_sent_again(
    conn, dsn, model, monkeypatch
):
    """The provider completes a batch whose output lacks one line (charged, or not): the
    line is not sent again, and its document ends dead naming the chunk."""
    import contextlib
    import json

    from replayable.models.batch_api import BatchApi

    texts = {"x": _body("alpha") + " The end of x.", "y": _body("gamma") + " The end of y."}
    ids = _seed(conn, dsn, texts)
    x_only = sorted(_chunks(texts["x"]) - _chunks(texts["y"]))
    model.set_faults(batch_delay_s=0)
    spec, connect = _batch_spec(dsn, model, inputs_per_call=1)  # a line per chunk
    result_lines, dropped = BatchApi.result_lines, []

    def is_dropped(raw):
        line = json.loads(raw)
        if dropped or line["response"]["status_code"] != 200:
            return False
        cid = rows(
            conn,
            "SELECT chunk_ids[1] FROM replayable.provider_batch_lines WHERE custom_id = %s",
            line["custom_id"],
        )[0][0]
        if cid == x_only[0]:
            dropped.append(cid)
        return bool(dropped)

    @contextlib.contextmanager
    def without_one_line(self, file_id):
        with result_lines(self, file_id) as lines:
            yield (raw for raw in lines if not is_dropped(raw))

    monkeypatch.setattr(BatchApi, "result_lines", without_one_line)
    _settle(spec, connect, sorted(ids.values()))
    assert dropped == [x_only[0]]
    states = _states(conn)
    assert states[ids["y"]] == ("done", 1)
    assert states[ids["x"]][0] == "dead"
    ((error_class, error),) = rows(conn, "SELECT error_class, error FROM replayable.dead_letters")
    assert error_class == "batch_line_lost" and x_only[0] in error
    assert _lines_with(conn, x_only[0]) == 1
    assert _charged_twice(model) == {}
    assert_nothing_lost(conn, one_version=False)


def test_a_sync_run_never_buys_again_a_chunk_whose_line_a_completed_batch_lost(conn, dsn, model):
    """A completed batch charged a line and returned nothing for it (ADR 0146): the chunk is
    not bought again in either mode. A byte-different copy of the text, embedded in sync
    mode later, ends dead naming the chunk and the line, with no request charged."""
    text = _body("alpha") + " The end of the report."
    ids = _seed(conn, dsn, {"x": text, "copy": text})
    model.set_faults(batch_delay_s=0, batch_lose_lines_rate=1.0)
    spec, connect = _batch_spec(dsn, model, inputs_per_call=1)
    _settle(spec, connect, [ids["x"]])
    assert _states(conn)[ids["x"]][0] == "dead"
    lost = model.stats()["batch_lines_lost"]
    assert lost == len(_chunks(text))

    model.set_faults(batch_delay_s=0)
    sync, connect = _batch_spec(dsn, model, inputs_per_call=1)
    sync.mode = "sync"
    _try(sync, connect, [ids["copy"]], 1)
    assert model.stats()["charged"] == 0  # no synchronous request bought a lost chunk
    assert _states(conn)[ids["copy"]] == ("dead", 1)
    classes = rows(
        conn,
        "SELECT error_class, error FROM replayable.dead_letters WHERE doc_id = %s",
        ids["copy"],
    )
    assert [c for c, _ in classes] == ["batch_line_lost"]
    assert "a completed batch returned no result for line" in classes[0][1]
    assert_nothing_lost(conn, one_version=False)
