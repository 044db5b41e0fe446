"""The chaos harness's own parts that need no Airflow: its documents and its judgement.

The scenarios themselves run through a real Airflow in ``make chaos``, every one at full
size, which CI runs (``.ci/run``); ``make test`` no longer repeats two of them at a smaller
size.
"""

from __future__ import annotations

import hashlib
import io

import pypdf
import pypdfium2

from chaos import documents, results
from chaos.reconcile import Reconciliation, _problems


def test_the_huge_text_document_is_small_on_disk_and_holds_300_mb_of_text() -> None:
    data = documents.huge_text_pdf_bytes()
    reader = pypdf.PdfReader(io.BytesIO(data))
    assert len(data) < documents.MAX_BYTES
    assert len(reader.pages) == documents.HUGE_PAGES
    page_text = reader.pages[0].extract_text()
    assert len(page_text) >= documents.HUGE_PAGE_CHARS
    assert len(page_text) * len(reader.pages) >= 300_000_000
    # PDFium reads only the text on the page: all of it lies there.
    document = pypdfium2.PdfDocument(data)
    try:
        assert len(document[0].get_textpage().get_text_bounded()) >= documents.HUGE_PAGE_CHARS
    finally:
        document.close()


def test_the_killer_document_sorts_after_every_other_id_given() -> None:
    others = [hashlib.sha256(bytes([n])).hexdigest() for n in range(256)]
    digest = hashlib.sha256(documents.killer_pdf_bytes(others)).hexdigest()
    assert digest > max(others) and digest.startswith("fff")


def test_the_killer_document_is_a_sound_pdf_whose_every_page_shows_its_word() -> None:
    data = documents.killer_pdf_bytes([], pages=3, draws=5)
    # Its variant comment is fixed-width, so the cross-reference table is where it says.
    start = int(data[data.rindex(b"startxref") :].split()[1])
    assert data[start:].startswith(b"xref")
    document = pypdfium2.PdfDocument(data)
    try:
        texts = [document[n].get_textpage().get_text_bounded() for n in range(len(document))]
    finally:
        document.close()
    # Every paint lands on one spot: one word per page, however many paints.
    assert [t.strip() for t in texts] == ["killer"] * 3


def _reconciliation(*, extra: int, lost_inputs: int, lost: int, allowed: int) -> Reconciliation:
    provider = {
        "chunks_charged_more_than_once": extra,
        "extra_chunk_charges": extra,
        "extra_key_charges": extra,
        "would_deduplicate": extra,
        "inputs_charged": 10 + extra,
        "chunks_charged": 10,
    }
    return Reconciliation(
        runs=[],
        duplicate_keys={},
        missing_outputs={},
        dead_letters=0,
        incomplete_letters=0,
        unexpected_dead=[],
        missing_dead=[],
        embeddings=10,
        paid_inputs_recorded=10,
        provider=provider,
        dedupe=False,
        lost_answers=lost,
        lost_inputs=lost_inputs,
        lost_allowed=allowed,
    )


def test_a_chunk_charged_again_after_its_answer_was_lost_is_the_physical_minimum() -> None:
    assert _problems(_reconciliation(extra=3, lost_inputs=3, lost=1, allowed=1), []) == []


def test_a_chunk_charged_twice_with_both_answers_kept_is_a_problem() -> None:
    problems = _problems(_reconciliation(extra=3, lost_inputs=1, lost=1, allowed=1), [])
    assert any("paid twice with both answers kept" in p for p in problems)


def test_more_answers_lost_than_the_fault_can_lose_is_a_problem() -> None:
    problems = _problems(_reconciliation(extra=2, lost_inputs=2, lost=2, allowed=1), [])
    assert any("more than the 1 the fault can lose" in p for p in problems)


def test_the_results_list_every_part_s_double_charges() -> None:
    part = {"label": "run", **_reconciliation(extra=2, lost_inputs=2, lost=1, allowed=1).to_json()}
    report = {"scenarios": [{"key": "a", "reconciliations": [part]}]}
    (row,) = results.charges(report)
    assert (row["scenario"], row["dedupe"], row["charged_twice"], row["lost_allowed"]) == (
        "(a) run",
        "off",
        2,
        1,
    )
    assert results.charges_table(report)[-1].startswith("| (a) run | off | 10 | 2 | 2 |")
