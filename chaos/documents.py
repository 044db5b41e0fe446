"""The chaos corpora: small clean PDFs and a share of poison, each with the end it must reach.

Clean documents come from ``tests/corpus.py`` (:func:`corpus.small_pdf_bytes`: one page,
cheap to extract on two cores). Poison files are variants of the hostile files of the poison
corpus, each with distinct bytes (the same bytes would be one document), plus documents
whose text makes the local provider answer 400. Every poison file has the stage and error
class it must be dead-lettered with, so that a run can be checked against them exactly.
"""

from __future__ import annotations

import hashlib
import io
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import corpus

# The provider answers 400 to any input containing this (a fault set for every scenario).
PROVIDER_POISON_MARKER = "POISON-400"
# Poison kinds in the order they are handed out, so that a small corpus still gets a mix.
POISON_ORDER = (
    "truncated",
    "not_pdf",
    "provider_400",
    "encrypted",
    "zero_bytes",
    "memory_bomb",
    "slow",
    "oversize",
    "truncated",
    "provider_400",
    "not_pdf",
    "encrypted",
    "truncated",
    "provider_400",
    "provider_400",
)
# (stage, error class) each kind ends dead with.
EXPECTED = {
    "zero_bytes": ("extract", "not_pdf"),
    "not_pdf": ("extract", "not_pdf"),
    "truncated": ("extract", "malformed"),
    "encrypted": ("extract", "encrypted"),
    "oversize": ("extract", "oversize"),
    "slow": ("extract", "timeout"),
    "memory_bomb": ("extract", "memory"),
    "provider_400": ("embed", "http_400"),
    # Scenario (h) only: a text layer far over max_text_chars, and a document the harness
    # kills the task process on whenever a task works on it (as the kernel's OOM killer does).
    "huge_text": ("extract", "oversize_text"),
    "kills_task": ("extract", "killed"),
}
# The huge text layer: one shared content stream of HUGE_PAGE_CHARS characters, on every one
# of HUGE_PAGES pages: 300 MB of text in a file of about 160 KB.
HUGE_PAGES = 1000
HUGE_PAGE_CHARS = 300_000
# Run settings the poison files are made for: oversize exceeds max_bytes, slow exceeds the
# item timeout, the memory bomb exceeds memory_mb.
MAX_BYTES = 1_000_000
OVERSIZE_BYTES = 1_200_000


@dataclass(frozen=True)
class Poison:
    """One poison file and how it must end."""

    path: Path
    kind: str

    @property
    def stage(self) -> str:
        return EXPECTED[self.kind][0]

    @property
    def error_class(self) -> str:
        return EXPECTED[self.kind][1]


@dataclass(frozen=True)
class Corpus:
    """A folder of documents: clean ones and poison ones."""

    folder: Path
    clean: tuple[Path, ...]
    poison: tuple[Poison, ...]

    @property
    def documents(self) -> int:
        return len(self.clean) + len(self.poison)


def poison_count(documents: int, share: float = 0.05) -> int:
    """How many of ``documents`` are poison: ``share`` of them, at least one."""
    return max(1, round(documents * share))


def poison_bytes(kind: str, variant: int) -> bytes:
    """Bytes of poison ``kind``; each ``variant`` differs from every other file's bytes."""
    if kind == "zero_bytes":
        if variant:
            raise ValueError("there is only one empty file")
        return b""
    if kind == "not_pdf":
        return f"plain text {variant}, named .pdf: not a PDF at all\n".encode()
    if kind == "truncated":
        _, whole = corpus.small_pdf_bytes(100_000 + variant)
        return whole[: len(whole) // 2]
    if kind == "encrypted":
        return _encrypted(100_100 + variant)
    if kind == "oversize":
        return corpus.oversize_pdf_bytes(OVERSIZE_BYTES, text=f"Oversize document {variant}.")
    if kind == "slow":
        return corpus.slow_pdf_bytes(pages=40 + variant)
    if kind == "memory_bomb":
        return corpus.memory_bomb_pdf_bytes(pages=64 + variant)
    if kind == "provider_400":
        text = (
            f"This report carries {PROVIDER_POISON_MARKER} marker {variant}: the provider "
            "refuses every request that contains it."
        )
        return corpus.pdf_bytes([text], title=f"Refused report {variant}")
    raise ValueError(f"unknown poison kind {kind!r}")


def huge_text_pdf_bytes(
    *, pages: int = HUGE_PAGES, page_chars: int = HUGE_PAGE_CHARS, line: int = 300
) -> bytes:
    """A small PDF whose text layer is ``pages * page_chars`` characters (300 MB by default).

    Every page shows the same content stream: ``page_chars // line`` lines of ``line``
    characters of plain prose, which deflate to almost nothing, in a half-point font so that
    every line lies on the page (PDFium reads only what does) and no two lines overlap
    (PDFium drops a repeated string drawn over itself). Both engines extract it as
    ordinary text: no decompression or parsing budget is touched, so only a limit on the
    text itself stops it.
    """
    prose = b"Replayable keeps its promise on every path, whatever the size. "
    words = (prose * (line // len(prose) + 1))[:line]
    show = b"".join(b"(" + words + b") Tj T* " for _ in range(page_chars // line))
    first_page = 4
    resources = b"<< /Font << /F1 %d 0 R >> >>" % (first_page + pages)
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        corpus._pages_objects(pages, first_page),
        corpus._stream(b"", b"BT /F1 0.5 Tf 0.75 TL 10 770 Td " + show + b"ET\n"),
    ]
    objects += [corpus._page(3, resources) for _ in range(pages)]
    objects.append(corpus._helvetica())
    return corpus._assemble(objects)


def killer_pdf_bytes(after: Iterable[str], *, pages: int = 60, draws: int = 2_000) -> bytes:
    """A small PDF that holds PDFium for about half a second, whose id sorts after ``after``.

    Scenario (h) kills the task process whenever a task holds this document; the longer the
    extraction, the surer the harness sees it held. Every page paints a form XObject showing
    one word ``draws`` times: PDFium builds a text object for every paint (about 4 µs each,
    60 times 2,000 of them: 0.45 s on an idle two-core machine, under 60 MB), and all paints land
    on one spot, so the text stays one word per page. Plan numbers a run's batches in doc_id
    order, so an id above every other one (and above any id of the form ``fff…``, which
    covers the stat-named ids of oversize files but for a chance of 1 in 4,096) puts the
    document last, in a batch of its own when the others fill whole batches.
    """
    highest = max(after, default="")
    first_page = 6
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        corpus._pages_objects(pages, first_page),
        corpus._stream(b"", b"/Fm Do\n" * draws),
        corpus._stream(
            b"/Type /XObject /Subtype /Form /BBox [0 0 612 792]"
            b" /Resources << /Font << /F1 5 0 R >> >>",
            b"BT /F1 1 Tf 0 0 Td (killer) Tj ET\n",
        ),
        corpus._helvetica(),
    ]
    objects += [corpus._page(3, b"<< /XObject << /Fm 4 0 R >> >>") for _ in range(pages)]
    # The variants differ only in a fixed-width comment, so the bytes around it are hashed once.
    mark = b"% variant 00000000\n"
    head, tail = corpus._assemble(objects, filler=mark).split(mark)
    hashed_head = hashlib.sha256(head)
    for variant in itertools.count():
        filler = b"%% variant %08d\n" % variant
        digest = hashed_head.copy()
        digest.update(filler + tail)
        hexdigest = digest.hexdigest()
        if hexdigest.startswith("fff") and hexdigest > highest:
            return head + filler + tail
    raise AssertionError("unreachable")


def write_special(folder: Path, kind: str, *, after: Iterable[str] = ()) -> Poison:
    """Write scenario (h)'s document of ``kind`` (huge_text or kills_task) into ``folder``."""
    data = huge_text_pdf_bytes() if kind == "huge_text" else killer_pdf_bytes(after)
    path = folder / f"poison-{kind}.pdf"
    path.write_bytes(data)
    return Poison(path, kind)


def _encrypted(index: int) -> bytes:
    from pypdf import PdfReader, PdfWriter

    _, plain = corpus.small_pdf_bytes(index)
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(plain)))
    # RC4 is built into pypdf; AES would need the optional cryptography package.
    writer.encrypt(user_password="s3cret", owner_password="owner", algorithm="RC4-128")  # noqa: S106
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def write_pool(folder: Path, documents: int, *, share: float = 0.05, first: int = 1) -> Corpus:
    """Write ``documents`` files into ``folder``: ``share`` poison among clean ones.

    The clean ones are small documents ``first``, ``first + 1``, …: pools written with the
    same ``first`` hold the same documents, with ``first`` apart by their size, none.
    """
    poisoned = poison_count(documents, share)
    clean = corpus.write_small_corpus(folder, documents - poisoned, first=first)
    return Corpus(folder, tuple(clean), write_poison(folder, poisoned))


def write_poison(folder: Path, count: int) -> tuple[Poison, ...]:
    """Write ``count`` poison files into ``folder``, kinds handed out in POISON_ORDER."""
    seen: dict[str, int] = {}
    poison = []
    for n in range(count):
        kind = POISON_ORDER[n % len(POISON_ORDER)]
        if kind == "zero_bytes" and seen.get(kind):
            kind = "not_pdf"
        variant = seen.get(kind, 0)
        seen[kind] = variant + 1
        path = folder / f"poison-{n:03d}-{kind}.pdf"
        path.write_bytes(poison_bytes(kind, variant))
        poison.append(Poison(path, kind))
    return tuple(poison)


def overlapping(folder: Path, documents: int, *, share: float = 0.05) -> tuple[Corpus, Corpus]:
    """Two corpora of ``documents`` files each that share half their clean files and all poison.

    The files live once in ``folder/pool``; each corpus is a folder of hard links to them, so
    a shared file is the same document (the same bytes) in both.
    """
    poisoned = poison_count(documents, share)
    per_run = documents - poisoned
    shared = per_run // 2
    pool = folder / "pool"
    clean = corpus.write_small_corpus(pool, 2 * per_run - shared)
    poison = write_poison(pool, poisoned)
    first = _linked(folder / "first", clean[:per_run], poison)
    second = _linked(folder / "second", clean[per_run - shared :], poison)
    return first, second


def _linked(folder: Path, clean: Sequence[Path], poison: Iterable[Poison]) -> Corpus:
    folder.mkdir(parents=True, exist_ok=True)
    links = []
    for path in clean:
        (folder / path.name).hardlink_to(path)
        links.append(folder / path.name)
    poisons = []
    for item in poison:
        (folder / item.path.name).hardlink_to(item.path)
        poisons.append(Poison(folder / item.path.name, item.kind))
    return Corpus(folder, tuple(links), tuple(poisons))
