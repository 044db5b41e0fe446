"""PDFium is native code: its crashes, hangs and memory blow-ups cost one item, classified.

Each input here is a real one PDFium fails on, run through the guarded worker pool the extract
stage uses (ADR 0103); the pool works on afterwards.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import corpus
from replayable.guards import GuardedPool, GuardError
from replayable.stages.extract.pdf import extract_pdf

# The containment tier: each test spends CPU, memory or time on purpose to prove a limit.
pytestmark = pytest.mark.containment

SAMPLE = sorted((Path(__file__).resolve().parents[4] / "data" / "samples").glob("*.pdf"))[0]


def _fails(pool: GuardedPool, data: bytes) -> GuardError:
    with pytest.raises(GuardError) as caught:
        pool.run(extract_pdf, data)
    assert pool.run(extract_pdf, SAMPLE.read_bytes()).engine == "pdfium"  # the pool works on
    return caught.value


def test_pdfium_aborting_at_the_memory_limit_is_memory():
    """The memory bomb's text fills PDFium's text page; at RLIMIT_AS its allocator aborts
    the process (SIGABRT), which the guard tells from a crash by the last address-space
    sample."""
    with GuardedPool(timeout_s=60, memory_mb=256) as pool:
        error = _fails(pool, corpus.memory_bomb_pdf_bytes(pages=1))
    assert error.error_class == "memory"
    assert "SIGABRT" in str(error)


def test_pdfium_laying_out_a_slow_page_is_a_timeout():
    """Thousands of form draws per page: PDFium takes about 0.3 s a page, 40 pages here."""
    with GuardedPool(timeout_s=1, memory_mb=512) as pool:
        error = _fails(pool, corpus.slow_pdf_bytes())
    assert error.error_class == "timeout"
