from pathlib import Path

import pytest

import corpus
from replayable.retry import ErrorKind, ItemError
from replayable.stages.extract import extract_file, extract_pdf

SAMPLES = Path(__file__).resolve().parents[3] / "data" / "samples"


def test_a_sample_gives_its_pages_and_text():
    path = sorted(SAMPLES.glob("*.pdf"))[0]
    result = extract_pdf(path.read_bytes())
    assert result.page_count >= 1
    assert len(result.text) > 100


def test_written_text_comes_back(tmp_path):
    path = corpus.write_pdf(tmp_path / "a.pdf", ["Harbour report with POISON-400 inside."])
    assert "POISON-400" in extract_file(str(path)).text


@pytest.fixture(scope="module")
def poison(tmp_path_factory):
    return corpus.write_poison_corpus(tmp_path_factory.mktemp("poison"))


@pytest.mark.parametrize(
    ("name", "error_class"),
    [
        ("zero_bytes", "not_pdf"),
        ("not_pdf", "not_pdf"),
        ("truncated", "malformed"),
        ("encrypted", "encrypted"),
    ],
)
def test_bad_documents_raise_terminal_named_errors(poison, name, error_class):
    with pytest.raises(ItemError) as info:
        extract_file(str(poison[name]))
    assert (info.value.error_class, info.value.kind) == (error_class, ErrorKind.TERMINAL)


def test_a_pdf_without_text_is_empty_text(tmp_path):
    from fpdf import FPDF

    pdf = FPDF()
    pdf.add_page()
    path = tmp_path / "blank.pdf"
    pdf.output(str(path))
    with pytest.raises(ItemError) as info:
        extract_file(str(path))
    assert info.value.error_class == "empty_text"


def test_a_vanished_file_is_missing_file(tmp_path):
    with pytest.raises(ItemError) as info:
        extract_file(str(tmp_path / "gone.pdf"))
    assert info.value.error_class == "missing_file"
