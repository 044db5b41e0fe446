"""Build a corpus of PDFs made by real producers installed on this machine, with a manifest.

The bundled samples all come from fpdf2. Real documents come from office suites, TeX,
PostScript interpreters and troff, whose text layers differ in ways the samples never
show: pdfTeX's T1-encoded bitmap fonts, for one, make pypdf return NUL characters. This
module writes a small, varied source document for each producer, converts it to PDF in a
subprocess under a timeout, copies a few PDFs that Debian packages ship, and records in
``manifest.json`` what pypdf makes of every file. Nothing here is committed as a binary:
the corpus is rebuilt where the tests run.

Producers (``tests/install-realworld-tools.sh`` installs them): ``libreoffice``
(``soffice --headless --convert-to pdf``), ``ghostscript`` (``ps2pdf``), ``groff``
(``groff -Tpdf``), ``pdflatex`` and ``debian`` (PDFs under /usr/share). One that is not
installed is skipped, and the manifest says so.

Run ``python tests/realworld.py --out DIR`` to build the corpus into DIR.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from html import escape
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
DEFAULT_TIMEOUT_S = 240.0
INSPECT_TIMEOUT_S = 120.0
# Shipped PDFs: a handful, none large, so that the pipeline over the corpus stays quick.
DEFAULT_SHIPPED = 10
DEFAULT_SHIPPED_MAX_BYTES = 1_000_000
SHIPPED_ROOTS = (Path("/usr/share"),)
# Shipped PDFs taken first when present: in pypdf 7.1 amsfndoc.pdf (texlive-base, pdfTeX)
# yields a NUL and lm-info.pdf (fonts-lmodern, xdvipdfmx) lone surrogates.
SHIPPED_PREFERRED = ("amsfndoc.pdf", "lm-info.pdf")
# Man pages to typeset: the first few found of these (coreutils, tar, grep, findutils).
MAN_PAGES = ("ls.1", "cp.1", "tar.1", "grep.1", "find.1", "date.1", "chmod.1", "sort.1")
DEFAULT_MAN_PAGES = 4
MAN_ROOT = Path("/usr/share/man")
# Fixed timestamps where a producer honours them (pdfTeX, groff), so reruns differ less.
SOURCE_DATE_EPOCH = "1704164645"

# --- source material ------------------------------------------------------------------

PARAGRAPHS = (
    "The harbour authority publishes this report every quarter. It lists the vessels that "
    "berthed, the cargo they moved and the incidents that the duty officers recorded, so "
    "that the board can compare one season with the next.",
    "Dredging of the inner basin finished two weeks late because the contractor's barge "
    "was held at the lock during the spring tides. The final survey shows a depth of 11.4 m "
    "at mean low water, which meets the target for the new container berth.",
    "Pilotage requests rose by 12 per cent. Most of the increase came from smaller coastal "
    "tankers, which are now required to take a pilot above 80 m in length; the officers "
    "expect the figure to settle once the new rule is better known.",
    "Two incidents were reported: a mooring line parted at quay 4 during a gale, without "
    "injury, and a forklift struck a container stack in the bonded warehouse. Both were "
    "investigated and the findings are attached as annexes A and B.",
    "The office affirms that efficient, flawless workflows offer the fleet's staff a "
    "fluffy, affluent future: ligatures such as fi, fl, ff, ffi and ffl appear on purpose.",
)

# (language, sentence): Latin, Greek, Cyrillic, CJK, symbols and astral-plane text.
MULTILINGUAL = (
    ("English", "The quick brown fox jumps over the lazy dog."),
    ("German", "Falsches Üben von Xylophonmusik quält jeden größeren Zwerg."),
    ("French", "Voix ambiguë d'un cœur qui, au zéphyr, préfère les jattes de kiwis."),
    ("Polish", "Zażółć gęślą jaźń."),
    ("Czech", "Příliš žluťoučký kůň úpěl ďábelské ódy."),
    ("Welsh", "Dŵr, ŵyn a ẁyn: a grave accent on w and ỳ on y."),
    ("Greek", "Ταχίστη αλώπηξ βαφής ψημένη γη, δρασκελίζει υπέρ νωθρού κυνός."),
    ("Russian", "Съешь же ещё этих мягких французских булок, да выпей чаю."),
    ("Japanese", "いろはにほへと ちりぬるを 漢字かな交じり文"),
    # Look-alike characters on purpose: the point is text that is not plain ASCII.
    ("Symbols", "∀x ∈ ℝ: x² ≥ 0; ∑ᵢ aᵢ ≈ 3.14 ± 0.01; 20 € ≠ 20 $; “quotes” — dashes – …"),  # noqa: RUF001
    ("Astral", "Mathematical script 𝒜𝒷𝒸, a document 📄 and a musical clef 𝄞."),  # noqa: RUF001
)

TABLE = (
    ("Berth", "Vessel", "Cargo", "Tonnes"),
    ("Q1", "MV Nordlys", "Timber", "4 210"),
    ("Q2", "Καλυψώ", "Grain", "12 500"),
    ("Q4", "Ласточка", "Containers", "8 930"),
    ("Q7", "Zürich Ålesund", "Steel coils", "6 045"),
)

LIST_ITEMS = (
    "Check the tide tables before every movement.",
    "Report a parted line to the duty officer at once.",
    "Keep the bonded warehouse locked outside working hours.",
)


def _rows_within(limit: int) -> list[tuple[str, ...]]:
    """The rows of TABLE whose characters are all below ``limit`` (fonts without Greek)."""
    return [row for row in TABLE if all(ord(ch) < limit for ch in "".join(row))]


def _fill(template: str, **values: str) -> str:
    """Replace each ``<<name>>`` in ``template``; TeX, troff and PostScript all use braces."""
    for name, value in values.items():
        template = template.replace(f"<<{name}>>", value)
    return template


# --- the manifest ---------------------------------------------------------------------


@dataclass
class Entry:
    """One file of the corpus and what pypdf makes of it."""

    file: str
    producer: str
    source: str
    size: int
    sha256: str
    readable: bool = False
    has_text: bool = False
    pages: int = 0
    text_chars: int = 0
    nul_chars: int = 0
    surrogates: int = 0
    pdf_producer: str = ""
    error: str = ""

    @property
    def extractable(self) -> bool:
        """pypdf reads the file and finds a text layer: the pipeline must finish it."""
        return self.readable and self.has_text


@dataclass
class ProducerReport:
    """What one producer did: ``ok`` (wrote files), ``skipped`` or ``failed``; detail says why.

    An ``ok`` producer's detail lists the documents it could not convert, if any.
    """

    name: str
    status: str
    detail: str
    files: int = 0
    seconds: float = 0.0


@dataclass
class Manifest:
    """The corpus folder, a report per producer and an entry per file."""

    folder: Path
    producers: list[ProducerReport] = field(default_factory=list)
    files: list[Entry] = field(default_factory=list)

    @property
    def contributors(self) -> list[str]:
        """Names of the producers that wrote at least one file."""
        return [p.name for p in self.producers if p.files]

    @property
    def all_skipped(self) -> bool:
        """No producer was available at all (as opposed to available and broken)."""
        return all(p.status == "skipped" for p in self.producers)

    def save(self) -> Path:
        path = self.folder / MANIFEST
        data = {
            "producers": [asdict(p) for p in self.producers],
            "files": [asdict(e) for e in self.files],
        }
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        return path

    @classmethod
    def load(cls, folder: Path) -> Manifest:
        data = json.loads((Path(folder) / MANIFEST).read_text())
        return cls(
            Path(folder),
            [ProducerReport(**p) for p in data["producers"]],
            [Entry(**e) for e in data["files"]],
        )


# --- running producers ----------------------------------------------------------------


class ToolMissing(Exception):
    """A producer's executable is not on PATH."""


class ToolFailed(Exception):
    """A producer's command failed, timed out or wrote no PDF."""


@dataclass
class Context:
    """What a producer function gets: a scratch folder, the output folder and a runner."""

    work: Path
    out: Path
    timeout_s: float
    env: dict[str, str]
    man_pages: int = DEFAULT_MAN_PAGES
    shipped: int = DEFAULT_SHIPPED
    shipped_max_bytes: int = DEFAULT_SHIPPED_MAX_BYTES
    shipped_roots: tuple[Path, ...] = SHIPPED_ROOTS
    made: list[tuple[Path, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def need(self, *tools: str) -> None:
        missing = [tool for tool in tools if shutil.which(tool, path=self.env["PATH"]) is None]
        if missing:
            raise ToolMissing(f"{', '.join(missing)} not installed")

    def run(self, args: Sequence[str], *, cwd: Path, stdin: bytes | None = None) -> bytes:
        """Run one command under the timeout and return its output; raise ToolFailed if it fails.

        The command gets a session of its own, and whatever of it is left at the end (soffice
        forks soffice.bin, for one) is killed with it.
        """
        proc = subprocess.Popen(
            list(args),
            cwd=cwd,
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(stdin, timeout=self.timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise ToolFailed(f"{args[0]} timed out after {self.timeout_s:.0f} s") from exc
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        if proc.returncode != 0:
            tail = (out + err).decode(errors="replace").strip().splitlines()[-3:]
            raise ToolFailed(f"{args[0]} exited {proc.returncode}: {' | '.join(tail)}")
        return out

    def add(self, made: Path, name: str, source: str) -> None:
        """Move a produced PDF into the corpus as ``<name>.pdf``."""
        if not made.is_file() or made.stat().st_size == 0:
            raise ToolFailed(f"no PDF written for {source}")
        target = self.out / f"{name}.pdf"
        shutil.move(made, target)
        self.made.append((target, source))

    def attempt(self, source: str, action: Callable[..., None], *args: Any) -> None:
        """Run ``action(*args)`` for one document; a failure is recorded and the others go on."""
        try:
            action(*args)
        except ToolFailed as exc:
            self.errors.append(f"{source}: {exc}")


# --- libreoffice ----------------------------------------------------------------------


def _html_report() -> str:
    """An HTML page with headings, a table, an ordered list and text in many scripts."""
    rows = "\n".join(
        "<tr>" + "".join(f"<{tag}>{escape(c)}</{tag}>" for c in row) + "</tr>"
        for tag, row in zip(["th"] + ["td"] * len(TABLE), TABLE, strict=False)
    )
    lines = "\n".join(
        f"<li><b>{escape(lang)}</b>: {escape(text)}</li>" for lang, text in MULTILINGUAL
    )
    steps = "\n".join(f"<li>{escape(item)}</li>" for item in LIST_ITEMS)
    paragraphs = "\n".join(f"<p>{escape(p)}</p>" for p in PARAGRAPHS)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Quarterly harbour report</title></head>
<body>
<h1>Quarterly harbour report</h1>
{paragraphs}
<h2>Berth occupancy</h2>
<table border="1">
{rows}
</table>
<h2>Standing orders</h2>
<ol>
{steps}
</ol>
<h2>Sample text in several scripts</h2>
<ul>
{lines}
</ul>
</body></html>
"""


def _html_long() -> str:
    """A longer HTML page: eight sections of paragraphs over several PDF pages."""
    sections = []
    for number in range(1, 9):
        body = "\n".join(
            f"<p>{escape(PARAGRAPHS[(number + i) % len(PARAGRAPHS)])}</p>" for i in range(4)
        )
        lang, text = MULTILINGUAL[number % len(MULTILINGUAL)]
        sections.append(
            f"<h2>{number}. Section {number}</h2>\n{body}\n<blockquote>{lang}: "
            f"{escape(text)}</blockquote>"
        )
    return (
        '<!DOCTYPE html><html><head><meta charset="utf-8"><title>Annual review</title>'
        "</head><body><h1>Annual review</h1>\n" + "\n".join(sections) + "\n</body></html>\n"
    )


def _plain_text() -> str:
    """A UTF-8 memo in plain text, with a table drawn in ASCII."""
    lines = ["MEMORANDUM", "", "To: all berth operators", "Re: winter schedule", ""]
    lines += [*PARAGRAPHS, ""]
    lines += [f"{lang:10s} {text}" for lang, text in MULTILINGUAL]
    lines += ["", "  Berth | Vessel          | Tonnes"]
    lines += [f"  {r[0]:5s} | {r[1]:15s} | {r[3]:>6s}" for r in TABLE[1:]]
    return "\n".join(lines) + "\n"


def _fodt() -> str:
    """A flat ODF text document: headings, a list, a table and paragraphs."""
    ns = (
        'xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
        'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" '
        'xmlns:table="urn:oasis:names:tc:opendocument:xmlns:table:1.0"'
    )
    cells = "\n".join(
        "<table:table-row>"
        + "".join(
            f'<table:table-cell office:value-type="string"><text:p>{escape(c)}</text:p>'
            "</table:table-cell>"
            for c in row
        )
        + "</table:table-row>"
        for row in TABLE
    )
    items = "".join(
        f"<text:list-item><text:p>{escape(lang)}: {escape(text)}</text:p></text:list-item>"
        for lang, text in MULTILINGUAL
    )
    paragraphs = "".join(f"<text:p>{escape(p)}</text:p>" for p in PARAGRAPHS)
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<office:document {ns} office:version="1.3"
 office:mimetype="application/vnd.oasis.opendocument.text">
<office:body><office:text>
<text:h text:outline-level="1">Letter to the harbour board</text:h>
{paragraphs}
<text:h text:outline-level="2">Cargo by berth</text:h>
<table:table table:name="Cargo"><table:table-column table:number-columns-repeated="4"/>
{cells}
</table:table>
<text:h text:outline-level="2">Greetings</text:h>
<text:list>{items}</text:list>
</office:text></office:body></office:document>
"""


def _docx(path: Path) -> None:
    """Write a minimal Word document: three parts, paragraphs, a heading and a table."""

    def para(text: str, style: str = "") -> str:
        props = f'<w:pPr><w:pStyle w:val="{style}"/></w:pPr>' if style else ""
        return f'<w:p>{props}<w:r><w:t xml:space="preserve">{escape(text)}</w:t></w:r></w:p>'

    def cell(text: str) -> str:
        return f"<w:tc>{para(text)}</w:tc>"

    table = (
        "<w:tbl><w:tblPr><w:tblBorders>"
        + "".join(
            f'<w:{side} w:val="single" w:sz="4"/>'
            for side in ("top", "left", "bottom", "right", "insideH", "insideV")
        )
        + "</w:tblBorders></w:tblPr>"
        + "".join("<w:tr>" + "".join(cell(c) for c in row) + "</w:tr>" for row in TABLE)
        + "</w:tbl>"
    )
    body = (
        para("Minutes of the operations meeting", "Heading1")
        + "".join(para(p) for p in PARAGRAPHS)
        + table
        + "".join(para(f"{lang}: {text}") for lang, text in MULTILINGUAL)
    )
    word = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
    document = (
        f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n<w:document xmlns:w="{word}">'
        f"<w:body>{body}<w:sectPr/></w:body></w:document>"
    )
    content_types = (
        '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
        '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
        '<Default Extension="rels" '
        'ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
        '<Default Extension="xml" ContentType="application/xml"/>'
        '<Override PartName="/word/document.xml" ContentType="application/'
        'vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>'
    )
    rels = (
        '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
        '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
        '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/'
        'relationships/officeDocument" Target="word/document.xml"/></Relationships>'
    )
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as docx:
        docx.writestr("[Content_Types].xml", content_types)
        docx.writestr("_rels/.rels", rels)
        docx.writestr("word/document.xml", document)


def _rtf() -> str:
    """An RTF file whose non-ASCII text is written as \\uN escapes, as Word writes it."""

    def encode(text: str) -> str:
        out = []
        for char in text:
            if ord(char) < 128:
                out.append("\\" + char if char in "\\{}" else char)
                continue
            # RTF counts UTF-16 code units, as signed 16-bit numbers.
            data = char.encode("utf-16-be")
            for i in range(0, len(data), 2):
                unit = int.from_bytes(data[i : i + 2], "big")
                out.append(f"\\u{unit - 65536 if unit > 32767 else unit}?")
        return "".join(out)

    body = "\\par\n".join(encode(p) for p in PARAGRAPHS[:3])
    langs = "\\par\n".join(encode(f"{lang}: {text}") for lang, text in MULTILINGUAL)
    return (
        "{\\rtf1\\ansi\\deff0{\\fonttbl{\\f0 DejaVu Serif;}}\n"
        "{\\b\\fs32 Notice to mariners\\par}\n" + body + "\\par\n" + langs + "\\par\n}\n"
    )


def produce_libreoffice(ctx: Context) -> None:
    """Convert HTML, text, flat ODT, DOCX and RTF documents with one headless soffice."""
    ctx.need("soffice")
    sources = {
        "report.html": _html_report(),
        "review.html": _html_long(),
        "memo.txt": _plain_text(),
        "letter.fodt": _fodt(),
        "notice.rtf": _rtf(),
    }
    for name, text in sources.items():
        (ctx.work / name).write_text(text, encoding="utf-8")
    _docx(ctx.work / "minutes.docx")
    names = [*sources, "minutes.docx"]
    profile = (ctx.work / "profile").as_uri()
    # A private profile: a user's running LibreOffice (or a second test run) would
    # otherwise take the conversion over or lock it out.
    ctx.run(
        [
            "soffice",
            f"-env:UserInstallation={profile}",
            "--headless",
            "--norestore",
            "--convert-to",
            "pdf:writer_pdf_Export",
            "--outdir",
            str(ctx.work / "pdf"),
            *names,
        ],
        cwd=ctx.work,
    )
    for name in names:
        stem, suffix = name.rsplit(".", 1)
        ctx.attempt(name, ctx.add, ctx.work / "pdf" / f"{stem}.pdf", f"{stem}-{suffix}", name)


# --- ghostscript ----------------------------------------------------------------------

_PS_PROLOGUE = """%!PS-Adobe-3.0
%%Title: <<title>>
%%Creator: replayable tests/realworld.py
%%DocumentMedia: Letter 612 792 0 () ()
%%EndComments
% Latin-1 versions of the standard fonts, for accented text.
/reencode { findfont dup length dict begin { 1 index /FID ne { def } { pop pop } ifelse }
  forall /Encoding ISOLatin1Encoding def currentdict end definefont pop } def
/Times-Latin1 /Times-Roman reencode
/Times-BoldLatin1 /Times-Bold reencode
/Helvetica-Latin1 /Helvetica reencode
/Courier-Latin1 /Courier reencode
/F { findfont exch scalefont setfont } def
"""


def _ps_string(text: str) -> str:
    """Return ``text`` as a PostScript string literal in ISO Latin-1."""
    out = []
    for byte in text.encode("latin-1", errors="replace"):
        if byte in b"()\\":
            out.append("\\" + chr(byte))
        elif 32 <= byte < 127:
            out.append(chr(byte))
        else:
            out.append(f"\\{byte:03o}")
    return "(" + "".join(out) + ")"


def _wrap(text: str, width: int) -> list[str]:
    lines: list[str] = []
    line = ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line] if line else lines


def _ps_pages(title: str, blocks: Sequence[tuple[str, str]]) -> str:
    """Lay ``blocks`` (kind, text) out top to bottom on as many Letter pages as they need."""
    styles = {
        "title": ("Times-BoldLatin1", 18, 60),
        "heading": ("Times-BoldLatin1", 13, 70),
        "text": ("Times-Latin1", 10.5, 95),
        "mono": ("Courier-Latin1", 9, 80),
    }
    pages: list[list[str]] = [[]]
    y = 720.0
    for kind, text in blocks:
        font, size, width = styles[kind]
        for line in _wrap(text, width) if kind != "mono" else [text]:
            if y < 72:
                pages.append([])
                y = 720.0
            pages[-1].append(f"{size} /{font} F 72 {y:.1f} moveto {_ps_string(line)} show")
            y -= size * 1.35
        y -= 6
    out = [_fill(_PS_PROLOGUE, title=title)]
    for number, lines in enumerate(pages, start=1):
        footer = f"9 /Helvetica-Latin1 F 290 40 moveto ({number}) show"
        out.append(f"%%Page: {number} {number}\n" + "\n".join([*lines, footer]) + "\nshowpage\n")
    return "".join(out) + "%%EOF\n"


def _ps_report() -> str:
    blocks = [("title", "Harbour operations: second quarter")]
    for round_ in range(3):
        blocks.append(("heading", f"{round_ + 1}. Review of the quarter"))
        blocks += [("text", p) for p in PARAGRAPHS]
    blocks.append(("heading", "Correspondents"))
    blocks += [
        ("text", f"{lang}: {text}")
        for lang, text in MULTILINGUAL
        if text.encode("latin-1", errors="ignore").decode("latin-1") == text
    ]
    return _ps_pages("Harbour operations", blocks)


def _ps_table() -> str:
    """A ruled table drawn with lines, in Courier and Helvetica."""
    lines = [_fill(_PS_PROLOGUE, title="Berth table"), "%%Page: 1 1\n"]
    lines.append("16 /Helvetica-Latin1 F 72 720 moveto (Berth occupancy, week 14) show\n")
    widths = (70, 160, 120, 80)
    top = 690
    for r, row in enumerate(_rows_within(0x100)):
        x = 72
        y = top - 22 * r
        font = "/Helvetica-Latin1" if r == 0 else "/Courier-Latin1"
        for width, cell in zip(widths, row, strict=True):
            lines.append(f"0.5 setlinewidth {x} {y - 6} {width} 22 rectstroke\n")
            lines.append(f"10 {font} F {x + 4} {y + 2} moveto {_ps_string(cell)} show\n")
            x += width
    lines.append("showpage\n%%EOF\n")
    return "".join(lines)


def _ps_symbols() -> str:
    """Greek and mathematics in the Symbol font, whose encoding is its own."""
    body = [
        "18 /Helvetica-Latin1 F 72 720 moveto (Symbols in the Symbol font) show",
        "12 /Symbol F 72 690 moveto (abgdezhqiklmnxoprstufcyw) show",
        "12 /Symbol F 72 670 moveto (GDQLXPSFYW) show",
        r"12 /Symbol F 72 650 moveto (\245 \263 \271 \273 \326 \362 \345 \326) show",
        "11 /Times-Latin1 F 72 620 moveto (Alpha to omega above, then infinity, relations,"
        " a root, an integral and a sum.) show",
    ]
    return (
        _fill(_PS_PROLOGUE, title="Symbols")
        + "%%Page: 1 1\n"
        + "\n".join(body)
        + "\nshowpage\n%%EOF\n"
    )


def _ps_watermark() -> str:
    """Two text columns under a rotated grey watermark, drawn first."""
    out = [_fill(_PS_PROLOGUE, title="Draft"), "%%Page: 1 1\n"]
    out.append("gsave 0.85 setgray 306 396 translate 45 rotate 72 /Helvetica-Latin1 F")
    out.append(" -150 0 moveto (DRAFT) show grestore\n")
    for column, x in enumerate((72, 320)):
        y = 720.0
        for p in PARAGRAPHS[column::2]:
            for line in _wrap(p, 42):
                out.append(f"10 /Times-Latin1 F {x} {y:.1f} moveto {_ps_string(line)} show\n")
                y -= 13
            y -= 8
    out.append("showpage\n%%EOF\n")
    return "".join(out)


def _ps_glyphs() -> str:
    """Named glyphs painted with glyphshow: ligatures, euro, quotes, outside any encoding."""
    names = "f i fi space f l fl space quotedblleft T e x t quotedblright space Euro space"
    names += " e acute space n tilde space emdash space bullet"
    shows = " ".join(f"/{name} glyphshow" for name in names.split())
    return (
        _fill(_PS_PROLOGUE, title="Glyphs")
        + "%%Page: 1 1\n"
        + "14 /Times-Roman F 72 700 moveto (Glyphs by name:) show\n"
        + f"14 /Times-Roman F 72 680 moveto {shows}\n"
        + "showpage\n%%EOF\n"
    )


def produce_ghostscript(ctx: Context) -> None:
    """Distil generated PostScript with ps2pdf (Ghostscript's pdfwrite device)."""
    ctx.need("ps2pdf", "gs")
    sources = {
        "report": _ps_report(),
        "table": _ps_table(),
        "symbols": _ps_symbols(),
        "watermark": _ps_watermark(),
        "glyphs": _ps_glyphs(),
    }
    for name, text in sources.items():
        ctx.attempt(f"{name}.ps", _distil, ctx, name, text)


def _distil(ctx: Context, name: str, text: str) -> None:
    (ctx.work / f"{name}.ps").write_text(text, encoding="latin-1")
    ctx.run(["ps2pdf", f"{name}.ps", f"{name}.pdf"], cwd=ctx.work)
    ctx.add(ctx.work / f"{name}.pdf", f"ps2pdf-{name}", f"{name}.ps")


# --- groff ----------------------------------------------------------------------------

_MS_DOCUMENT = r""".TL
Tide tables and berth rules
.AU
The harbour office
.AB
How the office reads the tide tables, which berths take which ships, and the
formula the pilots use for under-keel clearance.
.AE
.NH
Introduction
.PP
<<p0>>
.PP
<<p1>>
.NH
Berths
.TS
box center tab(|);
cb cb cb cb
l l l n.
<<table>>
.TE
.NH
Clearance
.PP
The clearance follows from the draught, the charted depth and the tide:
.EQ
c = d sub chart + h sub tide - ( T + s ) over 2
.EN
.PP
and a squat allowance of
.EQ
s = C sub B V sup 2 over 100
.EN
.NH
Standing orders
.IP \(bu 3
<<l0>>
.IP \(bu
<<l1>>
.IP \(bu
<<l2>>
.PP
Accented names on the crew list: Größe, Cœur, Ærø, façade, naïve, Øresund.
"""


def produce_groff(ctx: Context) -> None:
    """Typeset a few installed man pages and a generated ms document with ``groff -Tpdf``."""
    ctx.need("groff")
    found = []
    for page in MAN_PAGES:
        section = page.rsplit(".", 1)[1]
        for candidate in (
            MAN_ROOT / f"man{section}" / f"{page}.gz",
            MAN_ROOT / f"man{section}" / page,
        ):
            if candidate.is_file():
                found.append(candidate)
                break
        if len(found) == ctx.man_pages:
            break
    for path in found:
        ctx.attempt(str(path), _man_page, ctx, path)
    ms = _fill(
        _MS_DOCUMENT,
        p0=PARAGRAPHS[0],
        p1=PARAGRAPHS[1],
        table="\n".join("|".join(row) for row in TABLE),
        l0=LIST_ITEMS[0],
        l1=LIST_ITEMS[1],
        l2=LIST_ITEMS[2],
    )
    ctx.attempt(
        "rules.ms", _groff, ctx, "groff-ms-rules", "rules.ms", ms.encode(), ["-t", "-e", "-ms"]
    )
    if not found:
        ctx.errors.append(f"no man pages of {', '.join(MAN_PAGES)} under {MAN_ROOT}")


def _man_page(ctx: Context, path: Path) -> None:
    source = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    name = path.name.removesuffix(".gz").replace(".", "-")
    _groff(ctx, f"groff-man-{name}", path.name, source, ["-t", "-man"])


def _groff(ctx: Context, name: str, source: str, text: bytes, macros: list[str]) -> None:
    target = ctx.work / f"{name}.pdf"
    target.write_bytes(ctx.run(["groff", "-Kutf8", "-Tpdf", *macros], cwd=ctx.work, stdin=text))
    ctx.add(target, name, source)


# --- pdflatex -------------------------------------------------------------------------

_LATEX_BODY = r"""
\section{Introduction}
<<p0>>

<<p1>>

Ligatures and punctuation: office, affluent, fluffy, efficient, ``quoted'' and `single',
en--dash, em---dash, ellipsis\ldots{} and a footnote.\footnote{<<p3>>}

\section{Lists and a table}
\begin{itemize}
\item <<l0>>
\item <<l1>>
\end{itemize}
\begin{enumerate}
\item <<l2>>
\item Keep the logs for seven years.
\end{enumerate}
\begin{center}
\begin{tabular}{|l|l|l|r|}
\hline
<<table>>
\end{tabular}
\end{center}

\section{Mathematics}
Inline: $\Gamma(n) = (n-1)!$, $\alpha + \beta \le \gamma$, $\sum_{k=1}^n k = n(n+1)/2$.
Displayed:
\[ \int_0^\infty e^{-x^2}\,dx = \frac{\sqrt\pi}{2}, \qquad
   \Delta\Theta\Lambda\Xi\Pi\Sigma\Upsilon\Phi\Psi\Omega. \]
<<extra>>
"""

# A T1-encoded document: without cm-super, pdfTeX falls back to METAFONT bitmaps of the EC
# fonts (Type3), and a grave accent with no precomposed glyph (w, y, n) is set as code 0
# plus the letter: pypdf reads code 0 as NUL. This is the real-world NUL this corpus needs.
_LATEX_T1_EXTRA = r"""
\section{Accents}
German: Größe, Übermaß, Straße. French: cœur, naïve, façade, où, déjà.
Polish: Zażółć gęślą jaźń. Czech: Příliš žluťoučký kůň.
Welsh: \`w, \`y, \^w, \^y; Pinyin: \`n, \v{e}, \u{a}; and a lone grave \`{} accent.
"""

# Type1 fonts with /ToUnicode maps (glyphtounicode), links and amsmath.
_LATEX_LINKS_EXTRA = r"""
\section{Links}
See \url{https://example.org/tides} and \href{mailto:office@example.org}{the office}.
\begin{align}
a^2 + b^2 &= c^2 \\
e^{i\pi} + 1 &= 0
\end{align}
"""

_LATEX_DOCUMENTS = {
    "article-ot1": (r"\documentclass{article}", ""),
    "article-t1": (
        "\\documentclass{article}\n\\usepackage[T1]{fontenc}\n\\usepackage[utf8]{inputenc}",
        _LATEX_T1_EXTRA,
    ),
    "tounicode": (
        "\\documentclass{article}\n\\input glyphtounicode\n\\pdfgentounicode=1\n"
        "\\usepackage{amsmath}\n\\usepackage{hyperref}",
        _LATEX_LINKS_EXTRA,
    ),
}


def _latex_source(preamble: str, extra: str) -> str:
    # LaTeX's default setup has no Greek or Cyrillic: keep the rows it can typeset.
    latin = _rows_within(0x250)
    rows = " \\\\ \\hline\n".join(" & ".join(row) for row in latin) + " \\\\ \\hline"
    body = _fill(
        _LATEX_BODY,
        p0=PARAGRAPHS[0],
        p1=PARAGRAPHS[1],
        p3=PARAGRAPHS[3],
        l0=LIST_ITEMS[0],
        l1=LIST_ITEMS[1],
        l2=LIST_ITEMS[2],
        table=rows,
        extra=extra,
    )
    return f"{preamble}\n\\begin{{document}}\n{body}\n\\end{{document}}\n"


def _latex_report() -> str:
    """A report class document with a table of contents over several pages."""
    chapters = []
    for number in range(1, 5):
        sections = "\n".join(
            f"\\section{{Part {number}.{s}}}\n" + "\n\n".join(PARAGRAPHS[(number + s) % 5 :])
            for s in range(1, 4)
        )
        chapters.append(f"\\chapter{{Chapter {number}}}\n{sections}")
    return (
        "\\documentclass{report}\n\\begin{document}\n\\title{Annual harbour review}\n"
        "\\author{The harbour office}\n\\maketitle\n\\tableofcontents\n"
        + "\n".join(chapters)
        + "\n\\end{document}\n"
    )


def produce_pdflatex(ctx: Context) -> None:
    """Typeset generated LaTeX documents with pdflatex (Computer Modern, T1, ToUnicode)."""
    ctx.need("pdflatex")
    sources = {name: _latex_source(*parts) for name, parts in _LATEX_DOCUMENTS.items()}
    sources["report-toc"] = _latex_report()
    for name, text in sources.items():
        ctx.attempt(f"{name}.tex", _latex, ctx, name, text)


def _latex(ctx: Context, name: str, text: str) -> None:
    (ctx.work / f"{name}.tex").write_text(text, encoding="utf-8")
    # Twice, so that the table of contents is filled in.
    for _ in range(2 if "tableofcontents" in text else 1):
        ctx.run(
            ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", f"{name}.tex"], cwd=ctx.work
        )
    ctx.add(ctx.work / f"{name}.pdf", f"pdflatex-{name}", f"{name}.tex")


# --- PDFs that Debian packages ship ---------------------------------------------------


def _shipped_pdfs(roots: Sequence[Path], max_bytes: int) -> list[Path]:
    """Every regular ``*.pdf`` file under ``roots`` no larger than ``max_bytes``, by path."""
    found: set[Path] = set()
    for root in roots:
        for folder, _, names in os.walk(root):
            for name in names:
                if not name.lower().endswith(".pdf"):
                    continue
                path = Path(folder, name)
                try:
                    real = path.resolve(strict=True)
                    size = real.stat().st_size
                except OSError:
                    continue
                if real.is_file() and 0 < size <= max_bytes:
                    found.add(real)
    return sorted(found)


def spread(items: Sequence[Any], count: int) -> list[Any]:
    """Return ``count`` items spread evenly over ``items`` (all of them if there are fewer)."""
    if count >= len(items):
        return list(items)
    if count <= 0:
        return []
    if count == 1:
        return [items[len(items) // 2]]
    step = (len(items) - 1) / (count - 1)
    return [items[round(i * step)] for i in range(count)]


def produce_debian(ctx: Context) -> None:
    """Copy a few PDFs that installed packages ship, spread from the smallest to the largest."""
    candidates = _shipped_pdfs(ctx.shipped_roots, ctx.shipped_max_bytes)
    if not candidates:
        raise ToolMissing(f"no PDF under {', '.join(map(str, ctx.shipped_roots))}")
    unique: dict[str, Path] = {}
    for path in sorted(candidates, key=lambda p: (p.stat().st_size, str(p))):
        unique.setdefault(_sha256(path), path)
    chosen = [p for p in unique.values() if p.name in SHIPPED_PREFERRED][: ctx.shipped]
    rest = [p for p in unique.values() if p not in chosen]
    chosen += spread(rest, ctx.shipped - len(chosen))
    taken: set[str] = set()
    for path in chosen:
        name = "debian-" + re.sub(r"[^A-Za-z0-9]+", "-", path.stem).strip("-").lower()
        if name in taken:
            name += "-" + re.sub(r"[^A-Za-z0-9]+", "-", path.parent.name).strip("-").lower()
        taken.add(name)
        copy = ctx.work / path.name
        shutil.copyfile(path, copy)
        ctx.add(copy, name, str(path))


# --- inspecting and building ----------------------------------------------------------

PRODUCERS: dict[str, Callable[[Context], None]] = {
    "libreoffice": produce_libreoffice,
    "ghostscript": produce_ghostscript,
    "groff": produce_groff,
    "pdflatex": produce_pdflatex,
    "debian": produce_debian,
}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def inspect_pdf(path: Path) -> dict[str, Any]:
    """What pypdf makes of ``path``: readable, text layer, pages, NULs and surrogates.

    Uses pypdf directly, not the stage under test, so that the manifest is an independent
    statement of what the stage must achieve.
    """
    import logging

    import pypdf

    logging.disable(logging.WARNING)  # pypdf logs every oddity of real files
    result: dict[str, Any] = {}
    try:
        reader = pypdf.PdfReader(path)
        if reader.is_encrypted:
            return {"error": "encrypted"}
        text = "".join(page.extract_text() or "" for page in reader.pages)
        result["pages"] = len(reader.pages)
        result["pdf_producer"] = str((reader.metadata or {}).get("/Producer", ""))
    except Exception as exc:  # any failure means "pypdf cannot read it"
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    result.update(
        readable=True,
        has_text=any(ch.isprintable() and not ch.isspace() for ch in text),
        text_chars=len(text),
        nul_chars=text.count("\x00"),
        surrogates=len(re.findall("[\ud800-\udfff]", text)),
    )
    return result


def _inspect_in_subprocess(path: Path, timeout_s: float) -> dict[str, Any]:
    """Run ``inspect_pdf`` in a child process, so that a file that hangs pypdf costs a timeout."""
    try:
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--inspect", str(path)],
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"pypdf took more than {timeout_s:.0f} s"}
    if done.returncode != 0:
        return {"error": f"inspection exited {done.returncode}: {done.stderr.decode()[-300:]}"}
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _subprocess_env(work: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        SOURCE_DATE_EPOCH=SOURCE_DATE_EPOCH,
        FORCE_SOURCE_DATE="1",
        # TeX's generated bitmap fonts go to the scratch folder, not to the user's home.
        TEXMFVAR=str(work / "texmf-var"),
        LC_ALL="C.UTF-8",
    )
    return env


def _clear_previous(out: Path) -> None:
    """Remove the files of a corpus built here before, and nothing else."""
    manifest = out / MANIFEST
    if not manifest.is_file():
        return
    for entry in Manifest.load(out).files:
        (out / entry.file).unlink(missing_ok=True)
    manifest.unlink()


def build(
    out: Path,
    *,
    producers: Sequence[str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    man_pages: int = DEFAULT_MAN_PAGES,
    shipped: int = DEFAULT_SHIPPED,
    shipped_max_bytes: int = DEFAULT_SHIPPED_MAX_BYTES,
    shipped_roots: Sequence[Path] = SHIPPED_ROOTS,
    log: Callable[[str], None] = lambda _: None,
) -> Manifest:
    """Build the corpus into ``out`` with each available producer and write its manifest."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _clear_previous(out)
    manifest = Manifest(out)
    sources: dict[Path, tuple[str, str]] = {}
    for name in producers or PRODUCERS:
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"realworld-{name}-") as scratch:
            work = Path(scratch)
            ctx = Context(
                work=work,
                out=out,
                timeout_s=timeout_s,
                env=_subprocess_env(work),
                man_pages=man_pages,
                shipped=shipped,
                shipped_max_bytes=shipped_max_bytes,
                shipped_roots=tuple(shipped_roots),
            )
            try:
                PRODUCERS[name](ctx)
            except ToolMissing as exc:
                report = ProducerReport(name, "skipped", str(exc))
            except (ToolFailed, OSError) as exc:
                ctx.errors.insert(0, str(exc))
                report = ProducerReport(name, "failed", "; ".join(ctx.errors))
            else:
                status = "ok" if ctx.made else "failed"
                report = ProducerReport(name, status, "; ".join(ctx.errors))
        report.files = len(ctx.made)
        report.seconds = round(time.monotonic() - started, 1)
        manifest.producers.append(report)
        detail = f"  {report.detail}" if report.detail else ""
        counts = f"{report.files:3d} file(s) {report.seconds:6.1f} s"
        log(f"{name:12s} {report.status:8s} {counts}{detail}")
        for path, source in ctx.made:
            sources[path] = (name, source)

    seen: dict[str, Path] = {}
    for path, (producer, source) in sources.items():
        digest = _sha256(path)
        if digest in seen:
            # The pipeline keys documents by content: a second copy would be the same item.
            path.unlink()
            continue
        seen[digest] = path
        manifest.files.append(Entry(path.name, producer, source, path.stat().st_size, digest))
    workers = max(1, min(4, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        found = pool.map(
            lambda e: _inspect_in_subprocess(out / e.file, INSPECT_TIMEOUT_S), manifest.files
        )
        for entry, facts in zip(manifest.files, found, strict=True):
            for key, value in facts.items():
                setattr(entry, key, value)
    manifest.save()
    return manifest


def summary(manifest: Manifest) -> Iterator[str]:
    """Lines a person reads after a build: totals, NULs and surrogates per producer."""
    total = sum(e.size for e in manifest.files)
    yield (
        f"{len(manifest.files)} files, {total / 2**20:.1f} MiB, from "
        f"{len(manifest.contributors)} producer(s): {', '.join(manifest.contributors) or '-'}"
    )
    for producer in manifest.contributors:
        entries = [e for e in manifest.files if e.producer == producer]
        yield (
            f"  {producer:12s} {len(entries):3d} files, "
            f"{sum(e.extractable for e in entries):3d} with a text layer, "
            f"NUL in {sum(e.nul_chars > 0 for e in entries)} ({sum(e.nul_chars for e in entries)}"
            f" chars), surrogates in {sum(e.surrogates > 0 for e in entries)}"
        )
    for report in manifest.producers:
        if report.detail:
            yield f"  {report.name:12s} {report.status}: {report.detail}"


def main(argv: Sequence[str] | None = None) -> int:
    """Build the corpus from the command line; exit 1 when no producer wrote a file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, help="folder to build the corpus into")
    parser.add_argument(
        "--only", default="", help=f"comma-separated producers (default: {','.join(PRODUCERS)})"
    )
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="per command")
    parser.add_argument("--shipped", type=int, default=DEFAULT_SHIPPED, help="shipped PDFs to copy")
    parser.add_argument(
        "--shipped-root",
        type=Path,
        action="append",
        help=f"folder to find shipped PDFs in (repeatable; default: {SHIPPED_ROOTS[0]})",
    )
    parser.add_argument("--inspect", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inspect is not None:
        print(json.dumps(inspect_pdf(args.inspect)))
        return 0
    if args.out is None:
        parser.error("--out is required")
    only = [name for name in args.only.split(",") if name]
    unknown = sorted(set(only) - set(PRODUCERS))
    if unknown:
        parser.error(f"unknown producer(s): {', '.join(unknown)}")
    manifest = build(
        args.out,
        producers=only or None,
        timeout_s=args.timeout,
        shipped=args.shipped,
        shipped_roots=args.shipped_root or SHIPPED_ROOTS,
        log=print,
    )
    for line in summary(manifest):
        print(line)
    return 0 if manifest.files else 1


if __name__ == "__main__":
    sys.exit(main())
