"""The embed stage: vectors for each document's chunks from an OpenAI-compatible endpoint.

``spec`` plans the items and dispatches a batch to a mode: ``sync`` (requests answered at
once) or ``batch`` (the provider's Batch API, with ``batch_submit``, ``batch_collect`` and
``batch_files``). Both modes read the spec through ``config`` and share ``passes``,
``packing`` and ``store``; the model clients are in :mod:`replayable.models`. The package
itself imports none of them, so reading :data:`VERSION` stays cheap.
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
