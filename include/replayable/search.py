"""Search the pipeline's output: the chunks nearest a question, by their embeddings.

The question is embedded through the model connection, as the embed stage embeds chunks,
then compared (cosine) with the current embeddings of current documents: those of the
documents whose embed item is done under the spec a run with these settings has now (the
model and dimensions, the chunker and the extractor), so a document re-chunked or
re-embedded under other settings is searched under the current ones only (ADR 0118).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from replayable.db import Connection, fetch_all
from replayable.stages.embed.store import vector_literal

SNIPPET_CHARS = 300


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


@dataclass(frozen=True)
class Scope:
    """What is searched: the vectors of ``model`` under the embed spec ``spec_hash``."""

    model: str
    spec_hash: str
    extractor_version: str
    chunker_key: str


class SearchError(ValueError):
    """A search that cannot be made: the message says which input is wrong."""


def check_query(query: str) -> str:
    text = " ".join(query.split())
    if not text:
        raise SearchError("query: give a question or some words to search for")
    return text


def search(
    conn: Connection,
    vector: Sequence[float],
    scope: Scope,
    *,
    k: int = 10,
    source: str | None = None,
) -> list[Hit]:
    """The ``k`` chunks nearest ``vector`` in ``scope``, best first; ``source`` keeps only
    documents whose URI starts with it."""
    rows = fetch_all(
        conn,
        "search/best_chunks",
        {
            "vector": vector_literal(vector),
            "model": scope.model,
            "spec_hash": scope.spec_hash,
            "extractor_version": scope.extractor_version,
            "chunker_key": scope.chunker_key,
            "source": source,
            "k": k,
            "snippet": SNIPPET_CHARS,
        },
    )
    if not rows and not fetch_all(conn, "search/has_model", {"model": scope.model})[0]["found"]:
        raise SearchError(
            f"model: the ledger has no vectors for {scope.model!r}; embed documents with it "
            "first, or name the model they were embedded with"
        )
    return [
        Hit(
            doc_id=row["doc_id"],
            uri=row["uri"],
            ordinal=int(row["ordinal"]),
            chunk_id=row["chunk_id"],
            score=float(row["score"]),
            snippet=" ".join(str(row["snippet"]).split()),
        )
        for row in rows
    ]
