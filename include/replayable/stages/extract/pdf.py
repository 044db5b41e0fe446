"""Extract text from a PDF with pypdf: the extract stage's work.

Runs inside a guarded worker process (see ``replayable.guards``): it is the stage that
parses untrusted bytes, so a stall or a blow-up here must cost one item, not the batch.
The stage's code version is ``replayable.stages.extract.VERSION``.
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
from pypdf.errors import (
    DependencyError,
    DeprecationError,
    FileNotDecryptedError,
    LimitReachedError,
    PdfReadError,
    PyPdfError,
)

from replayable.retry import ErrorKind, ItemError

# Inputs at least this large are followed by a garbage collection (see _page_texts).
_COLLECT_AFTER_BYTES = 4 * 2**20

# PDF 1.7 §7.5.2: the header may follow up to 1024 bytes of junk.
_HEADER_WINDOW = 1024

# pypdf 7.1 decodes /ToUnicode maps and UTF-16 strings with errors="surrogatepass": a map
# that names a surrogate leaves it in the text, and no UTF-8 encoder accepts one.
_SURROGATE_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class Extraction:
    """Text and page count of one document.

    ``removed_chars`` counts the characters of pypdf's text that Postgres could not
    store and that were dropped or replaced (see ``sanitize_text``).
    """

    page_count: int
    text: str
    removed_chars: int = 0


def _join_pair(match: re.Match[str]) -> str:
    """Return the one character that a UTF-16 surrogate pair stands for."""
    return match.group().encode("utf-16-be", "surrogatepass").decode("utf-16-be")


def sanitize_text(text: str) -> tuple[str, int]:
    """Return ``text`` as Postgres ``text`` stores it, and how many characters were changed.

    A UTF-8 Postgres database refuses NUL, and no driver can encode a lone UTF-16
    surrogate; every other Python character is stored as it is. So NUL characters are
    dropped (pdfTeX's T1-encoded bitmap fonts put one wherever a grave accent has no
    precomposed glyph), a surrogate pair is joined into its character, and a lone
    surrogate becomes U+FFFD. The count covers the dropped and replaced characters.
    """
    removed = text.count("\x00")
    if removed:
        text = text.replace("\x00", "")
    if _SURROGATE.search(text):
        text = _SURROGATE_PAIR.sub(_join_pair, text)
        text, replaced = _SURROGATE.subn("\ufffd", text)
        removed += replaced
    return text, removed


def extract_pdf(data: bytes, max_text_chars: int | None = None) -> Extraction:
    """Extract the text of every page of the PDF in ``data``.

    The text is sanitised for Postgres (see ``sanitize_text``). Raises ItemError
    (terminal) with class ``not_pdf``, ``encrypted``, ``malformed``, ``unsupported`` or
    ``empty_text``: whatever the reader raises is classified by its type, so an
    ``unexpected`` failure of this stage is a bug in this project (ADR 0078).
    """
    if b"%PDF-" not in data[:_HEADER_WINDOW]:
        raise ItemError("not_pdf", f"no PDF header in the first {_HEADER_WINDOW} bytes")
    try:
        pages = _page_texts(data, max_text_chars)
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
    removed = 0
    for number, page in enumerate(pages):
        pages[number], changed = sanitize_text(page)
        removed += changed
    text = "\n\n".join(page.strip() for page in pages).strip()
    if not text:
        raise ItemError("empty_text", f"no text on {len(pages)} page(s)")
    return Extraction(page_count=len(pages), text=text, removed_chars=removed)


def _page_texts(data: bytes, max_text_chars: int | None = None) -> list[str]:
    # pypdf's object graph is full of reference cycles, so a reader outlives its last use
    # until the cyclic collector runs, which counts allocations, not bytes: a worker going
    # through large files would hold several of them at once. Closing the stream frees the
    # file's bytes now; for large files a collection frees the parsed objects too.
    with io.BytesIO(data) as stream:
        reader = pypdf.PdfReader(stream)
        if reader.is_encrypted:
            raise ItemError("encrypted", "the document is encrypted")
        pages = []
        total = 0
        for page in reader.pages:
            pages.append(page.extract_text() or "")
            total += len(pages[-1])
            # Checked page by page in the worker: a text layer too large for the task
            # process never crosses into it, nor is read to its end (ADR 0087).
            if max_text_chars is not None and total > max_text_chars:
                raise ItemError(
                    "oversize_text",
                    f"the text layer passed max_text_chars ({max_text_chars}) by page "
                    f"{len(pages)} of {len(reader.pages)}",
                )
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
    path: str, expected_sha256: str | None = None, max_text_chars: int | None = None
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
    return extract_pdf(data, max_text_chars)
