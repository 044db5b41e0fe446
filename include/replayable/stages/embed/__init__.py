"""The embed stage: vectors for each document's chunks from an OpenAI-compatible endpoint.

``endpoint`` decides which endpoint and key a model connection names, ``client`` is the HTTP
client, and ``spec`` packs, sends and stores a batch's requests. The package itself imports
none of them, so reading :data:`VERSION` stays cheap.
"""

from __future__ import annotations

VERSION = "1.0"


def key_config(model: str, dimensions: int | None) -> dict[str, object]:
    """The embed stage's key config: what its items are keyed by beside their chunks and
    :data:`VERSION`, and what a search matches a document's done embed item on (ADR 0152)."""
    return {"model": model, "dimensions": dimensions}


def stored_dimensions(dimensions: int | None) -> int:
    """The dimensions a vector is stored, claimed and searched under (ADR 0151): the number
    its request asked for, or 0 when it asked for none (the model's own size)."""
    return dimensions or 0
