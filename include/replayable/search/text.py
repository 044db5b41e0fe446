"""Full-text search beside the vectors, and the fusion of both rankings by reciprocal rank
(ADR 0143): words a question shares with a chunk find what a small embedding model misses,
names and codes above all, and the vectors find what is said in other words."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from replayable.db import Connection, fetch_all
from replayable.search.index import TEXT_CONFIG
from replayable.search.model import MAX_K, SNIPPET_CHARS, Hit, Scope, SearchError

MODES = ("vector", "text", "hybrid")
DEFAULT_MODE = "hybrid"
# Reciprocal rank fusion (Cormack, Clarke and Büttcher, 2009): a hit's share from a ranking
# is 1 / (RRF_K + its rank there), so a chunk near the top of both counts most. Their 60
# flattens the top; with 5 the top of each ranking leads. On the Debian PDFs' headings
# (B16) recall@5 was 0.737 at 60, 0.751 at 10 and 0.77 to 0.79 from 1 to 5 (ADR 0143).
RRF_K = 5
# Candidates each ranking gives the fusion, per hit asked for (and at least).
FUSION_PER_HIT = 3
FUSION_MIN = 30


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise SearchError(f"mode: one of {', '.join(MODES)}, not {mode!r}")
    return mode


def fusion_pool(k: int) -> int:
    """How many candidates each ranking gives a fusion of ``k`` hits."""
    return min(MAX_K, max(FUSION_MIN, k * FUSION_PER_HIT))


def text_hits(
    conn: Connection, query: str, scope: Scope, *, k: int, source: str | None = None
) -> list[Hit]:
    """The ``k`` chunks of current documents in ``scope`` that share the most words with
    ``query``, best first; ``source`` keeps only documents whose URI starts with it."""
    params = {
        "config": TEXT_CONFIG,
        "query": query,
        **scope.documents(),
        "source": source,
        "k": k,
        "snippet": SNIPPET_CHARS,
    }
    return [Hit.of(row) for row in fetch_all(conn, "search/text_chunks", params)]


def fuse(rankings: Sequence[Sequence[Hit]], k: int) -> list[Hit]:
    """The ``k`` best hits of ``rankings`` by reciprocal rank fusion; a hit's score is its
    fused score. Ties go to the document and chunk that come first, so the order is stable."""
    scores: dict[tuple[str, int], float] = {}
    first: dict[tuple[str, int], Hit] = {}
    for ranking in rankings:
        for rank, hit in enumerate(ranking, start=1):
            place = (hit.doc_id, hit.ordinal)
            scores[place] = scores.get(place, 0.0) + 1.0 / (RRF_K + rank)
            first.setdefault(place, hit)
    best = sorted(scores, key=lambda place: (-scores[place], place))[:k]
    return [dataclasses.replace(first[place], score=scores[place]) for place in best]
