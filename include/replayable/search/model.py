"""What a search is asked and answers: its scope, its hits, its refusals."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

SNIPPET_CHARS = 300
MAX_K = 100


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
    """What is searched: the vectors of ``model`` under the embed spec ``spec_hash``."""

    model: str
    spec_hash: str
    extractor_version: str
    chunker_key: str


@dataclass(frozen=True)
class Answer:
    """A search's answer: the question as searched, the model, and the chunks, best first."""

    query: str
    model: str
    hits: list[Hit] = field(default_factory=list)
    exact: bool = False  # whether the index's candidates fell short and every vector was read
    mode: str = "vector"  # vector, text or hybrid (ADR 0143)

    def as_dict(self) -> dict[str, Any]:
        return {
            "query": self.query,
            "model": self.model,
            "exact": self.exact,
            "mode": self.mode,
            "hits": [hit.as_dict() for hit in self.hits],
        }


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


def finite(score: float) -> float:
    """A similarity, or 0 where it has none (a vector of zeros has no direction)."""
    return score if math.isfinite(score) else 0.0
