"""Generate the deterministic sample corpus and the poison corpus of hostile PDFs.

The sample corpus (``data/samples``) is ordinary, clean input: text PDFs made with fpdf2
from a fixed word list and seeded randomness, byte-identical on every run so that content
hashes, chunk ids and replay tests stay stable. A few paragraphs and one appendix page
recur across documents so that content-addressed chunk dedup has something to find.

The poison corpus holds one file per way an input can break the extractor, keyed by
name; ``write_poison_corpus`` documents what each one does to pypdf.

Run ``python tests/corpus.py --out data/samples`` to regenerate the committed samples.
"""

from __future__ import annotations

import argparse
import io
import random
import re
import struct
import sys
import zlib
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fpdf import FPDF

# Fixed so that fpdf2 writes the same /CreationDate and /ID on every run.
CREATION_DATE = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
PRODUCER = "replayable tests/corpus.py"

DEFAULT_N = 32
DEFAULT_SEED = 7
DEFAULT_OVERSIZE_BYTES = 3_000_000

# The expected failure of each poison file is documented in write_poison_corpus.
POISON_KEYS = (
    "zero_bytes",
    "not_pdf",
    "truncated",
    "encrypted",
    "oversize",
    "slow",
    "memory_bomb",
)

_WORDS_TEXT = """
account action address agency agreement amount analysis annual approach archive area
arrival asset audit balance barge basin batch berth board boundary branch budget buffer
bulletin cable capacity cargo carrier case catalogue channel charter claim clause
coastal column committee company component condition container contract control corridor
council county crane credit crew current customer cycle data deadline delivery demand
department deposit depot design detail dispatch district dock document draft drainage
duty energy engine entry equipment estimate evidence exchange export facility factor
ferry field figure filing finance fleet flow forecast freight fuel fund gate grade grain
harbor hazard heading import incident index inland inquiry inspection interval inventory
invoice island journal junction kernel label ladder lane launch ledger license lighthouse
limit liner load lock log machine maintenance manifest margin marine market measure
meeting memo method metric mooring motion network notice number office operator order
origin outline output owner packet pallet panel parcel party passage payment period
permit pier pilot pipeline plan platform policy port position pressure procedure process
program project proposal protocol quay quota rail range rate record region register
release report request reserve resource review river route rule safety sample schedule
schema season section sector segment service shift shipment signal site slip source
span station status storage stream study summary supply survey system tariff terminal
tide timber tonnage track trade traffic transfer transit trial tug unit valve vessel
volume voyage warehouse water wharf window yard zone
"""

_CONNECTORS_TEXT = """
about across after against along among around before behind below beside between beyond
during for from inside near over since through toward under until upon within without
"""

_VERBS_TEXT = """
adjusts allocates approves balances confirms covers defines delays describes documents
exceeds extends follows handles includes indicates limits lists matches measures meets
moves notes outlines records reduces reflects replaces reports requires reviews routes
sets shows supports tracks updates
"""

_ADJECTIVES_TEXT = """
active annual available central coastal current daily direct early eastern final formal
general heavy inland internal late local main manual monthly northern open outer partial
primary regional regular routine seasonal southern standard temporary total upper western
"""
WORDS = tuple(_WORDS_TEXT.split())
CONNECTORS = tuple(_CONNECTORS_TEXT.split())
VERBS = tuple(_VERBS_TEXT.split())
ADJECTIVES = tuple(_ADJECTIVES_TEXT.split())


def _sentence(rng: random.Random) -> str:
    """Return one sentence of plausible, meaningless English."""
    subject = f"the {rng.choice(ADJECTIVES)} {rng.choice(WORDS)}"
    obj = f"{rng.choice(['the', 'each', 'every', 'a'])} {rng.choice(WORDS)} {rng.choice(WORDS)}"
    tail = f"{rng.choice(CONNECTORS)} the {rng.choice(WORDS)}"
    parts = [subject, rng.choice(VERBS), obj, tail]
    if rng.random() < 0.4:
        parts.append(f"and {rng.choice(VERBS)} the {rng.choice(ADJECTIVES)} {rng.choice(WORDS)}")
    if rng.random() < 0.2:
        parts.append(f"by {rng.randint(2, 97)} {rng.choice(WORDS)}s")
    text = " ".join(parts)
    return text[0].upper() + text[1:] + "."


def _paragraph(rng: random.Random, sentences: int) -> str:
    """Return a paragraph of ``sentences`` sentences."""
    return " ".join(_sentence(rng) for _ in range(sentences))


def _title(rng: random.Random) -> str:
    """Return a short document title."""
    words = [rng.choice(ADJECTIVES), rng.choice(WORDS), rng.choice(WORDS), "report"]
    return " ".join(w.capitalize() for w in words)


def _slug(title: str) -> str:
    """Return a filename-safe slug of ``title``."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def _shared_paragraphs(seed: int) -> list[str]:
    """Return the boilerplate paragraphs that several documents repeat verbatim."""
    rng = random.Random(f"shared-{seed}")
    return [_paragraph(rng, rng.randint(4, 7)) for _ in range(4)]


def _appendix(seed: int) -> list[str]:
    """Return the identical appendix page that several documents end with."""
    rng = random.Random(f"appendix-{seed}")
    return [_paragraph(rng, 5) for _ in range(5)]


def _new_pdf(*, compress: bool = True, title: str = "") -> FPDF:
    """Return an FPDF with fixed metadata so that its output bytes are reproducible."""
    from fpdf import FPDF  # here, not at the top: most test workers never write a PDF

    pdf = FPDF(format="A4")
    pdf.set_creation_date(CREATION_DATE)
    pdf.set_producer(PRODUCER)
    pdf.set_creator(PRODUCER)
    pdf.set_author("Replayable sample corpus")
    if title:
        pdf.set_title(title)
    pdf.set_compression(compress)
    pdf.set_auto_page_break(auto=True, margin=18)
    pdf.set_margins(20, 20, 20)
    return pdf


_WIDTHS: dict[tuple[str, str, float, str], float] = {}


def _word_width(pdf: FPDF, font: tuple[str, str, float], word: str) -> float:
    """Return the width of ``word`` in ``font``, measured once per word and font."""
    # fpdf2's get_string_width is slow, and the vocabulary is tiny.
    key = (*font, word)
    if key not in _WIDTHS:
        _WIDTHS[key] = pdf.get_string_width(word)
    return _WIDTHS[key]


def _wrap(pdf: FPDF, text: str) -> list[str]:
    """Split ``text`` into lines that fit the page width in the current font."""
    # fpdf2's multi_cell re-measures each line many times and dominated generation time.
    width = pdf.epw
    font = (pdf.font_family, pdf.font_style, pdf.font_size_pt)
    space = _word_width(pdf, font, " ")
    lines: list[str] = []
    line: list[str] = []
    used = 0.0
    for word in text.split():
        w = _word_width(pdf, font, word)
        if line and used + space + w > width:
            lines.append(" ".join(line))
            line, used = [], 0.0
        used += (space if line else 0.0) + w
        line.append(word)
    if line:
        lines.append(" ".join(line))
    return lines


def _body(pdf: FPDF, text: str) -> None:
    """Write one body paragraph."""
    pdf.set_font("Helvetica", size=10.5)
    for line in _wrap(pdf, text):
        pdf.cell(0, 5.2, line, new_x="LMARGIN", new_y="NEXT")
    pdf.ln(2.5)


def _heading(pdf: FPDF, text: str, size: float = 13) -> None:
    """Write one heading line."""
    pdf.set_font("Helvetica", style="B", size=size)
    pdf.multi_cell(0, size * 0.55, text, new_x="LMARGIN", new_y="NEXT")
    pdf.ln(2)


def _noise_figure(pdf: FPDF, rng: random.Random, side: int) -> None:
    """Draw a ``side`` x ``side`` noise image: incompressible, so it gives the file bulk."""
    from PIL import Image  # fpdf2 depends on Pillow, so it is always there with fpdf2

    data = rng.randbytes(side * side * 3)
    image = Image.frombytes("RGB", (side, side), data)
    pdf.image(image, w=60, h=60)
    pdf.ln(3)


def write_pdf(path: Path, paragraphs: Sequence[str], *, title: str = "") -> Path:
    """Write a small, valid text PDF whose extracted text contains ``paragraphs``.

    Tests use it to make a document with specific content, e.g. a fault-injection marker
    such as ``POISON-400``. Characters outside Latin-1 are not representable in the
    built-in Helvetica font and raise an fpdf2 error.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pdf_bytes(paragraphs, title=title))
    return path


def pdf_bytes(paragraphs: Sequence[str], *, title: str = "") -> bytes:
    """Return the bytes :func:`write_pdf` writes."""
    pdf = _new_pdf(title=title)
    pdf.add_page()
    if title:
        _heading(pdf, title, size=16)
    for paragraph in paragraphs:
        _body(pdf, paragraph)
    return bytes(pdf.output())


def _sample_bytes(index: int, seed: int) -> tuple[str, bytes]:
    """Return the file name and bytes of sample document ``index`` (1-based)."""
    # Each document has its own generator so that the first k documents do not depend on n.
    rng = random.Random(f"doc-{seed}-{index}")
    title = _title(rng)
    name = f"doc-{index:03d}-{_slug(title)}.pdf"
    target_pages = 1 + (index * 5 + rng.randint(0, 6)) % 12
    # Some documents are written uncompressed and some carry an incompressible figure,
    # so file sizes spread from a few KB to about 150 KB.
    compress = index % 7 != 3
    figure_side = 0
    if index % 5 == 2:
        figure_side = 100 + 35 * ((index // 5 + 1) % 4)

    pdf = _new_pdf(compress=compress, title=title)
    pdf.add_page()
    _heading(pdf, title, size=17)
    pdf.set_font("Helvetica", style="I", size=9)
    pdf.multi_cell(
        0, 5, f"Document {index:03d} - sample corpus, seed {seed}", new_x="LMARGIN", new_y="NEXT"
    )
    pdf.ln(3)

    shared = _shared_paragraphs(seed)
    if index % 3 == 0:
        _body(pdf, shared[index % len(shared)])
    if figure_side:
        _noise_figure(pdf, rng, figure_side)

    section = 0
    while True:
        section += 1
        _heading(pdf, f"{section}. {rng.choice(ADJECTIVES).capitalize()} {rng.choice(WORDS)}")
        for _ in range(rng.randint(2, 4)):
            _body(pdf, _paragraph(rng, rng.randint(3, 9)))
        if index % 4 == 2 and section == 2:
            _body(pdf, shared[(index // 4) % len(shared)])
        if pdf.page_no() >= target_pages:
            break

    if index % 4 == 1:
        # A whole page of identical text, so page-level dedup has something to find too.
        pdf.add_page()
        _heading(pdf, "Appendix: Standard terms")
        for paragraph in _appendix(seed):
            _body(pdf, paragraph)

    return name, bytes(pdf.output())


def write_sample_corpus(out_dir: Path, n: int = DEFAULT_N, seed: int = DEFAULT_SEED) -> list[Path]:
    """Write ``n`` sample PDFs into ``out_dir`` and return their paths in order.

    Output is byte-identical for the same ``n`` and ``seed``, and document ``i`` does not
    depend on ``n``. Existing ``doc-*.pdf`` files in ``out_dir`` that this run does not
    write are removed, so the directory always holds exactly this corpus.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(1, n + 1):
        name, data = _sample_bytes(index, seed)
        path = out_dir / name
        if not path.exists() or path.read_bytes() != data:
            path.write_bytes(data)
        paths.append(path)
    keep = {p.name for p in paths}
    for stale in out_dir.glob("doc-*.pdf"):
        if stale.name not in keep:
            stale.unlink()
    return paths


def _preamble(seed: int) -> list[str]:
    """Return the preamble that every fourth small document opens with, verbatim."""
    rng = random.Random(f"preamble-{seed}")
    return [_paragraph(rng, 6) for _ in range(2)]


def small_pdf_bytes(index: int, seed: int = DEFAULT_SEED) -> tuple[str, bytes]:
    """Return the file name and bytes of small document ``index``: one page, quick to extract.

    About 1.5-3 KB of text, so a few chunks each. Every fourth document opens with the same
    preamble, longer than one default chunk (800 characters), so those documents share
    their first chunk; the rest of each one is its own.
    """
    rng = random.Random(f"small-{seed}-{index}")
    title = _title(rng)
    pdf = _new_pdf(title=title)
    pdf.add_page()
    if index % 4 == 0:
        for paragraph in _preamble(seed):
            _body(pdf, paragraph)
    _heading(pdf, f"{title} {index}", size=15)
    for _ in range(3):
        _body(pdf, _paragraph(rng, rng.randint(4, 7)))
    return f"small-{index:04d}-{_slug(title)}.pdf", bytes(pdf.output())


def write_small_corpus(
    out_dir: Path, n: int, *, seed: int = DEFAULT_SEED, first: int = 1
) -> list[Path]:
    """Write small documents ``first`` to ``first + n - 1`` into ``out_dir``; return the paths.

    For runs of hundreds of documents where extraction must stay cheap (see
    :func:`small_pdf_bytes`); byte-identical for the same indexes and seed.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(first, first + n):
        name, data = small_pdf_bytes(index, seed)
        path = out_dir / name
        path.write_bytes(data)
        paths.append(path)
    return paths


# --- hand-built PDFs ------------------------------------------------------------------
# The hostile files need object graphs that fpdf2 cannot express (forms drawn thousands
# of times, crafted /ToUnicode maps), so they are assembled from raw PDF syntax here.


def _stream(entries: bytes, data: bytes, *, compress: bool = True) -> bytes:
    """Return a stream object body with ``entries`` added to its dictionary."""
    if compress:
        data = zlib.compress(data, 9)
        entries += b" /Filter /FlateDecode"
    return b"<< %s /Length %d >>\nstream\n%s\nendstream" % (entries, len(data), data)


def _assemble(objects: Sequence[bytes], *, filler: bytes = b"") -> bytes:
    """Return a complete PDF whose object ``i`` (1-based) is ``objects[i - 1]``.

    Object 1 must be the catalog. ``filler`` is written as a comment block before the
    cross-reference table, which keeps the file valid while making it as large as needed.
    """
    out = bytearray(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    out += filler
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def _pages_objects(page_count: int, first_page: int) -> bytes:
    """Return the /Pages node listing ``page_count`` page objects numbered from ``first_page``."""
    kids = b" ".join(b"%d 0 R" % (first_page + i) for i in range(page_count))
    return b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, page_count)


def _page(contents: int, resources: bytes) -> bytes:
    """Return a page dictionary (its parent is always object 2)."""
    return (
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources %s /Contents %d 0 R >>"
        % (resources, contents)
    )


def _helvetica() -> bytes:
    """Return a standard-14 font dictionary (needs no embedded font program)."""
    return b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>"


def slow_pdf_bytes(*, pages: int = 40, draws: int = 4_900, ops_per_form: int = 2_000) -> bytes:
    """Return a small PDF (about 7 KB) on which ``extract_text`` runs for a very long time.

    Every page paints one form XObject ``draws`` times. pypdf 7.1.1 builds a fresh
    ``ContentStream`` on every ``Do`` and so re-tokenises the form's content (here
    ``ops_per_form`` cheap ``Tc`` operators around a one-letter ``Tj``) each time, in pure
    Python. Nesting forms so that the draws multiply would buy nothing: pypdf counts every
    form invocation, nested or not, and past 5,000 per page
    (``xform_maximum_invocations_per_extraction``) it logs a warning and skips the rest.
    ``draws`` stays under that, and no ``LimitReachedError`` budget is touched. The text is
    one short line per draw, so memory stays flat (about 60 MB RSS). Work is
    ``pages * draws * ops_per_form`` operator parses: about 11 ms per draw on a 2-vCPU VM,
    so about a minute per page and over half an hour for the whole default file.
    """
    form_ops = b"BT /F1 1 Tf 0 0 Td " + b"0 Tc " * ops_per_form + b"(x) Tj ET\n"
    first_page = 5
    resources = b"<< /XObject << /Fm 4 0 R >> >>"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        _pages_objects(pages, first_page),
        _stream(b"", b"/Fm Do\n" * draws),
        _stream(
            b"/Type /XObject /Subtype /Form /BBox [0 0 612 792]"
            b" /Resources << /Font << /F1 %d 0 R >> >>" % (first_page + pages),
            form_ops,
        ),
    ]
    objects += [_page(3, resources) for _ in range(pages)]
    objects.append(_helvetica())
    return _assemble(objects)


def memory_bomb_pdf_bytes(*, pages: int = 64, draws: int = 4_900, run: int = 262_144) -> bytes:
    """Return a small PDF (about 11 KB) whose ``extract_text`` output grows until memory runs out.

    The font's /ToUnicode CMap maps the byte ``A`` to 255 characters, the longest
    destination pypdf accepts (512 bytes of UTF-16). A form XObject shows ``run`` letters
    ``A`` (a 256 KiB string that deflates to almost nothing), so each ``Do`` of it adds
    ``255 * run`` characters, about 255 MiB of Python str by default, to the page text;
    each page paints it ``draws`` times and the file has ``pages`` pages. No pypdf budget
    bounds the size of extracted text, and pypdf re-raises ``MemoryError`` from inside
    forms, so the extraction ends in a plain ``MemoryError``, never ``LimitReachedError``:
    measured under RLIMIT_AS, after 0.14 s at 256 MiB, 0.6 s at 512 MiB, 2.5 s at 1 GiB.
    """
    # One astral character forces CPython to store the whole mapped run at 4 bytes per
    # character, so the 512-byte destination becomes 255 characters = 1,020 bytes of str.
    destination = ("\U0001f4c4" + "\u4e00" * 254).encode("utf-16-be")
    assert len(destination) == 512  # pypdf rejects longer /ToUnicode destinations
    cmap = (
        b"/CIDInit /ProcSet findresource begin\n12 dict begin\nbegincmap\n"
        b"/CMapName /Bomb def\n/CMapType 2 def\n"
        b"1 begincodespacerange\n<00> <FF>\nendcodespacerange\n"
        b"1 beginbfchar\n<41> <%s>\nendbfchar\n"
        b"endcmap\nCMapName currentdict /CMap defineresource pop\nend\nend\n"
        % destination.hex().upper().encode()
    )
    form_ops = b"BT /F1 1 Tf 0 0 Td (" + b"A" * run + b") Tj ET\n"
    first_page = 7
    resources = b"<< /XObject << /Fm 4 0 R >> >>"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        _pages_objects(pages, first_page),
        _stream(b"", b"/Fm Do\n" * draws),
        _stream(
            b"/Type /XObject /Subtype /Form /BBox [0 0 612 792]"
            b" /Resources << /Font << /F1 5 0 R >> >>",
            form_ops,
        ),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /ToUnicode 6 0 R >>",
        _stream(b"", cmap),
    ]
    objects += [_page(3, resources) for _ in range(pages)]
    return _assemble(objects)


def oversize_pdf_bytes(
    min_bytes: int, text: str = "An oversize but otherwise valid file."
) -> bytes:
    """Return a valid one-page text PDF strictly larger than ``min_bytes``.

    The bulk is a comment block between the objects and the cross-reference table, so the
    file still opens and extracts normally: only a size guard should reject it.
    """
    literal = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)").encode("latin-1")
    resources = b"<< /Font << /F1 5 0 R >> >>"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        _page(4, resources),
        _stream(b"", b"BT /F1 12 Tf 72 720 Td (%s) Tj ET\n" % literal),
        _helvetica(),
    ]
    base = len(_assemble(objects))
    line = b"%" + b"0" * 98 + b"\n"
    filler = line * (max(0, min_bytes - base) // len(line) + 1)
    return _assemble(objects, filler=filler)


def _png_bytes() -> bytes:
    """Return a valid 1x1 PNG: a real file of another type behind a .pdf name."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00\xff\x80\x00")
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


def encrypted_pdf_bytes(
    user_password: str = "s3cret",  # noqa: S107  # a test fixture
    plain: bytes | None = None,
) -> bytes:
    """Return ``plain`` (default: a sample PDF) re-written with RC4-128 encryption.

    An empty ``user_password`` encrypts for permissions only: any reader may open it.
    """
    from pypdf import PdfReader, PdfWriter

    if plain is None:
        _, plain = _sample_bytes(1, DEFAULT_SEED)
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(plain)))
    # RC4 is built into pypdf; AES would need the optional cryptography package.
    writer.encrypt(
        user_password=user_password,
        owner_password="owner",  # noqa: S106  # a test fixture, not a secret
        algorithm="RC4-128",
    )
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


def write_poison_corpus(
    out_dir: Path, oversize_bytes: int = DEFAULT_OVERSIZE_BYTES
) -> dict[str, Path]:
    """Write one hostile file per key into ``out_dir`` as ``poison-<key>.pdf``.

    What each does to ``PdfReader(io.BytesIO(data))`` plus ``page.extract_text()``:

    - ``zero_bytes``: empty file; ``PdfReader`` raises ``EmptyFileError``.
    - ``not_pdf``: a valid PNG named .pdf; ``PdfReader`` raises ``PdfReadError``.
    - ``truncated``: the first half of a sample PDF; ``PdfReader`` raises ``PdfReadError``.
    - ``encrypted``: RC4-128 with a user password; opens, ``is_encrypted`` is true and
      reading pages without the password raises ``FileNotDecryptedError``.
    - ``oversize``: a valid text PDF larger than ``oversize_bytes``; only a size guard
      catches it.
    - ``slow``: extraction runs for hours with flat memory (see ``slow_pdf_bytes``).
    - ``memory_bomb``: extraction allocates without bound (see ``memory_bomb_pdf_bytes``).

    Never extract ``slow`` or ``memory_bomb`` outside a timeout and a memory limit.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _, sample = _sample_bytes(2, DEFAULT_SEED)
    contents = {
        "zero_bytes": b"",
        "not_pdf": _png_bytes(),
        "truncated": sample[: len(sample) // 2],
        "encrypted": encrypted_pdf_bytes(),
        "oversize": oversize_pdf_bytes(oversize_bytes),
        "slow": slow_pdf_bytes(),
        "memory_bomb": memory_bomb_pdf_bytes(),
    }
    paths = {}
    for key in POISON_KEYS:
        path = out_dir / f"poison-{key}.pdf"
        path.write_bytes(contents[key])
        paths[key] = path
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    """Regenerate the sample corpus (and optionally the poison corpus) from the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path("data/samples"), help="sample directory")
    parser.add_argument("--n", type=int, default=DEFAULT_N, help="number of sample documents")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="corpus seed")
    parser.add_argument("--poison", type=Path, default=None, help="also write poison files here")
    args = parser.parse_args(argv)

    paths = write_sample_corpus(args.out, n=args.n, seed=args.seed)
    total = sum(p.stat().st_size for p in paths)
    print(f"wrote {len(paths)} samples to {args.out} ({total / 1024:.0f} KiB)")
    if args.poison is not None:
        poison = write_poison_corpus(args.poison)
        for key, path in poison.items():
            print(f"{key:12s} {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
