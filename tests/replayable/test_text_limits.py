"""Terminal limits on a document's text: a text layer too large for the task ends dead.

A PDF whose text layer is hundreds of megabytes would be carried into the task process,
flushed and chunked there, and OOM-kill every try. ``max_text_chars`` is checked page by
page inside the guarded extraction worker and again before chunk reads a stored text;
``max_chunks_per_doc`` bounds the chunks; both end the item as ``oversize_text`` (ADR 0087).
"""

import pytest

from checks import seed_extraction
from corpus import pdf_bytes
from replayable import db, guards
from replayable.keys import sha256_bytes
from replayable.ledger import RunContext
from replayable.retry import ErrorKind, ItemError
from replayable.runner import Limits, run_batch
from replayable.stages.chunk import chunker
from replayable.stages.chunk.spec import ChunkSpec
from replayable.stages.extract import pdf

PARAGRAPHS = [f"Paragraph {i} of a long report about oversized text layers." * 4 for i in range(60)]


def test_extraction_stops_at_max_text_chars_as_oversize_text():
    data = pdf_bytes(PARAGRAPHS)
    full = pdf.extract_pdf(data)
    assert len(full.text) > 2000
    with pytest.raises(ItemError) as raised:
        pdf.extract_pdf(data, max_text_chars=1000)
    assert raised.value.error_class == "oversize_text"
    assert raised.value.kind is ErrorKind.TERMINAL
    assert "1000" in str(raised.value)


def test_a_text_within_the_limit_is_extracted_whole():
    data = pdf_bytes(PARAGRAPHS)
    full = pdf.extract_pdf(data)
    assert pdf.extract_pdf(data, max_text_chars=len(full.text) + 10).text == full.text


def test_the_limit_holds_inside_the_guarded_worker(tmp_path):
    """The oversize text never crosses into the task process: the worker refuses it."""
    path = tmp_path / "long.pdf"
    path.write_bytes(pdf_bytes(PARAGRAPHS))
    with (
        guards.GuardedPool(timeout_s=30, memory_mb=512, workers=1) as pool,
        pytest.raises(ItemError) as raised,
    ):
        pool.run(pdf.extract_file, str(path), None, 500)
    assert raised.value.error_class == "oversize_text"


def test_chunking_stops_past_max_chunks_as_oversize_text():
    text = " ".join(f"word{i}" for i in range(5000))
    config = chunker.ChunkConfig(size=100, overlap=10)
    assert len(chunker.chunk_text(text, config)) > 10
    with pytest.raises(ItemError) as raised:
        chunker.chunk_text(text, config, max_chunks=10)
    assert raised.value.error_class == "oversize_text"


def seed(conn, texts):
    ids = []
    for i, text in enumerate(texts):
        doc_id = sha256_bytes(f"doc {i}".encode())
        seed_extraction(conn, doc_id, f"/docs/l{i}.pdf", text)
        ids.append(doc_id)
    conn.commit()
    return ids


@pytest.mark.db
def test_the_chunk_stage_dead_letters_a_stored_text_over_the_limit_without_reading_it(
    conn, dsn, monkeypatch
):
    small, huge = seed(conn, ["a short text " * 20, "a stored text far over the limit " * 400])
    read = []
    real = ChunkSpec._texts

    def recording(self, conn, *, group):
        read.extend(item.doc_id for item in group)
        return real(self, conn, group=group)

    monkeypatch.setattr(ChunkSpec, "_texts", recording)
    spec = ChunkSpec(
        config=chunker.ChunkConfig(size=100, overlap=10),
        connect=lambda: db.Database(dsn),
        max_text_chars=5000,
    )
    result = run_batch(
        spec, [small, huge], connect=lambda: db.Database(dsn), ctx=RunContext(owner="w")
    )
    assert result.done == [small] and result.dead == [huge]
    assert huge not in read
    with conn.cursor() as cur:
        cur.execute("SELECT error_class, error FROM replayable.dead_letters")
        ((error_class, error),) = cur.fetchall()
    conn.commit()
    assert error_class == "oversize_text" and "max_text_chars" in error


@pytest.mark.db
def test_the_chunk_stage_dead_letters_a_document_with_too_many_chunks(conn, dsn):
    (doc,) = seed(conn, [" ".join(f"word{i}" for i in range(3000))])
    spec = ChunkSpec(
        config=chunker.ChunkConfig(size=100, overlap=10),
        connect=lambda: db.Database(dsn),
        max_chunks_per_doc=20,
    )
    result = run_batch(
        spec, [doc], connect=lambda: db.Database(dsn), ctx=RunContext(owner="w"), limits=Limits()
    )
    assert result.dead == [doc]
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM replayable.doc_chunks")
        assert cur.fetchone()[0] == 0
    conn.commit()
