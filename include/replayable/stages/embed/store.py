"""What both embed modes share: a request's key, how its vectors are stored, and which chunks
are refused for good (too long, or decided by a batch line)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from replayable.db import Connection, execute_values
from replayable.keys import sha256_bytes
from replayable.retry import ErrorKind, ItemError


def request_key(model: str, dimensions: int | None, chunk_ids: Sequence[str]) -> str:
    """The Idempotency-Key of a request (a batch line's ``custom_id``): its model,
    dimensions and exact chunk ids.

    The same chunks always make the same request and the same key, across retries, task
    tries, workers and modes, so a provider that de-duplicates by key never charges twice
    for it; different chunks never share a key.
    """
    digest = sha256_bytes("\x00".join([model, str(dimensions), *sorted(chunk_ids)]).encode())
    return f"replayable-embed-{digest[:40]}"


def too_long(tokens: Mapping[str, int], limit: int) -> dict[str, ItemError]:
    """The chunks past the per-input ``limit`` (estimated tokens), each with its error.

    The provider would refuse the whole request with a 400 after the send; the chunk is its
    document's for good (a larger chunk_size made it), so the error is terminal and comes
    before anything is sent.
    """
    return {
        cid: ItemError(
            "input_too_long",
            f"chunk {cid[:12]} is about {n} tokens, past the model's {limit} per input; a "
            "smaller chunk_size cuts it",
            ErrorKind.TERMINAL,
        )
        for cid, n in sorted(tokens.items())
        if n > limit
    }


def line_verdict(row: dict[str, Any]) -> ItemError:
    """The terminal error of a chunk a line decided (a ``batches/refused_chunks`` row): lost
    by a completed batch, or refused alone; it is not sent again, in either mode (ADR 0146)."""
    if row["status"] == "lost":
        why = f"a completed batch returned no result for line {row['custom_id']}"
    else:
        why = f"the provider refused it (line {row['custom_id']}): {row['error']}"
    return ItemError(
        row["error_class"] or "batch_line_lost",
        f"chunk {row['chunk_id']} is not embedded and will not be sent again: {why}",
        ErrorKind.TERMINAL,
    )


def store_vectors(
    conn: Connection,
    model: str,
    dimensions: int,
    chunk_ids: Sequence[str],
    vectors: Sequence[Sequence[float]],
) -> None:
    """Insert each chunk's vector under ``model`` at ``dimensions`` (as stored: 0 for the
    model's own size, :func:`~replayable.stages.embed.stored_dimensions`); a chunk stored
    already under both keeps its own."""
    execute_values(
        conn,
        "stages/insert_embeddings",
        [
            (cid, model, dimensions, len(vec), vector_literal(vec))
            for cid, vec in zip(chunk_ids, vectors, strict=True)
        ],
        template="(%s, %s, %s, %s, %s::vector)",
    )


def vector_literal(vector: Sequence[float]) -> str:
    """``vector`` as pgvector's text form, ``[x,y,…]``, bound as a value."""
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"
