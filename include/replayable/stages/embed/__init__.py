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
