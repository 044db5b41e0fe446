"""Extract text from a PDF with pypdf.

Runs inside a guarded worker process (see ``replayable.guards``): it is the stage that
parses untrusted bytes, so a stall or a blow-up here must cost one item, not the batch.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import pypdf
from pypdf.errors import FileNotDecryptedError, LimitReachedError, PdfReadError, PyPdfError

from replayable.retry import ErrorKind, ItemError

VERSION = "1.0"

# PDF 1.7 §7.5.2: the header may follow up to 1024 bytes of junk.
_HEADER_WINDOW = 1024


@dataclass(frozen=True)
class Extraction:
    """Text and page count of one document."""

    page_count: int
    text: str


def extract_pdf(data: bytes) -> Extraction:
    """Extract the text of every page of the PDF in ``data``.

    Raises ItemError (terminal) with class ``not_pdf``, ``encrypted``, ``malformed`` or
    ``empty_text``.
    """
    if b"%PDF-" not in data[:_HEADER_WINDOW]:
        raise ItemError("not_pdf", f"no PDF header in the first {_HEADER_WINDOW} bytes")
    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise ItemError("encrypted", "the document is encrypted")
        pages = [page.extract_text() or "" for page in reader.pages]
    except FileNotDecryptedError as exc:
        raise ItemError("encrypted", str(exc)) from exc
    except LimitReachedError as exc:
        # pypdf's own decompression and parsing budgets: the input is hostile or broken.
        raise ItemError("malformed", f"pypdf limit: {exc}") from exc
    except (PdfReadError, PyPdfError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ItemError("malformed", f"{type(exc).__name__}: {exc}") from exc
    text = "\n\n".join(page.strip() for page in pages).strip()
    if not text:
        raise ItemError("empty_text", f"no text on {len(pages)} page(s)")
    return Extraction(page_count=len(pages), text=text)


def extract_file(path: str) -> Extraction:
    """Read the file at ``path`` and extract it; a missing file is a terminal error."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError as exc:
        raise ItemError("missing_file", f"{path} no longer exists", ErrorKind.TERMINAL) from exc
    return extract_pdf(data)
