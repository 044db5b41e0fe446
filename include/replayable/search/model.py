"""What a search is asked and answers: its scope, its hits, its refusals."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from replayable.settings import BOUNDS

SNIPPET_CHARS = 300
MAX_K = 100
# The dimensions a search may name: those a run may ask for, or 0 (the model's own size).
DIMENSIONS = BOUNDS["dimensions"]

# Why a document is left out of a search, as a sentence says it.
LEFT_OUT_REASONS = {
    "other_settings": "embedded only under other settings",
    "failed": "failed in embed",
    "dead": "dead in embed",
    "unfinished": "not embedded yet",
}


@dataclass(frozen=True)
class Hit:
    """One chunk found: its document, its place in it, its similarity, and its start."""

    doc_id: str
    uri: str
    ordinal: int
    chunk_id: str
    score: float
    snippet: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, row: dict[str, Any]) -> Hit:
        """The hit a search query's row names (its score made finite, its snippet folded)."""
        return cls(
            doc_id=row["doc_id"],
            uri=row["uri"],
            ordinal=int(row["ordinal"]),
            chunk_id=row["chunk_id"],
            score=finite(float(row["score"])),
            snippet=" ".join(str(row["snippet"]).split()),
        )


@dataclass(frozen=True)
class Scope:
    """What is searched (ADR 0152): the vectors of ``model`` of documents with an embed item
    done under ``config_hash`` (the embed stage's key config: the model and dimensions), in
    their chunks under ``chunker_key`` of the text of ``extractor_version``."""

    model: str
    config_hash: str
    extractor_version: str
    chunker_key: str
    dimensions: int | None = None  # as asked of the model; None: its own
    run_id: str | None = None  # the run whose settings these are; None: the defaults

    def documents(self) -> dict[str, str]:
        """The query parameters naming the documents and chunks it reads (every search's)."""
        return {
            "config_hash": self.config_hash,
            "extractor_version": self.extractor_version,
            "chunker_key": self.chunker_key,
        }


@dataclass(frozen=True)
class RunSettings:
    """A run's settings, as it recorded them: what a search reads by default (ADR 0152)."""

    run_id: str
    settings: dict[str, Any]


@dataclass(frozen=True)
class Coverage:
    """What a search covered: the documents done under its settings, and those left out
    by why (done only under other settings, failed, dead, unfinished)."""

    documents: int
    left_out: dict[str, int] = field(default_factory=dict)
    counted_at: datetime | None = (
        None  # when it was counted; None: just now, on the search's own connection
    )

    @classmethod
    def of(cls, row: dict[str, Any]) -> Coverage:
        """The coverage a counting query's row, or a stored count's, gives."""
        left = row.get("left_out")
        if left is None:
            left = {reason: int(row[reason]) for reason in LEFT_OUT_REASONS if row[reason]}
        return cls(int(row["documents"]), dict(left), row.get("counted_at"))

    def as_dict(self) -> dict[str, Any]:
        return {
            "documents": self.documents,
            "left_out": dict(self.left_out),
            "counted_at": self.counted_at.isoformat() if self.counted_at else None,
        }


@dataclass(frozen=True)
class Answer:
    """A search's answer: the question as searched, the model, and the chunks, best first."""

    query: str
    model: str
    hits: list[Hit] = field(default_factory=list)
    exact: bool = False  # whether the index's candidates fell short and every vector was read
    mode: str = "vector"  # vector, text or hybrid (ADR 0143)
    dimensions: int | None = None  # as asked of the model; None: its own
    run_id: str | None = None  # whose settings were searched; None: the defaults
    coverage: Coverage | None = None  # what was searched, when the caller asked

    def as_dict(self) -> dict[str, Any]:
        return {
            "query": self.query,
            "model": self.model,
            "dimensions": self.dimensions,
            "run_id": self.run_id,
            "exact": self.exact,
            "mode": self.mode,
            "coverage": self.coverage.as_dict() if self.coverage is not None else None,
            "hits": [hit.as_dict() for hit in self.hits],
        }


def searched(answer: dict[str, Any]) -> str:
    """What an answer (:meth:`Answer.as_dict`) searched, in one sentence: the model and its
    dimensions, whose settings, and how many documents that covers and leaves out, and why."""
    dims = answer.get("dimensions")
    vectors = f"{answer['model']} ({dims} dimensions)" if dims else f"{answer['model']}"
    run = answer.get("run_id")
    whose = f"the settings of run {run}" if run else "the default settings (no complete run yet)"
    sentence = f"Searched {vectors} under {whose}"
    cover = answer.get("coverage")
    if cover is None:
        return sentence + " (the documents it covers are being counted)."
    sentence += f": {cover['documents']:,} documents"
    left = [
        f"{n:,} {LEFT_OUT_REASONS.get(reason, reason)}" for reason, n in cover["left_out"].items()
    ]
    sentence += f"; left out: {', '.join(left)}" if left else ", none left out"
    if cover.get("counted_at"):
        when = datetime.fromisoformat(cover["counted_at"]).astimezone(UTC)
        sentence += f" (counted {when:%Y-%m-%d %H:%M} UTC)"
    return sentence + "."


class SearchError(ValueError):
    """A search that cannot be made: the message says which input is wrong."""


def check_query(query: str) -> str:
    text = " ".join(query.split())
    if not text:
        raise SearchError("query: give a question or some words to search for")
    return text


def check_k(k: int) -> int:
    if not 1 <= k <= MAX_K:
        raise SearchError(f"k: ask for between 1 and {MAX_K} chunks, not {k}")
    return k


def check_dimensions(dimensions: int) -> int:
    """A search's ``dimensions``: as a run asks the model (ADR 0151), or 0 for its own size."""
    low, high = DIMENSIONS
    if not (dimensions == 0 or low <= dimensions <= high):
        raise SearchError(dimensions_refused(dimensions))
    return dimensions


def dimensions_refused(value: object) -> str:
    """The sentence that refuses ``value`` as a search's ``dimensions``."""
    low, high = DIMENSIONS
    return (
        f"dimensions: a whole number from {low:g} to {high:g}, or 0 for the model's own size, "
        f"not {value!r}"
    )


def finite(score: float) -> float:
    """A similarity, or 0 where it has none (a vector of zeros has no direction)."""
    return score if math.isfinite(score) else 0.0
