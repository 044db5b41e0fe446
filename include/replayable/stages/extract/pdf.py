"""Extract text from a PDF with PDFium or pypdf: the extract stage's work.

Runs inside a guarded worker process (see ``replayable.guards``): it is the stage that
parses untrusted bytes, so a stall, a native crash or a blow-up here must cost one item, not
the batch. The engines (ADR 0103):

- ``pdfium`` (the default): PDFium through pypdfium2, native code, about ten times faster;
- ``pypdf``: pure Python, the fallback;
- ``auto``: PDFium, then pypdf where PDFium refuses the file or finds no text.

Both engines' text is normalised the same way (``sanitize_text``). The stage's code version
is ``replayable.stages.extract.VERSION``.
"""

from __future__ import annotations

import gc
import hashlib
import io
import os
import re
import stat
from dataclasses import dataclass

import pypdf
import pypdfium2
import pypdfium2.raw as pdfium_c
from pypdf.errors import (
    DependencyError,
    DeprecationError,
    FileNotDecryptedError,
    LimitReachedError,
    PdfReadError,
    PyPdfError,
)

from replayable.retry import ErrorKind, ItemError
from replayable.stages.extract import DEFAULT_ENGINE, extractor_id

# Inputs at least this large are followed by a garbage collection (see _page_texts).
_COLLECT_AFTER_BYTES = 4 * 2**20

# PDF 1.7 §7.5.2: the header may follow up to 1024 bytes of junk.
_HEADER_WINDOW = 1024

# pypdf 7.1 decodes /ToUnicode maps and UTF-16 strings with errors="surrogatepass": a map
# that names a surrogate leaves it in the text, and no UTF-8 encoder accepts one.
_SURROGATE_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
# C0 and C1 control characters but tab and line feed: NUL, which Postgres refuses, and the
# rest (PDFium marks a generated hyphen with U+0002, pypdf passes a font's raw codes through),
# which no reader of the text wants. Line endings are unified to \n first.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_LINE_END = re.compile("\r\n?")

# What PDFium's loader says, by error code, as this stage's error classes.
_PDFIUM_LOAD_ERRORS = {
    pdfium_c.FPDF_ERR_PASSWORD: "encrypted",
    pdfium_c.FPDF_ERR_SECURITY: "unsupported",
    pdfium_c.FPDF_ERR_FORMAT: "malformed",
    pdfium_c.FPDF_ERR_FILE: "malformed",
}
# Failures after which ``auto`` tries pypdf: PDFium refused the file or found no text in it.
_FALLBACK_CLASSES = frozenset({"encrypted", "malformed", "unsupported", "empty_text"})


@dataclass(frozen=True)
class Extraction:
    """Text and page count of one document, and the engine that read it.

    ``removed_chars`` counts the characters of the engine's text that were dropped or
    replaced: control characters and what Postgres could not store (see ``sanitize_text``).
    """

    page_count: int
    text: str
    removed_chars: int = 0
    engine: str = DEFAULT_ENGINE


def _join_pair(match: re.Match[str]) -> str:
    """Return the one character that a UTF-16 surrogate pair stands for."""
    return match.group().encode("utf-16-be", "surrogatepass").decode("utf-16-be")


def sanitize_text(text: str) -> tuple[str, int]:
    """Return ``text`` normalised and as Postgres ``text`` stores it, and how many characters
    were dropped or replaced.

    Line endings become ``\n`` (PDFium ends lines with ``\r\n``, pypdf with ``\n``); that
    is not counted. Control characters other than tab and line feed are dropped: NUL, which
    a UTF-8 Postgres refuses (pdfTeX's T1-encoded bitmap fonts put one wherever a grave
    accent has no precomposed glyph), and the others, which carry no text. A UTF-16
    surrogate pair is joined into its character, and a lone surrogate, which no driver can
    encode, becomes U+FFFD. Every other character is kept as it is.
    """
    if "\r" in text:
        text = _LINE_END.sub("\n", text)
    text, removed = _CONTROL.subn("", text)
    if _SURROGATE.search(text):
        text = _SURROGATE_PAIR.sub(_join_pair, text)
        text, replaced = _SURROGATE.subn("\ufffd", text)
        removed += replaced
    return text, removed


def extract_pdf(
    data: bytes, max_text_chars: int | None = None, engine: str = DEFAULT_ENGINE
) -> Extraction:
    """Extract the text of every page of the PDF in ``data`` with ``engine``.

    ``engine`` is ``pdfium``, ``pypdf`` or ``auto`` (PDFium, then pypdf where PDFium raised
    ``encrypted``, ``malformed``, ``unsupported`` or ``empty_text``). The text is normalised
    (see ``sanitize_text``). Raises ItemError (terminal) with class ``not_pdf``,
    ``encrypted``, ``malformed``, ``unsupported``, ``empty_text`` or ``oversize_text``:
    whatever a reader raises is classified by its type, so an ``unexpected`` failure of this
    stage is a bug in this project (ADR 0078). Under ``auto`` a document both engines
    refuse fails with PDFium's class and both engines' messages.
    """
    extractor_id(engine)  # refuses an engine that is not one of extract.ENGINES
    if b"%PDF-" not in data[:_HEADER_WINDOW]:
        raise ItemError("not_pdf", f"no PDF header in the first {_HEADER_WINDOW} bytes")
    if engine == "pypdf":
        return _extraction(_pypdf_pages(data, max_text_chars), "pypdf")
    try:
        return _extraction(_pdfium_pages(data, max_text_chars), "pdfium")
    except ItemError as first:
        if engine == "pdfium" or first.error_class not in _FALLBACK_CLASSES:
            raise
        try:
            return _extraction(_pypdf_pages(data, max_text_chars), "pypdf")
        except ItemError as second:
            raise ItemError(
                first.error_class, f"pdfium: {first}; then pypdf ({second.error_class}): {second}"
            ) from second


class _Pages:
    """The pages an engine reads, normalised one by one and checked against the text limit.

    The limit is checked in the worker, page by page: a text layer too large for the task
    process never crosses into it, nor is read to its end (ADR 0087). It counts normalised
    characters, as they are stored, whichever engine read them.
    """

    def __init__(self, max_text_chars: int | None) -> None:
        self.texts: list[str] = []
        self.removed = 0
        self._chars = 0
        self._max = max_text_chars

    def add(self, raw: str, of: int) -> None:
        text, removed = sanitize_text(raw)
        text = text.strip()
        self.texts.append(text)
        self.removed += removed
        self._chars += len(text)
        if self._max is not None and self._chars > self._max:
            raise ItemError(
                "oversize_text",
                f"the text layer passed max_text_chars ({self._max}) by page "
                f"{len(self.texts)} of {of}",
            )


def _extraction(pages: _Pages, engine: str) -> Extraction:
    text = "\n\n".join(pages.texts).strip()
    if not text:
        raise ItemError("empty_text", f"no text on {len(pages.texts)} page(s) ({engine})")
    return Extraction(len(pages.texts), text, pages.removed, engine)


def _pdfium_pages(data: bytes, max_text_chars: int | None) -> _Pages:
    """Each page's text as PDFium reads it; an empty user password opens the document."""
    try:
        document = pypdfium2.PdfDocument(data)
    except pypdfium2.PdfiumError as exc:
        error_class = _PDFIUM_LOAD_ERRORS.get(exc.err_code, "malformed")
        raise ItemError(error_class, f"pdfium: {exc}") from exc
    try:
        pages = _Pages(max_text_chars)
        count = len(document)
        for number in range(count):
            try:
                page = document[number]
                textpage = page.get_textpage()
                text = textpage.get_text_bounded()
            except pypdfium2.PdfiumError as exc:
                raise ItemError("malformed", f"pdfium, page {number + 1}: {exc}") from exc
            textpage.close()
            page.close()
            pages.add(text, count)
        return pages
    finally:
        document.close()


def _pypdf_pages(data: bytes, max_text_chars: int | None) -> _Pages:
    """Each page's text as pypdf reads it, its failures classified by type."""
    try:
        return _page_texts(data, max_text_chars)
    except FileNotDecryptedError as exc:
        raise ItemError("encrypted", str(exc)) from exc
    except LimitReachedError as exc:
        # pypdf's own decompression and parsing budgets: the input is hostile or broken.
        raise ItemError("malformed", f"pypdf limit: {exc}") from exc
    except (DependencyError, DeprecationError, NotImplementedError) as exc:
        # The document may be valid, but this reader cannot read it: a decoder missing here
        # (jbig2dec, brotli), a construct pypdf has dropped (abbreviated filter names outside
        # inline images), or one it never implemented. Retrying the same reader cannot help;
        # a redrive after installing the decoder or upgrading the reader can.
        raise ItemError(
            "unsupported", f"{type(exc).__name__}: {exc} (pypdf {pypdf.__version__})"
        ) from exc
    except (PdfReadError, PyPdfError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ItemError("malformed", f"{type(exc).__name__}: {exc}") from exc


def _page_texts(data: bytes, max_text_chars: int | None = None) -> _Pages:
    # pypdf's object graph is full of reference cycles, so a reader outlives its last use
    # until the cyclic collector runs, which counts allocations, not bytes: a worker going
    # through large files would hold several of them at once. Closing the stream frees the
    # file's bytes now; for large files a collection frees the parsed objects too.
    with io.BytesIO(data) as stream:
        reader = pypdf.PdfReader(stream)
        # An empty user password (permissions only, as on many bank statements) opens it.
        if reader.is_encrypted and not reader.decrypt(""):
            raise ItemError("encrypted", "the document is encrypted with a user password")
        pages = _Pages(max_text_chars)
        for page in reader.pages:
            pages.add(page.extract_text() or "", len(reader.pages))
    del reader
    if len(data) >= _COLLECT_AFTER_BYTES:
        gc.collect()
    return pages


def _read_regular(path: str) -> bytes:
    """Return the bytes of the regular file ``path`` resolves to, read through one descriptor.

    The caller's checks (roots, size) looked at the path; what is read is the file opened
    once, without following a final symlink swapped in since and without blocking on a FIFO
    swapped in since, and checked by ``fstat`` (ADR 0074).
    """
    real = os.path.realpath(path)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise ItemError("missing_file", f"{path} no longer exists", ErrorKind.TERMINAL) from exc
    except OSError as exc:
        raise ItemError("unreadable", f"{path} cannot be opened: {exc.strerror}") from exc
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ItemError("unreadable", f"{path} is not a regular file")
        try:
            return handle.read()
        except OSError as exc:
            raise ItemError("unreadable", f"{path} cannot be read: {exc.strerror}") from exc


def extract_file(
    path: str,
    expected_sha256: str | None = None,
    max_text_chars: int | None = None,
    engine: str = DEFAULT_ENGINE,
) -> Extraction:
    """Read the file at ``path`` and extract it; a missing file is a terminal error.

    With ``expected_sha256`` (the document id discover recorded), a file rewritten since
    then is refused as ``changed_on_disk`` rather than stored under its old content hash;
    the next discover sees the new bytes as a new document. A file that cannot be opened,
    or is no regular file by the time it is opened, is ``unreadable`` (terminal).
    """
    data = _read_regular(path)
    if expected_sha256 is not None:
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected_sha256:
            raise ItemError(
                "changed_on_disk",
                f"{path} changed since it was discovered (sha256 {actual[:12]}, expected "
                f"{expected_sha256[:12]}); the next run picks up the new content",
            )
    return extract_pdf(data, max_text_chars, engine)
