"""Retrieval on text nobody here wrote (B16): the bundled model against feature hashing.

The labelled set is made automatically from the PDFs that Debian packages ship under
/usr/share (TeX Live's manuals and a few others, which ``tests/install-realworld-tools.sh``
installs; they are found as ``tests/realworld.py`` finds them): each section heading of a
document's outline (its bookmarks) is a query, and the document that holds it is the answer.
A heading is kept when, once its section number is dropped, it has at least two words of
letters, not all of them generic (``GENERIC_WORDS``: "Introduction", "Table of contents",
"Legal notice"), and no other document has it. At most ``PER_DOCUMENT`` are kept per
document, spread over its outline, so that one long manual does not make most of the queries.

Each document is read with the pipeline's own extractor (``extract_pdf``, PDFium, the default
engine) and split by its own chunker at the pipeline's default size and overlap, so the figure
judges the pipeline's choices too. Before chunking, every query's heading is removed from every
document's text (case-insensitive, across line breaks, wherever it stands: title, table of
contents, running head). No chunk holds a query verbatim, so a document can only be found from
what its sections say: a test of meaning, not of string matching.

Every chunk and query is embedded by the local model server's own code, in process
(``devtools.model_server.vectors.embeddings_response``, what ``POST /v1/embeddings``
answers): ``local-wordllama-256``, the bundled real model, and feature hashing, the server's
vectors for any other model name (here the pipeline's default, ``text-embedding-3-small``),
both at 256 dimensions. Chunks are ranked by cosine similarity, exactly. recall@5 is the share
of queries whose document owns at least one of the 5 best chunks (a tie counts against it).
The figure is the bundled model's recall@5 over hashing's. Random ranking's expected recall@5
(from each document's share of the chunks) is given for contrast, and hashing at the server's
default 64 dimensions in the notes.

``documents=N`` (the smoke size) keeps N documents that have queries and no others. When no
PDF is shipped, the bundled samples (``data/samples``, fpdf2, no outline) stand in at that size
only, their numbered headings found in the text, and the notes say so. At full size, no
shipped PDF, or fewer than ``MIN_QUERIES`` queries, is a :class:`BenchError`.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pypdfium2
from harness import BenchError, Row, Samples, Target, tests_module

from devtools.model_server import vectors, wordllama_model
from replayable import db
from replayable.retry import ItemError
from replayable.settings import DEFAULT_MODEL, PipelineSettings
from replayable.stages.chunk.chunker import chunk_config_of, chunk_text
from replayable.stages.extract.pdf import extract_pdf

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "data" / "samples"
# (label, model name the server is asked for): the bundled model, then feature hashing.
MODELS = (("wordllama", wordllama_model.MODEL), ("hashing", DEFAULT_MODEL))
DIM = wordllama_model.DIM
SERVER_DEFAULT_DIM = vectors.DEFAULT_DIM
TOP = 5
UNIT = f"recall@{TOP}"
MIN_QUERIES = 100
PER_DOCUMENT = 25
# Bounds on what is read, for a machine with many more PDFs than a stock Debian: a full run
# over the 50-odd that texlive ships takes well under a minute.
MAX_DOCUMENTS = 200
MAX_BYTES = 20 * 2**20
MAX_PAGES = 500
EMBED_BATCH = 256
# The pipeline's default chunk size and overlap.
CHUNKING = chunk_config_of(PipelineSettings())
EXAMPLES = 8
# Measured 1.4 to 1.5 over the Debian PDFs (see bench/README.md); hashing against itself is 1.
TARGET = Target("≥ 1.2", at_least=1.2)
# The default search mode's recall@5 on the Debian PDFs (issue 37; ADR 0143).
HYBRID_TARGET = Target("≥ 0.75", at_least=0.75)

# A heading made only of these words says nothing about its document.
GENERIC_WORDS = frozenset(
    (
        *("a", "about", "also", "an", "and", "appendix", "bibliography", "bugs", "change"),
        *("changes", "conclusion", "conclusions", "contents", "document", "documentation"),
        *("example", "examples", "for", "further", "getting", "guide", "history", "in"),
        *("implementation", "index", "installation", "introduction", "known", "legal"),
        *("licence", "license", "log", "manual", "notes", "notice", "of", "on", "options"),
        *("overview", "preface", "quick", "reading", "references", "release", "see"),
        *("started", "summary", "table", "the", "this", "to", "usage", "version"),
        *("acknowledgements", "acknowledgments"),
    )
)
# A section number: "2.1", "3.", "B", "A.2", "Appendix B.".
_NUMBERING = re.compile(r"^\s*(?:Appendix\s+)?(?:[A-Z]|\d+)(?:\.\d+)*\.?\s+")
# Typographic quotes as escapes: U+2018, U+2019, U+201C, U+201D.
_WORD = re.compile(r"[^\W\d_]{2,}(?:[-'\u2019][^\W\d_]+)*")
_EDGES = "\"'\u2018\u2019\u201c\u201d()[]{},.;:!?"
# A numbered heading line of the bundled samples, which have no outline.
_SAMPLE_HEADING = re.compile(r"(?m)^\d+\.\s+(\S.*)$")
# Letters on neither side: a heading inside a longer word ("LaTeX support") is not it. \w
# takes superscript and subscript digits for letters; a footnote mark ends a word here.
_LETTER = r"[^\W\d_\u00b2\u00b3\u00b9\u2070-\u2079\u2080-\u2089]"
_BEFORE, _AFTER = f"(?<!{_LETTER})", f"(?!{_LETTER})"


@dataclass(frozen=True)
class Document:
    """One PDF as the pipeline reads it, and the headings of its outline."""

    name: str
    text: str
    pages: int
    headings: tuple[str, ...]


@dataclass(frozen=True)
class Query:
    """A heading, without its section number, and the document that holds it."""

    text: str
    document: str


def query_text(heading: str) -> str | None:
    """The query a heading makes, or None when it is too short or too generic to be one."""
    text = " ".join(_NUMBERING.sub("", heading).split())
    words = [word.strip(_EDGES).casefold() for word in text.split()]
    letters = [word for word in words if _WORD.fullmatch(word)]
    if len(letters) < 2 or set(letters) <= GENERIC_WORDS:
        return None
    return text


def _spread(items: Sequence[Any], count: int) -> list[Any]:
    return list(tests_module("realworld").spread(items, count))


# --- the documents --------------------------------------------------------------------


def _shipped() -> list[tuple[str, bytes]]:
    """The PDFs under the shipped roots, one per content, named by their path there."""
    realworld = tests_module("realworld")
    roots: Sequence[Path] = realworld.SHIPPED_ROOTS
    found: dict[str, tuple[str, bytes]] = {}
    # tests/realworld.py's own search, so that B13 and B16 read the same files.
    for path in realworld._shipped_pdfs(roots, MAX_BYTES):
        data = path.read_bytes()
        root = next(r for r in roots if path.is_relative_to(r))
        found.setdefault(hashlib.sha256(data).hexdigest(), (str(path.relative_to(root)), data))
    return _spread(sorted(found.values()), MAX_DOCUMENTS)


def _outline(data: bytes) -> tuple[int, tuple[str, ...]]:
    """The page count and the outline's titles, in order; none when PDFium cannot read it."""
    try:
        pdf = pypdfium2.PdfDocument(data)
    except pypdfium2.PdfiumError:
        return 0, ()
    try:
        return len(pdf), tuple(mark.get_title() for mark in pdf.get_toc())
    finally:
        pdf.close()


def _read(files: Sequence[tuple[str, bytes]], outline: bool) -> tuple[list[Document], list[str]]:
    """Each file extracted as the extract stage does it; and notes on those left out."""
    documents, left_out = [], []
    for name, data in files:
        pages, headings = _outline(data)
        if pages > MAX_PAGES:
            left_out.append(f"{name}: {pages} pages, over {MAX_PAGES}")
            continue
        try:
            text = extract_pdf(data).text
        except ItemError as error:
            left_out.append(f"{name}: the extractor refused it ({error.error_class})")
            continue
        if not outline:
            headings = tuple(_SAMPLE_HEADING.findall(text))
        documents.append(Document(name, text, pages, headings))
    return documents, left_out


def _corpus(documents: int | None) -> tuple[list[Document], str, bool, list[str]]:
    """The documents, what they are, whether the bundled samples stand in, and notes on the
    files left out."""
    files = _shipped()
    if files:
        read, left_out = _read(files, outline=True)
        return read, "PDFs that Debian packages ship under /usr/share", False, left_out
    if documents is None:
        raise BenchError(
            "no PDF under /usr/share: B16 needs text this project did not write; "
            "tests/install-realworld-tools.sh installs the packages that ship it"
        )
    samples = [(p.name, p.read_bytes()) for p in sorted(SAMPLES.glob("*.pdf"))]
    read, left_out = _read(samples, outline=False)
    source = (
        "bundled samples (data/samples): FALLBACK, no PDF under /usr/share "
        "(tests/install-realworld-tools.sh installs the packages that ship them)"
    )
    return read, source, True, left_out


def _queries(documents: Sequence[Document], per_document: int) -> list[Query]:
    """Each document's usable headings that no other document has, at most ``per_document``."""
    owners: dict[str, set[str]] = {}
    usable: dict[str, dict[str, str]] = {}
    for doc in documents:
        for heading in doc.headings:
            text = query_text(heading)
            if text is not None:
                owners.setdefault(text.casefold(), set()).add(doc.name)
                usable.setdefault(doc.name, {}).setdefault(text.casefold(), text)
    queries = []
    for doc in documents:
        own = [text for key, text in usable.get(doc.name, {}).items() if len(owners[key]) == 1]
        queries += [Query(text, doc.name) for text in _spread(own, per_document)]
    return queries


def _heading_pattern(queries: Sequence[Query]) -> re.Pattern[str]:
    """Every query, whatever its case and whichever spaces or line breaks part its words."""
    texts = sorted({q.text for q in queries}, key=len, reverse=True)  # the longest first
    body = "|".join(r"\s+".join(map(re.escape, text.split())) for text in texts)
    return re.compile(f"{_BEFORE}(?:{body}){_AFTER}", re.IGNORECASE)


def _normal(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


# --- embedding and ranking ------------------------------------------------------------

Matrix = npt.NDArray[np.float32]


def _embed(model: str, texts: Sequence[str], dim: int = DIM) -> Matrix:
    """The server's unit vectors of ``texts``, from the code behind ``POST /v1/embeddings``."""
    rows: list[list[float]] = []
    for start in range(0, len(texts), EMBED_BATCH):
        batch = list(texts[start : start + EMBED_BATCH])
        request = vectors.EmbeddingsRequest(model, batch, dim, "float")
        rows += [item["embedding"] for item in vectors.embeddings_response(request)["data"]]
    return np.asarray(rows, dtype=np.float32)


def _ranks(
    queries: Matrix, chunks: Matrix, owners: npt.NDArray[np.str_], labels: npt.NDArray[np.str_]
) -> npt.NDArray[np.int64]:
    """Where each query's document first appears in its ranking (1 = the best chunk is its
    own); another document's chunk that scores the same comes first."""
    scores = queries @ chunks.T
    own = owners[None, :] == labels[:, None]
    best = np.where(own, scores, -np.inf).max(axis=1)
    others = np.where(own, -np.inf, scores)
    outranked: npt.NDArray[np.int64] = (others >= best[:, None]).sum(axis=1)
    return 1 + outranked


def _chance(chunks_of: Counter[str], labels: Sequence[str]) -> float:
    """Expected recall@TOP of a random ranking: each query's document's share of the chunks."""
    total = chunks_of.total()
    return sum(
        1 - math.comb(total - chunks_of[label], TOP) / math.comb(total, TOP) for label in labels
    ) / len(labels)


def _recall(ranks: npt.NDArray[np.int64]) -> float:
    return float((ranks <= TOP).mean())


# --- the benchmark --------------------------------------------------------------------


@dataclass(frozen=True)
class Index:
    """Every document's chunks, with the queries' headings taken out of its text first."""

    chunks: list[str]
    owners: list[str]
    removed: int
    # Queries still found in a chunk once both are NFKC-normalised (a ligature, say).
    verbatim: list[str]


def _index(docs: Sequence[Document], queries: Sequence[Query]) -> Index:
    headings = _heading_pattern(queries)
    chunks: list[str] = []
    owners: list[str] = []
    removed = 0
    for doc in docs:
        text, found = headings.subn(" ", doc.text)
        removed += found
        pieces = chunk_text(text, CHUNKING)
        chunks += [piece.text for piece in pieces]
        owners += [doc.name] * len(pieces)
    left = {_normal(m.group()) for m in headings.finditer(_normal("\n".join(chunks)))}
    verbatim = sorted({q.text for q in queries if _normal(q.text) in left})
    return Index(chunks, owners, removed, verbatim)


def _text_and_hybrid(
    index: Index, queries: Sequence[Query], vector_scores: Matrix
) -> dict[str, npt.NDArray[np.int64]]:
    """Where each query's document first appears by the product's own full-text search
    (:func:`replayable.search.text_hits`, on a real Postgres holding the chunks as a run
    leaves them) and by its fusion with the bundled model's ranking
    (:func:`replayable.search.fuse`, as ``--mode hybrid`` fuses them); past the fusion's
    candidates a document counts as not found."""
    from harness import services

    from replayable.search import Hit, Scope, fuse, text_hits
    from replayable.search.index import ensure_text_index
    from replayable.search.text import fusion_pool

    scope = Scope(wordllama_model.MODEL, "bench", "bench", "bench")
    pool = fusion_pool(TOP)
    ranks: dict[str, list[int]] = {"text": [], "hybrid": []}
    with services() as svc:
        _load_chunks(svc.dsn, index)
        builder = db.Database(svc.dsn, autocommit=True)
        try:
            ensure_text_index(builder)
        finally:
            builder.close()
        conn = db.connect(svc.dsn)
        try:
            for i, query in enumerate(queries):
                label = query.document
                by_text = text_hits(conn, query.text, scope, k=pool)
                best = np.argsort(-vector_scores[i], kind="stable")[:pool]
                by_vector = [
                    Hit(index.owners[c], "", int(c), f"c{c}", float(vector_scores[i][c]), "")
                    for c in best
                ]
                for mode, ranking in (
                    ("text", by_text),
                    ("hybrid", fuse([by_vector, by_text], pool)),
                ):
                    # As for the vectors: the place of the document's best chunk.
                    own = (n for n, hit in enumerate(ranking, 1) if hit.doc_id == label)
                    ranks[mode].append(next(own, pool + 1))
        finally:
            conn.close()
    return {mode: np.asarray(found, dtype=np.int64) for mode, found in ranks.items()}


def _load_chunks(dsn: str, index: Index) -> None:
    """The chunks in the ledger as a run leaves them: each document current and embedded
    (spec ``bench``), its chunks in order."""
    conn = db.connect(dsn)
    try:
        with conn.cursor() as cur:
            for doc in dict.fromkeys(index.owners):
                cur.execute(
                    "INSERT INTO replayable.documents (doc_id, uri, size_bytes) VALUES (%s, %s, 1)",
                    (doc, f"bench://{doc}"),
                )
                cur.execute(
                    "INSERT INTO replayable.stage_runs (stage, item_key, doc_id, status,"
                    " code_version, config_hash, is_current, spec_hash)"
                    " VALUES ('embed', %s, %s, 'done', 'bench', 'bench', true, 'bench')",
                    (f"e-{doc}", doc),
                )
            ordinal: Counter[str] = Counter()
            for c, (text, doc) in enumerate(zip(index.chunks, index.owners, strict=True)):
                cur.execute(
                    "INSERT INTO replayable.chunks (chunk_id, text) VALUES (%s, %s)",
                    (f"c{c}", text.replace("\x00", "")),
                )
                cur.execute(
                    "INSERT INTO replayable.doc_chunks (doc_id, extractor_version,"
                    " chunker_key, ordinal, chunk_id) VALUES (%s, 'bench', 'bench', %s, %s)",
                    (doc, ordinal[doc], f"c{c}"),
                )
                ordinal[doc] += 1
        conn.commit()
    finally:
        conn.close()


def _rows(what: str, recall: dict[str, float], chance: float, notes: list[str]) -> list[Row]:
    """B16, the bundled model against hashing; then each model against random ranking."""
    return [
        Row(
            "B16",
            f"recall@{TOP}, bundled model / feature hashing, {what}",
            f"feature hashing ({DEFAULT_MODEL}, {DIM} dims)",
            Samples((round(recall["hashing"], 3),), unit=UNIT),
            wordllama_model.MODEL,
            Samples((round(recall["wordllama"], 3),), unit=UNIT),
            TARGET,
            notes=notes,
        ),
        *(
            Row(
                f"B16.{label}",
                f"recall@{TOP} of {label}, against random ranking",
                "random ranking (expected)",
                Samples((round(chance, 3),), unit=UNIT),
                f"{model}, {DIM} dims",
                Samples((round(recall[label], 3),), unit=UNIT),
                target_on="measured",
            )
            for label, model in MODELS
        ),
        *(
            Row(
                f"B16.{label}",
                f"recall@{TOP} by {what_ranks}, against the bundled model's vectors alone",
                f"{wordllama_model.MODEL} vectors",
                Samples((round(recall["wordllama"], 3),), unit=UNIT),
                what_ranks,
                Samples((round(recall[label], 3),), unit=UNIT),
                target,
                target_on="measured",
            )
            for label, what_ranks, target in (
                ("text", "Postgres full-text search (--mode text)", None),
                ("hybrid", "both, fused by reciprocal rank (--mode hybrid)", HYBRID_TARGET),
            )
        ),
    ]


def run(
    documents: int | None = None, per_document: int = PER_DOCUMENT
) -> tuple[list[Row], dict[str, Any]]:
    """recall@5 of the bundled model and of feature hashing over the shipped PDFs."""
    if (documents is not None and documents < 1) or per_document < 1:
        raise ValueError(
            f"documents and per_document must be positive: {documents}, {per_document}"
        )
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    docs, source, fallback, left_out = _corpus(documents)
    queries = _queries(docs, per_document)
    if documents is not None:
        chosen = set(_spread(sorted({q.document for q in queries}), documents))
        docs = [doc for doc in docs if doc.name in chosen]
        queries = [q for q in queries if q.document in chosen]
    corpus = f"{len(docs)} {source}"
    needed = MIN_QUERIES if documents is None else 1
    if len(queries) < needed:
        raise BenchError(
            f"{len(queries)} queries from the outlines of {corpus}, fewer than {needed}; "
            "tests/install-realworld-tools.sh installs the packages that ship the PDFs"
        )
    seconds["read"] = time.perf_counter() - started

    started = time.perf_counter()
    index = _index(docs, queries)
    seconds["chunk"] = time.perf_counter() - started

    texts = [q.text for q in queries]
    labels = np.array([q.document for q in queries])
    owners = np.array(index.owners)
    ranks: dict[str, npt.NDArray[np.int64]] = {}
    scores: dict[str, Matrix] = {}
    for label, model in MODELS:
        started = time.perf_counter()
        embedded = _embed(model, texts)
        chunk_vectors = _embed(model, index.chunks)
        ranks[label] = _ranks(embedded, chunk_vectors, owners, labels)
        scores[label] = embedded @ chunk_vectors.T
        seconds[label] = time.perf_counter() - started
    started = time.perf_counter()
    ranks.update(_text_and_hybrid(index, queries, scores["wordllama"]))
    seconds["text and hybrid"] = time.perf_counter() - started
    narrow = _ranks(
        _embed(DEFAULT_MODEL, texts, SERVER_DEFAULT_DIM),
        _embed(DEFAULT_MODEL, index.chunks, SERVER_DEFAULT_DIM),
        owners,
        labels,
    )
    recall = {label: _recall(r) for label, r in ranks.items()}
    chance = _chance(Counter(index.owners), [q.document for q in queries])

    hits = {label: int((r <= TOP).sum()) for label, r in ranks.items()}
    n = len(queries)
    per_query = [
        {"query": q.text, "document": q.document, "ranks": {k: int(r[i]) for k, r in ranks.items()}}
        for i, q in enumerate(queries)
    ]
    examples = [
        f"{row['query']!r} in {row['document']}: "
        + ", ".join(f"{label} rank {rank}" for label, rank in row["ranks"].items())
        for row in _spread(per_query, EXAMPLES)
    ]
    summary = (
        f"{n} queries (headings) from {len({q.document for q in queries})} of {len(docs)} "
        f"documents, at most {per_document} each; {len(index.chunks)} chunks "
        f"({CHUNKING.key}); {index.removed} occurrences of the headings "
        f"removed before chunking, {len(index.verbatim)} found verbatim afterwards"
    )
    recalls = (
        f"recall@{TOP}: {wordllama_model.MODEL} {hits['wordllama']}/{n} = "
        f"{recall['wordllama']:.3f}; feature hashing at {DIM} dims {hits['hashing']}/{n} = "
        f"{recall['hashing']:.3f}, at the server's default {SERVER_DEFAULT_DIM} "
        f"{_recall(narrow):.3f}; random ranking {chance:.3f} (expected); Postgres full-text "
        f"search {hits['text']}/{n} = {recall['text']:.3f}; hybrid ({wordllama_model.MODEL} "
        f"and full text, fused by reciprocal rank) {hits['hybrid']}/{n} = "
        f"{recall['hybrid']:.3f}"
    )
    rows = _rows(f"{n} headings of {corpus}", recall, chance, [summary, recalls])
    details: dict[str, Any] = {
        "corpus": corpus,
        "fallback_to_samples": fallback,
        "documents": len(docs),
        "documents_with_queries": len({q.document for q in queries}),
        "left_out": left_out,
        "queries": n,
        "per_document": per_document,
        "chunks": len(index.chunks),
        "chunk_config": CHUNKING.key,
        "dimensions": DIM,
        "top": TOP,
        "headings_removed": index.removed,
        "headings_found_verbatim": index.verbatim,
        "recall": {**recall, f"hashing_{SERVER_DEFAULT_DIM}_dims": _recall(narrow)},
        "hits": hits,
        "random_ranking_recall": chance,
        "median_rank": {label: float(np.median(r)) for label, r in ranks.items()},
        # run.py files the benchmark's whole time under "seconds".
        "phase_seconds": {phase: round(s, 2) for phase, s in seconds.items()},
        "examples": examples,
        "per_query": per_query,
        "notes": [
            f"corpus: {corpus}",
            *(f"left out: {line}" for line in left_out),
            summary,
            recalls,
            "examples (rank of the query's document, by its best chunk):",
            *(f"  {line}" for line in examples),
        ],
    }
    return rows, details
