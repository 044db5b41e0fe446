import base64
import hashlib
import io
from collections.abc import Mapping
from pathlib import Path

import pypdf
import pytest

import corpus
from replayable import db
from replayable.retry import ErrorKind, ItemError
from replayable.stages.extract.pdf import extract_file, extract_pdf, sanitize_text

SAMPLES = Path(__file__).resolve().parents[4] / "data" / "samples"


def _assemble(objects: list[bytes]) -> bytes:
    """A PDF file of ``objects`` (object 1 the catalog), with its cross-reference table."""
    out = bytearray(b"%PDF-1.7\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def _text_pdf(shown: bytes, to_unicode: Mapping[int, str] | None = None) -> bytes:
    """Return a one-page PDF that shows the string ``shown`` in Helvetica.

    With ``to_unicode`` the font carries a /ToUnicode map from single-byte codes to UTF-16
    code units, given as a str (surrogates included), the way broken real-world maps do.
    """
    font = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792]"
        b" /Resources << /Font << /F1 5 0 R >> >> /Contents 4 0 R >>",
        b"BT /F1 12 Tf 72 720 Td (" + shown + b") Tj ET",
    ]
    if to_unicode:
        lines = [
            b"<%02X> <%s>" % (code, text.encode("utf-16-be", "surrogatepass").hex().encode())
            for code, text in to_unicode.items()
        ]
        cmap = b"\n".join(
            [
                b"/CIDInit /ProcSet findresource begin 12 dict begin begincmap",
                b"/CMapName /Test def /CMapType 2 def",
                b"1 begincodespacerange <00> <FF> endcodespacerange",
                b"%d beginbfchar" % len(lines),
                *lines,
                b"endbfchar endcmap CMapName currentdict /CMap defineresource pop end end",
            ]
        )
        objects += [font + b" /ToUnicode 6 0 R >>", cmap]
    else:
        objects.append(font + b" >>")
    # The content stream and the CMap are objects 4 and 6: give them their stream framing.
    for number in (4, 6):
        if number <= len(objects):
            data = objects[number - 1]
            objects[number - 1] = b"<< /Length %d >>\nstream\n%s\nendstream" % (len(data), data)
    return _assemble(objects)


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


def test_nul_characters_from_the_text_layer_are_dropped_and_counted(tmp_path):
    """Code 0 of a simple font: pypdf extracts NUL (as for pdfTeX's T1 grave accent), which
    is dropped and counted; PDFium leaves it out itself. Both store the same text."""
    path = tmp_path / "grave.pdf"
    path.write_bytes(_text_pdf(b"Welsh \\000w and \\000y, a lone \\000 grave."))
    by_pypdf = extract_file(str(path), engine="pypdf")
    assert by_pypdf.text == "Welsh w and y, a lone  grave."
    assert (by_pypdf.removed_chars, by_pypdf.engine) == (3, "pypdf")
    assert extract_file(str(path)).text == by_pypdf.text


def test_a_lone_surrogate_becomes_a_replacement_character_and_a_split_pair_is_joined():
    data = _text_pdf(b"AxBCy", {0x41: "\ud800", 0x42: "\ud83d", 0x43: "\udcc4"})
    result = extract_pdf(data, engine="pypdf")
    assert result.text == "\ufffdx\U0001f4c4y"
    assert result.removed_chars == 1


def test_clean_text_reports_no_removed_characters():
    result = extract_pdf(sorted(SAMPLES.glob("*.pdf"))[0].read_bytes())
    assert result.removed_chars == 0


def test_a_page_of_nothing_but_nul_is_empty_text():
    with pytest.raises(ItemError) as info:
        extract_pdf(_text_pdf(b"\\000\\000\\000"))
    assert info.value.error_class == "empty_text"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "plain text\twith\nwhitespace",
        "non-BMP \U0001f4c4 \U0001d49c and noncharacters \ufffe \uffff \U0010ffff",
        "already replaced \ufffd and CJK \u4e00",
    ],
)
def test_sanitize_keeps_every_character_postgres_stores(text):
    assert sanitize_text(text) == (text, 0)


@pytest.mark.parametrize(
    ("text", "expected", "removed"),
    [
        ("a\x00b\x00\x00c", "abc", 3),
        ("control \x01\x02\x07\x1b\x1f\x7f\x85 characters", "control  characters", 7),
        ("PDFium's lines\r\nand old Mac\rlines\n", "PDFium's lines\nand old Mac\nlines\n", 0),
        ("form\x0cfeed, vertical\x0btab", "formfeed, verticaltab", 2),
        ("\x00", "", 1),
        ("high \ud800 alone", "high \ufffd alone", 1),
        ("low \udc00 alone", "low \ufffd alone", 1),
        ("ends high \udbff", "ends high \ufffd", 1),
        ("two lows \udc00\udc00", "two lows \ufffd\ufffd", 2),
        ("reversed pair \udcc4\ud83d", "reversed pair \ufffd\ufffd", 2),
        ("split pair \ud83d\udcc4", "split pair \U0001f4c4", 0),
        ("both \x00\ud83d\udcc4\ud800", "both \U0001f4c4\ufffd", 2),
    ],
)
def test_sanitize_drops_control_characters_unifies_lines_and_replaces_lone_surrogates(
    text, expected, removed
):
    assert sanitize_text(text) == (expected, removed)


def test_postgres_text_refuses_nul_and_stores_sanitised_text_unchanged(dsn):
    """What sanitize_text keeps round-trips through a text column; NUL is refused."""
    raw = "a\x00b \x01\x1b\x7f \U0001f4c4 \ufffe\uffff\U0010ffff \ud800 \ud83d\udcc4"
    text, removed = sanitize_text(raw)
    assert removed == 5  # NUL, three other control characters and a lone surrogate
    conn = db.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT %s::text", (text,))
            assert cur.fetchone()[0] == text
            with pytest.raises(ValueError, match="NUL"):
                cur.execute("SELECT %s::text", ("a\x00b",))
    finally:
        conn.close()


def test_a_file_rewritten_since_discover_is_not_stored_under_its_old_hash(tmp_path):
    path = tmp_path / "doc.pdf"
    corpus.write_pdf(path, ["The first version of this document."])
    discovered = hashlib.sha256(path.read_bytes()).hexdigest()
    corpus.write_pdf(path, ["A rewritten version of this document."])
    with pytest.raises(ItemError) as info:
        extract_file(str(path), expected_sha256=discovered)
    assert info.value.error_class == "changed_on_disk"
    assert extract_file(str(path), hashlib.sha256(path.read_bytes()).hexdigest()).text


_SHOWN = b"BT /F1 12 Tf 72 720 Td (Readable text) Tj ET"


def _pdf_with_contents(entries: bytes, data: bytes) -> bytes:
    """Return a one-page PDF whose content stream has these dictionary entries and bytes.

    The reader must decode the page's content stream to extract its text, so the stream's
    ``/Filter`` decides whether extraction can go through. (pypdf decodes no image while
    extracting text and only logs a form XObject it cannot decode.)
    """
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792]"
        b" /Resources << /Font << /F1 5 0 R >> >> /Contents 4 0 R >>",
        b"<< %s /Length %d >>\nstream\n%s\nendstream" % (entries, len(data), data),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    return _assemble(objects)


def test_a_content_stream_under_a_standard_filter_name_reads():
    """The control for the tests below: they fail for their filter, not for their layout."""
    data = _pdf_with_contents(b"/Filter /ASCII85Decode", base64.a85encode(_SHOWN) + b"~>")
    assert extract_pdf(data).text == "Readable text"


def test_a_jbig2_stream_without_the_jbig2dec_decoder_is_unsupported_not_unexpected():
    """pypdf's DependencyError: the document is fine, this worker lacks the decoder."""
    # The decoder is an optional binary; a machine that has it must still take this path.
    data = _pdf_with_contents(b"/Filter /JBIG2Decode", b"\x00\x00\x00\x01" * 8)
    with (
        pypdf.apply_configuration(jbig2dec_binary=None),
        pytest.raises(ItemError, match="jbig2dec") as info,
    ):
        extract_pdf(data, engine="pypdf")
    assert (info.value.error_class, info.value.kind) == ("unsupported", ErrorKind.TERMINAL)


def test_an_abbreviated_filter_name_pypdf_no_longer_reads_is_unsupported_not_unexpected():
    """pypdf 7 raises DeprecationError for /A85 outside inline images (abbreviations' place)."""
    data = _pdf_with_contents(b"/Filter /A85", base64.a85encode(_SHOWN) + b"~>")
    with pytest.raises(ItemError, match="/A85") as info:
        extract_pdf(data, engine="pypdf")
    assert (info.value.error_class, info.value.kind) == ("unsupported", ErrorKind.TERMINAL)


def test_a_filter_the_reader_does_not_implement_is_unsupported_not_unexpected():
    """pypdf's NotImplementedError names the filter; it is the reader's limit, not a bug here."""
    data = _pdf_with_contents(b"/Filter /NoSuchDecode", b"anything")
    with pytest.raises(ItemError, match="NoSuchDecode") as info:
        extract_pdf(data, engine="pypdf")
    assert (info.value.error_class, info.value.kind) == ("unsupported", ErrorKind.TERMINAL)


def test_a_file_swapped_for_a_fifo_is_unreadable_and_does_not_block(tmp_path):
    """The path is opened without blocking and checked by fstat, not read as a stream."""
    import os

    from file_access import finishes

    fifo = tmp_path / "x.pdf"
    os.mkfifo(fifo)
    with pytest.raises(ItemError) as caught:
        finishes(lambda: extract_file(str(fifo)), fifo=fifo)
    assert caught.value.error_class == "unreadable"
    assert caught.value.kind is ErrorKind.TERMINAL


def test_a_file_that_cannot_be_opened_is_unreadable(tmp_path):
    from file_access import permission_bits_bind

    locked = tmp_path / "locked.pdf"
    corpus.write_pdf(locked, ["Text nobody may read."])
    locked.chmod(0)
    with permission_bits_bind(), pytest.raises(ItemError) as caught:
        extract_file(str(locked))
    assert caught.value.error_class == "unreadable"
    assert "Permission denied" in str(caught.value)


# Engines (ADR 0103).


def test_the_default_engine_is_pdfium_and_each_engine_names_itself():
    data = sorted(SAMPLES.glob("*.pdf"))[0].read_bytes()
    assert extract_pdf(data).engine == "pdfium"
    assert extract_pdf(data, engine="auto").engine == "pdfium"
    assert extract_pdf(data, engine="pypdf").engine == "pypdf"


def test_auto_falls_back_to_pypdf_where_pdfium_finds_no_text():
    """PDFium reads only what lies on the page; pypdf reads text drawn above it too."""
    data = _pdf_with_contents(b"", b"BT /F1 12 Tf 72 2000 Td (Text above the page) Tj ET")
    with pytest.raises(ItemError) as info:
        extract_pdf(data)
    assert info.value.error_class == "empty_text"
    result = extract_pdf(data, engine="auto")
    assert (result.engine, result.text) == ("pypdf", "Text above the page")


def test_under_auto_a_file_both_engines_refuse_keeps_pdfiums_class_and_both_reasons(tmp_path):
    poison = corpus.write_poison_corpus(tmp_path)
    with pytest.raises(ItemError) as info:
        extract_file(str(poison["truncated"]), engine="auto")
    assert (info.value.error_class, info.value.kind) == ("malformed", ErrorKind.TERMINAL)
    assert str(info.value).startswith("pdfium: ") and "then pypdf (malformed)" in str(info.value)


def test_an_unknown_engine_is_refused_by_name():
    with pytest.raises(ValueError, match="extractor: 'pdfminer'"):
        extract_pdf(sorted(SAMPLES.glob("*.pdf"))[0].read_bytes(), engine="pdfminer")


@pytest.mark.parametrize("engine", ["pdfium", "pypdf", "auto"])
def test_a_pdf_encrypted_with_an_empty_user_password_is_read(engine):
    """Permissions-only encryption (print or copy restrictions, many bank statements)."""
    plain = sorted(SAMPLES.glob("*.pdf"))[0].read_bytes()
    data = corpus.encrypted_pdf_bytes("", plain)
    assert pypdf.PdfReader(io.BytesIO(data)).is_encrypted
    assert extract_pdf(data, engine=engine).text == extract_pdf(plain, engine=engine).text


@pytest.mark.parametrize("engine", ["pdfium", "pypdf", "auto"])
def test_a_pdf_with_a_user_password_is_encrypted(engine):
    with pytest.raises(ItemError) as info:
        extract_pdf(corpus.encrypted_pdf_bytes("secret"), engine=engine)
    assert (info.value.error_class, info.value.kind) == ("encrypted", ErrorKind.TERMINAL)


def test_both_engines_read_the_same_words_with_no_control_character_from_either():
    """One normalisation: no carriage return or control character from either engine, and
    the same words (their spacing may differ) from the bundled samples."""
    for path in sorted(SAMPLES.glob("*.pdf"))[:5]:
        texts = {
            engine: extract_pdf(path.read_bytes(), engine=engine).text
            for engine in ("pdfium", "pypdf")
        }
        for text in texts.values():
            assert "\r" not in text and sanitize_text(text) == (text, 0)
        assert texts["pdfium"].split() == texts["pypdf"].split(), path.name
