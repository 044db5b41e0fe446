"""Extraction engines (B13): PDFium against pypdf on PDFs from real producers, speed and words.

The real-world corpus (``tests/realworld.py``: LibreOffice, Ghostscript, groff, pdfTeX and
PDFs that Debian packages ship) is built into a temporary folder, read into memory, and
extracted with ``extract_pdf`` by each engine:

- baseline: ``engine="pypdf"``, every document one after the other, in this process;
- measured: ``engine="pdfium"``, the same.

The figure is CPU time (``time.process_time()``) of a whole pass over the corpus; a document
an engine refuses (``ItemError``) counts its time too. One untimed pass per engine comes
first (imports, PDFium's initialisation) and gives the texts; each of the ``repeats`` timed
passes runs both engines, alternating which goes first, so that a burst of other work on
the shared machine lands on both, and must give the same texts again. pypdf's warnings about
the oddities of real files are silenced while it runs.

Quality (info, no target): for every document, the Dice similarity of the two texts' word
multisets, ``2·|A∩B| / (|A|+|B|)`` over ``text.split()``. Each document below
``SIMILAR`` is listed with a reason found automatically: an engine refused it; or the
non-whitespace characters agree to ``SAME_CHARACTERS`` or more (the same Dice over
characters), so only the word breaks differ; or the characters differ, with the words most
over-represented on each side as evidence. A document both engines refuse has nothing to
compare and is counted apart. When no producer is installed the bundled samples
(``data/samples``) stand in for the corpus, and the notes say so; ``samples=N`` uses the
first N of them outright (the smoke size).
"""

from __future__ import annotations

import gc
import logging
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import BenchError, Row, Samples, Target, tests_module

from replayable.retry import ItemError
from replayable.stages.extract.pdf import extract_pdf

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "data" / "samples"
ENGINES = ("pypdf", "pdfium")
REPEATS = 5
SIMILAR = 0.90
SAME_CHARACTERS = 0.97
EVIDENCE_WORDS = 3
TARGET = Target("≤ 0.2", at_most=0.2)


@dataclass(frozen=True)
class Document:
    """One PDF of the corpus, in memory, with who made it."""

    file: str
    producer: str
    pdf_producer: str
    data: bytes


@dataclass(frozen=True)
class Outcome:
    """What one engine made of one document: its text, or the class it refused it with."""

    text: str | None
    error_class: str | None = None


def _bundled(count: int | None) -> list[Document]:
    paths = sorted(SAMPLES.glob("*.pdf"))[:count]
    if not paths:
        raise BenchError(f"no bundled samples under {SAMPLES}")
    return [Document(p.name, "bundled", "fpdf2", p.read_bytes()) for p in paths]


def _corpus(tmp: Path, samples: int | None) -> tuple[list[Document], str, bool, list[str]]:
    """The documents, a line saying what they are, whether the bundled samples stand in for
    the real-world corpus, and notes on how that was built."""
    if samples is not None:
        docs = _bundled(samples)
        return docs, f"{len(docs)} bundled samples (data/samples)", False, []
    realworld = tests_module("realworld")
    manifest = realworld.build(tmp / "corpus")
    notes = [
        f"producer {p.name}: {p.status}, {p.files} file(s)" + (f" ({p.detail})" if p.detail else "")
        for p in manifest.producers
    ]
    if not manifest.files:
        docs = _bundled(None)
        return (
            docs,
            f"{len(docs)} bundled samples (data/samples): FALLBACK, no real-world producer "
            "wrote a file on this machine (tests/install-realworld-tools.sh installs them)",
            True,
            notes,
        )
    docs = [
        Document(e.file, e.producer, e.pdf_producer, (manifest.folder / e.file).read_bytes())
        for e in manifest.files
    ]
    producers = ", ".join(manifest.contributors)
    return docs, f"{len(docs)} real-world PDFs from {producers}", False, notes


@contextmanager
def _quiet_pypdf() -> Iterator[None]:
    """Silence pypdf's warnings about real files' oddities for the duration of the run."""
    logger = logging.getLogger("pypdf")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _extract(data: bytes, engine: str) -> Outcome:
    try:
        return Outcome(extract_pdf(data, engine=engine).text)
    except ItemError as exc:
        return Outcome(None, exc.error_class)


def _pass(docs: list[Document], engine: str) -> tuple[float, list[Outcome]]:
    """CPU seconds of this process for one engine over every document, and the outcomes."""
    gc.collect()  # what the previous pass left behind is not this one's to collect
    started = time.process_time()
    outcomes = [_extract(doc.data, engine) for doc in docs]
    return time.process_time() - started, outcomes


def dice(a: Counter[str], b: Counter[str]) -> float:
    """2·|A∩B| / (|A|+|B|) over multisets; two empty ones agree."""
    total = a.total() + b.total()
    return 1.0 if total == 0 else 2 * (a & b).total() / total


def _characters(text: str) -> Counter[str]:
    return Counter(ch for ch in text if not ch.isspace())


def _compare(doc: Document, pdfium: Outcome, pypdf: Outcome) -> dict[str, Any]:
    """One document's comparison; ``reason`` is set when its similarity is below SIMILAR."""
    words = {
        name: Counter(out.text.split()) if out.text is not None else Counter[str]()
        for name, out in (("pdfium", pdfium), ("pypdf", pypdf))
    }
    row: dict[str, Any] = {
        "file": doc.file,
        "producer": doc.producer,
        "pdf_producer": doc.pdf_producer,
        "pdfium_words": words["pdfium"].total(),
        "pypdf_words": words["pypdf"].total(),
        "pdfium_error": pdfium.error_class,
        "pypdf_error": pypdf.error_class,
    }
    if pdfium.text is None and pypdf.text is None:
        row["similarity"] = None  # both refused: nothing to compare
        return row
    similarity = dice(words["pdfium"], words["pypdf"])
    row["similarity"] = round(similarity, 4)
    if similarity >= SIMILAR:
        return row
    refused = [f"{n} refused: {o.error_class}" for n, o in (("pdfium", pdfium), ("pypdf", pypdf))]
    if pdfium.text is None:
        row["reason"] = refused[0]
    elif pypdf.text is None:
        row["reason"] = refused[1]
    else:
        characters = dice(_characters(pdfium.text), _characters(pypdf.text))
        row["character_similarity"] = round(characters, 4)
        row["pdfium_over"] = (words["pdfium"] - words["pypdf"]).most_common(EVIDENCE_WORDS)
        row["pypdf_over"] = (words["pypdf"] - words["pdfium"]).most_common(EVIDENCE_WORDS)
        if characters >= SAME_CHARACTERS:
            row["reason"] = "same characters, different word breaks"
        else:
            row["reason"] = (
                f"different characters ({characters:.2f}): pdfium has more of "
                f"{_evidence(row['pdfium_over'])}; pypdf has more of {_evidence(row['pypdf_over'])}"
            )
    return row


def _evidence(words: list[tuple[str, int]]) -> str:
    return ", ".join(f"{w!r} ({n})" for w, n in words) or "nothing"


def _listing(row: dict[str, Any]) -> str:
    return (
        f"{row['file']} ({row['producer']}"
        + (f", {row['pdf_producer']}" if row["pdf_producer"] else "")
        + f"): pdfium {row['pdfium_words']} words, pypdf {row['pypdf_words']}, "
        f"similarity {row['similarity']:.3f}: {row['reason']}"
    )


def run(repeats: int = REPEATS, samples: int | None = None) -> tuple[list[Row], dict[str, Any]]:
    """Time both engines over the real-world corpus (or ``samples`` bundled PDFs) and compare."""
    if repeats < 1 or (samples is not None and samples < 1):
        raise ValueError(f"repeats and samples must be positive, not {repeats}, {samples}")
    with tempfile.TemporaryDirectory(prefix="replayable-bench-engines-") as tmp:
        docs, corpus, fallback, build_notes = _corpus(Path(tmp), samples)
    cpu: dict[str, list[float]] = {engine: [] for engine in ENGINES}
    with _quiet_pypdf():
        first = {engine: _pass(docs, engine)[1] for engine in ENGINES}
        for repeat in range(repeats):
            for engine in ENGINES if repeat % 2 == 0 else ENGINES[::-1]:
                seconds, outcomes = _pass(docs, engine)
                if outcomes != first[engine]:
                    raise BenchError(f"{engine} extracted different text in repeat {repeat + 1}")
                cpu[engine].append(seconds)

    compared = [
        _compare(doc, pdfium, pypdf)
        for doc, pdfium, pypdf in zip(docs, first["pdfium"], first["pypdf"], strict=True)
    ]
    below = [row for row in compared if "reason" in row]
    both_refused = [row for row in compared if row["similarity"] is None]
    read = {engine: sum(out.text is not None for out in first[engine]) for engine in ENGINES}
    scored = [row["similarity"] for row in compared if row["similarity"] is not None]

    rows = [
        Row(
            "B13",
            f"extraction CPU, PDFium / pypdf, {corpus}",
            "pypdf, whole corpus",
            Samples(tuple(cpu["pypdf"])),
            "pdfium, whole corpus",
            Samples(tuple(cpu["pdfium"])),
            TARGET,
            notes=[f"corpus: {corpus}"],
        ),
    ]
    details: dict[str, Any] = {
        "corpus": corpus,
        "fallback_to_samples": fallback,
        "documents": len(docs),
        "bytes": sum(len(doc.data) for doc in docs),
        "repeats": repeats,
        "read_by": read,
        "read_by_both": sum(
            a.text is not None and b.text is not None
            for a, b in zip(first["pdfium"], first["pypdf"], strict=True)
        ),
        "refused_by_both": [row["file"] for row in both_refused],
        "similar_at_least": SIMILAR,
        "same_characters_at_least": SAME_CHARACTERS,
        "below_similar": below,
        "per_document": compared,
        "cpu_s": {engine: cpu[engine] for engine in ENGINES},
        "notes": [
            f"corpus: {corpus}",
            *build_notes,
            f"{len(docs)} documents compared; pdfium read {read['pdfium']}, pypdf read "
            f"{read['pypdf']}; refused by both: "
            + (", ".join(f"{r['file']} ({r['pdfium_error']})" for r in both_refused) or "none"),
            f"word-multiset similarity (Dice) over the {len(scored)} documents either engine "
            f"read: min {min(scored, default=1.0):.3f}, {len(below)} below {SIMILAR:.2f}",
            *(f"  below {SIMILAR:.2f}: {_listing(row)}" for row in below),
        ],
    }
    return rows, details
