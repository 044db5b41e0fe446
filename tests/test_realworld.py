"""The extract stage over PDFs from real producers; and tests for tests/realworld.py itself."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import corpus
import realworld
from replayable.retry import ErrorKind, ItemError
from replayable.stages.extract.pdf import extract_file, sanitize_text

pytestmark = pytest.mark.realworld

# The session fixture realworld_corpus: the corpus is built once for all modules using it.
pytest_plugins = ["realworld_fixture"]


def test_every_readable_file_with_a_text_layer_extracts_to_text_without_nul(realworld_corpus):
    entries = [e for e in realworld_corpus.files if e.extractable]
    assert entries, realworld_corpus.producers
    failures = {}
    for entry in entries:
        try:
            result = extract_file(str(realworld_corpus.folder / entry.file))
        except ItemError as exc:
            failures[entry.file] = f"{exc.error_class}: {exc}"
            continue
        if not result.text.strip():
            failures[entry.file] = "empty text"
        elif "\x00" in result.text:
            failures[entry.file] = "NUL in the text"
        else:
            # Raises on a lone surrogate, as the driver and the text hash would.
            result.text.encode("utf-8")
    assert failures == {}


def test_at_least_four_producers_contributed(realworld_corpus):
    assert len(realworld_corpus.contributors) >= 4, realworld_corpus.producers


def test_files_pypdf_cannot_read_or_without_text_raise_terminal_errors(realworld_corpus):
    for entry in realworld_corpus.files:
        if entry.extractable:
            continue
        with pytest.raises(ItemError) as info:
            extract_file(str(realworld_corpus.folder / entry.file))
        assert info.value.kind == ErrorKind.TERMINAL, (entry.file, info.value)


@pytest.mark.parametrize("engine", ["pdfium", "pypdf"])
def test_pdftex_t1_bitmap_fonts_give_control_characters_that_extraction_removes(
    realworld_corpus, engine
):
    """pdfTeX sets a grave accent on w, y or n as code 0 of a Type3 EC font (pypdf reads
    NUL), and its ligatures as codes 0x1B-0x1F with no Unicode mapping: both engines pass
    the raw codes through, and extraction drops and counts them (ADR 0103)."""
    by_name = {e.file: e for e in realworld_corpus.files}
    entry = by_name.get("pdflatex-article-t1.pdf")
    if entry is None:
        pytest.skip(f"pdflatex wrote no T1 document: {realworld_corpus.producers}")
    assert entry.nul_chars > 0
    assert entry.surrogates == 0
    result = extract_file(str(realworld_corpus.folder / entry.file), engine=engine)
    assert result.engine == engine
    assert result.removed_chars > entry.nul_chars  # the NULs, and the ligatures' codes
    assert sanitize_text(result.text) == (result.text, 0)
    assert "Welsh: w, y" in result.text


def test_the_manifest_describes_the_files_on_disk_and_the_corpus_stays_small(realworld_corpus):
    folder = realworld_corpus.folder
    assert realworld.Manifest.load(folder) == realworld_corpus
    assert sorted(p.name for p in folder.glob("*.pdf")) == sorted(
        e.file for e in realworld_corpus.files
    )
    for entry in realworld_corpus.files:
        data = (folder / entry.file).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (entry.size, entry.sha256)
    assert len({e.sha256 for e in realworld_corpus.files}) == len(realworld_corpus.files)
    assert sum(e.size for e in realworld_corpus.files) < 10 * 2**20


# --- the generator, without the real producers ----------------------------------------


def _path_with(tmp_path: Path, scripts: dict[str, str]) -> str:
    """A PATH of one folder holding the given shell scripts, and nothing else."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name, body in scripts.items():
        script = folder / name
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(0o755)
    return str(folder)


def test_a_producer_that_is_not_installed_is_skipped_and_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _path_with(tmp_path, {}))
    manifest = realworld.build(tmp_path / "out", producers=["groff", "pdflatex", "libreoffice"])
    assert [(p.name, p.status) for p in manifest.producers] == [
        ("groff", "skipped"),
        ("pdflatex", "skipped"),
        ("libreoffice", "skipped"),
    ]
    assert "soffice not installed" in manifest.producers[2].detail
    assert manifest.all_skipped
    assert realworld.Manifest.load(tmp_path / "out").files == []


def test_a_failing_producer_is_reported_with_its_output(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "PATH", _path_with(tmp_path, {"pdflatex": "echo 'no fonts here' >&2; exit 3"})
    )
    manifest = realworld.build(tmp_path / "out", producers=["pdflatex"])
    (report,) = manifest.producers
    assert (report.status, report.files) == ("failed", 0)
    assert "pdflatex exited 3: no fonts here" in report.detail
    assert not manifest.all_skipped


def test_a_hanging_command_costs_its_timeout_and_the_other_documents_go_on(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "PATH", _path_with(tmp_path, {"ps2pdf": "exec /bin/sleep 60", "gs": "exit 0"})
    )
    manifest = realworld.build(tmp_path / "out", producers=["ghostscript"], timeout_s=0.3)
    (report,) = manifest.producers
    assert report.status == "failed"
    assert report.detail.count("ps2pdf timed out") == 5  # one per PostScript document
    assert report.seconds < 10


def test_shipped_pdfs_are_copied_once_per_content_and_inspected(tmp_path):
    root = tmp_path / "share"
    first = corpus.write_pdf(root / "a" / "guide.pdf", ["A guide shipped with a package."])
    second = corpus.write_pdf(root / "b" / "guide.pdf", ["Another guide, by the same name."])
    (root / "c").mkdir()
    (root / "c" / "copy.pdf").write_bytes(first.read_bytes())
    not_pdf = root / "c" / "config.pdf"
    not_pdf.write_text("% a configuration file named .pdf\n")
    manifest = realworld.build(tmp_path / "out", producers=["debian"], shipped_roots=[root])
    assert {e.source for e in manifest.files} == {str(first), str(second), str(not_pdf)}
    assert len({e.file for e in manifest.files}) == 3
    assert {e.source for e in manifest.files if e.extractable} == {str(first), str(second)}
    (unreadable,) = [e for e in manifest.files if not e.readable]
    assert unreadable.error


def test_spread_takes_both_ends_and_evenly_between():
    assert realworld.spread(range(10), 4) == [0, 3, 6, 9]
    assert realworld.spread([1, 2], 5) == [1, 2]
    assert realworld.spread(range(9), 1) == [4]
    assert realworld.spread(range(9), 0) == []


def test_the_command_line_builds_a_corpus_and_prints_a_summary(tmp_path, capsys):
    root = tmp_path / "share"
    corpus.write_pdf(root / "guide.pdf", ["A guide shipped with a package."])
    out = tmp_path / "out"
    argv = ["--out", str(out), "--only", "debian", "--shipped-root", str(root)]
    assert realworld.main(argv) == 0
    assert [e.file for e in realworld.Manifest.load(out).files] == ["debian-guide.pdf"]
    assert "1 files" in capsys.readouterr().out
