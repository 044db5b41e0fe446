"""Tests for tests/corpus.py: clean, reproducible samples and a poison corpus that bites."""

from __future__ import annotations

import hashlib
import io
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pypdf
import pytest
from pypdf.errors import EmptyFileError, FileNotDecryptedError, PdfReadError

import corpus
from replayable.guards import GuardedPool, GuardError, check_size

SAMPLES_DIR = Path(__file__).resolve().parent.parent / "data" / "samples"
OVERSIZE_BYTES = 1_000_000


def extract_pages(data: bytes) -> list[str]:
    """Extract text the way the pipeline does; module-level so a worker can unpickle it."""
    reader = pypdf.PdfReader(io.BytesIO(data))
    if reader.is_encrypted:
        raise PdfReadError("encrypted")
    return [page.extract_text() for page in reader.pages]


def digests(paths: list[Path]) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return corpus.write_sample_corpus(tmp_path_factory.mktemp("samples"))


@pytest.fixture(scope="module")
def sample_texts(samples: list[Path]) -> dict[str, list[str]]:
    return {p.name: extract_pages(p.read_bytes()) for p in samples}


@pytest.fixture(scope="module")
def poison(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return corpus.write_poison_corpus(tmp_path_factory.mktemp("poison"), OVERSIZE_BYTES)


@pytest.fixture(scope="module")
def guarded() -> Iterator[GuardedPool]:
    with GuardedPool(timeout_s=2, memory_mb=512) as pool:
        yield pool


def test_sample_corpus_is_byte_identical_across_runs(samples: list[Path], tmp_path: Path) -> None:
    """Two generations with the same n and seed write byte-identical files."""
    again = corpus.write_sample_corpus(tmp_path)
    assert digests(again) == digests(samples)


def test_committed_samples_match_the_generator(samples: list[Path]) -> None:
    """data/samples is exactly what `python tests/corpus.py` writes, so it can be regenerated."""
    committed = sorted(SAMPLES_DIR.glob("doc-*.pdf"))
    if not committed:
        pytest.skip("data/samples has not been generated")
    assert digests(committed) == digests(samples)


def test_first_documents_do_not_depend_on_n(samples: list[Path], tmp_path: Path) -> None:
    """Document i is the same whether 3 or 32 documents are generated."""
    assert digests(corpus.write_sample_corpus(tmp_path, n=3)) == digests(samples[:3])


def test_sample_corpus_shape(samples: list[Path]) -> None:
    """32 doc-NNN-<slug>.pdf files, each a few KB to ~150 KB, under 3 MB in all."""
    assert len(samples) == corpus.DEFAULT_N
    for index, path in enumerate(samples, start=1):
        assert re.fullmatch(rf"doc-{index:03d}-[a-z0-9-]+\.pdf", path.name)
    sizes = [p.stat().st_size for p in samples]
    assert 1_000 < min(sizes) < 5_000
    assert 100_000 < max(sizes) < 160_000
    assert sum(sizes) < 3_000_000


def test_every_sample_opens_and_has_text(sample_texts: dict[str, list[str]]) -> None:
    """Each sample opens with pypdf, has 1-13 pages, and every page has text."""
    page_counts = set()
    for name, pages in sample_texts.items():
        page_counts.add(len(pages))
        assert 1 <= len(pages) <= 13, name
        assert all(page.strip() for page in pages), name
    assert len(page_counts) >= 8  # varied lengths, not one template


def test_samples_differ_but_share_some_text(sample_texts: dict[str, list[str]]) -> None:
    """First pages are all distinct, while some pages and paragraphs recur across documents."""
    first_pages = [pages[0] for pages in sample_texts.values()]
    assert len(set(first_pages)) == len(first_pages)
    page_counts = Counter(page for pages in sample_texts.values() for page in pages)
    assert max(page_counts.values()) >= 4  # the shared appendix page
    shared = corpus._shared_paragraphs(corpus.DEFAULT_SEED)
    # Extraction breaks lines where the PDF does, so compare with whitespace collapsed.
    flat = [" ".join(" ".join(pages).split()) for pages in sample_texts.values()]
    assert any(sum(" ".join(p.split()) in text for text in flat) >= 2 for p in shared)


def test_write_pdf_puts_given_text_in_the_document(tmp_path: Path) -> None:
    """write_pdf makes a document whose extracted text contains the given marker."""
    path = corpus.write_pdf(tmp_path / "marked.pdf", ["Routine text.", "Marker POISON-400 here."])
    assert "POISON-400" in "".join(extract_pages(path.read_bytes()))


def test_poison_corpus_has_the_documented_keys(poison: dict[str, Path]) -> None:
    """write_poison_corpus writes one poison-<key>.pdf per documented key."""
    assert tuple(poison) == corpus.POISON_KEYS
    for key, path in poison.items():
        assert path.name == f"poison-{key}.pdf" and path.exists()


def test_zero_bytes_raises_empty_file_error(poison: dict[str, Path]) -> None:
    """The zero-byte file is empty and pypdf refuses it with EmptyFileError."""
    assert poison["zero_bytes"].stat().st_size == 0
    with pytest.raises(EmptyFileError):
        extract_pages(poison["zero_bytes"].read_bytes())


def test_not_pdf_raises_pdf_read_error(poison: dict[str, Path]) -> None:
    """A PNG named .pdf makes pypdf raise PdfReadError."""
    data = poison["not_pdf"].read_bytes()
    assert data.startswith(b"\x89PNG")
    with pytest.raises(PdfReadError):
        extract_pages(data)


def test_truncated_raises_pdf_read_error(poison: dict[str, Path]) -> None:
    """Half of a valid PDF makes pypdf raise PdfReadError."""
    with pytest.raises(PdfReadError):
        extract_pages(poison["truncated"].read_bytes())


def test_encrypted_needs_the_password(poison: dict[str, Path]) -> None:
    """The encrypted file reports is_encrypted, and its pages need the user password."""
    reader = pypdf.PdfReader(poison["encrypted"])
    assert reader.is_encrypted
    with pytest.raises(FileNotDecryptedError):
        reader.pages[0].extract_text()
    reader.decrypt("s3cret")
    assert reader.pages[0].extract_text().strip()


def test_oversize_is_valid_but_over_the_size_guard(poison: dict[str, Path]) -> None:
    """The oversize file is larger than asked for, still extracts, and check_size refuses it."""
    path = poison["oversize"]
    assert path.stat().st_size > OVERSIZE_BYTES
    assert "oversize" in extract_pages(path.read_bytes())[0]
    with pytest.raises(GuardError) as caught:
        check_size(path, OVERSIZE_BYTES)
    assert caught.value.error_class == "oversize"


def test_guarded_extraction_of_a_sample_returns_its_text(
    guarded: GuardedPool, samples: list[Path], sample_texts: dict[str, list[str]]
) -> None:
    """The guard does not change what extraction returns for a clean document."""
    assert guarded.run(extract_pages, samples[0].read_bytes()) == sample_texts[samples[0].name]


@pytest.mark.containment
def test_slow_times_out_under_the_guard(guarded: GuardedPool, poison: dict[str, Path]) -> None:
    """Extracting the slow file in a guarded worker ends in GuardError('timeout')."""
    with pytest.raises(GuardError) as caught:
        guarded.run(extract_pages, poison["slow"].read_bytes())
    assert caught.value.error_class == "timeout"


def test_memory_bomb_runs_out_of_memory_under_the_guard(poison: dict[str, Path]) -> None:
    """Extracting the memory bomb in a guarded worker ends in GuardError('memory').

    Its own pool: a timeout that a loaded machine cannot reach before the memory limit.
    """
    with (
        GuardedPool(timeout_s=20, memory_mb=256) as guarded,
        pytest.raises(GuardError) as caught,
    ):
        guarded.run(extract_pages, poison["memory_bomb"].read_bytes())
    assert caught.value.error_class == "memory"


def test_small_slow_variant_completes_without_pypdf_limits() -> None:
    """A cut-down slow file finishes cleanly: its cost is parsing work, not a pypdf budget."""
    data = corpus.slow_pdf_bytes(pages=1, draws=20, ops_per_form=200)
    assert extract_pages(data) == ["x\n" * 19 + "x"]


def test_small_memory_bomb_variant_amplifies_each_letter() -> None:
    """In a cut-down bomb every letter A shown becomes 255 characters of extracted text."""
    data = corpus.memory_bomb_pdf_bytes(pages=1, draws=2, run=10)
    (text,) = extract_pages(data)
    assert len(data) < 2_000
    assert len(text.replace("\n", "")) == 2 * 10 * 255


def test_small_documents_are_one_page_and_every_fourth_shares_its_first_chunk(
    tmp_path: Path,
) -> None:
    """The small corpus is cheap to extract and gives shared chunks something to share."""
    from replayable.stages.chunk.chunker import ChunkConfig, chunk_text

    paths = corpus.write_small_corpus(tmp_path, 8)
    assert digests(corpus.write_small_corpus(tmp_path / "again", 8)) == digests(paths)
    texts = [extract_pages(p.read_bytes()) for p in paths]
    assert all(len(pages) == 1 and len(pages[0]) > 1000 for pages in texts)
    first = [chunk_text(pages[0], ChunkConfig())[0].chunk_id for pages in texts]
    assert first[3] == first[7]  # documents 4 and 8
    assert len(set(first)) == 7
