"""The pipeline's stages as :class:`~replayable.runner.StageSpec`: keys, inputs, outputs.

Each spec says what an item's key is made of and where its input and output live; the
stage functions in ``replayable.stages`` do the work. Keys:

- extract: document bytes (doc_id) + extractor version;
- chunk: the document, extractor version and text hash + chunker version, size, overlap;
- embed: the document's chunk ids + embedder version, model and dimensions.

So re-extracted text that is identical keys to the chunks and embeddings that exist.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from replayable import guards
from replayable.db import Connection, execute, execute_values, fetch_all
from replayable.keys import item_key, sha256_bytes
from replayable.retry import ErrorKind, ItemError
from replayable.runner import CallSink, WorkItem
from replayable.stages import chunk, embed, extract


@dataclass
class ExtractSpec:
    """Extract text from each document's PDF in a guarded worker process."""

    pool: guards.GuardedPool
    max_bytes: int
    code_version: str = extract.VERSION
    name: str = "extract"

    def key_config(self) -> dict[str, Any]:
        return {}

    def plan(self, conn: Connection, doc_ids: Sequence[str]) -> list[WorkItem]:
        rows = fetch_all(conn, "documents_by_id", {"doc_ids": list(doc_ids)})
        cfg = self.key_config()
        return [
            WorkItem(
                row["doc_id"],
                item_key(self.name, self.code_version, cfg, [row["doc_id"]]),
                row["uri"],
            )
            for row in rows
        ]

    def process(self, conn: Connection, item: WorkItem, calls: CallSink) -> None:
        # Size comes from stat, before a single byte is read.
        guards.check_size(item.payload, self.max_bytes)
        result = self.pool.run(extract.extract_file, item.payload)
        execute(
            conn,
            "insert_extraction",
            {
                "doc_id": item.doc_id,
                "extractor_version": self.code_version,
                "page_count": result.page_count,
                "text": result.text,
                "text_sha256": sha256_bytes(result.text.encode()),
            },
        )


@dataclass
class ChunkSpec:
    """Split each document's extracted text into content-addressed chunks."""

    config: chunk.ChunkConfig
    extractor_version: str = extract.VERSION
    code_version: str = chunk.VERSION
    name: str = "chunk"

    def key_config(self) -> dict[str, Any]:
        return {"size": self.config.size, "overlap": self.config.overlap}

    def plan(self, conn: Connection, doc_ids: Sequence[str]) -> list[WorkItem]:
        rows = fetch_all(
            conn,
            "extractions_for",
            {"doc_ids": list(doc_ids), "extractor_version": self.extractor_version},
        )
        cfg = self.key_config()
        # The extractor version is part of the key because doc_chunks rows are filed under
        # it; the chunk ids themselves are content addresses, shared across versions.
        return [
            WorkItem(
                row["doc_id"],
                item_key(
                    self.name,
                    self.code_version,
                    cfg,
                    [row["doc_id"], self.extractor_version, row["text_sha256"]],
                ),
            )
            for row in rows
        ]

    def process(self, conn: Connection, item: WorkItem, calls: CallSink) -> None:
        rows = fetch_all(
            conn,
            "extraction_text",
            {"doc_id": item.doc_id, "extractor_version": self.extractor_version},
        )
        chunks = chunk.chunk_text(rows[0]["text"], self.config)
        if not chunks:
            raise ItemError("empty_text", "the extracted text has no words")
        execute_values(conn, "insert_chunks", [(c.chunk_id, c.text) for c in chunks])
        execute_values(
            conn,
            "insert_doc_chunks",
            [
                (item.doc_id, self.extractor_version, self.config.key, c.ordinal, c.chunk_id)
                for c in chunks
            ],
        )


@dataclass
class EmbedSpec:
    """Embed each document's chunks that no document has embedded yet under this model."""

    provider: embed.EmbeddingProvider
    model: str
    chunker_key: str
    dimensions: int | None = None
    inputs_per_call: int = 32
    extractor_version: str = extract.VERSION
    code_version: str = embed.VERSION
    name: str = "embed"
    wait_for_peer_s: float = 300.0

    def key_config(self) -> dict[str, Any]:
        return {"model": self.model, "dimensions": self.dimensions}

    def plan(self, conn: Connection, doc_ids: Sequence[str]) -> list[WorkItem]:
        rows = fetch_all(
            conn,
            "doc_chunks_for",
            {
                "doc_ids": list(doc_ids),
                "extractor_version": self.extractor_version,
                "chunker_key": self.chunker_key,
            },
        )
        by_doc: dict[str, list[str]] = defaultdict(list)
        for row in rows:
            by_doc[row["doc_id"]].append(row["chunk_id"])
        cfg = self.key_config()
        return [
            WorkItem(doc_id, item_key(self.name, self.code_version, cfg, ids), ids)
            for doc_id, ids in by_doc.items()
        ]

    def process(self, conn: Connection, item: WorkItem, calls: CallSink) -> None:
        """Embed the item's chunks that no one has embedded; wait out chunks a peer holds."""
        deadline = time.monotonic() + self.wait_for_peer_s
        pending = [row["chunk_id"] for row in self._missing(conn, item.payload)]
        while pending:
            locked = self._lock(conn, pending)
            self._embed(conn, item, locked, calls)
            pending = [cid for cid in pending if cid not in locked]
            if pending and time.monotonic() > deadline:
                raise ItemError(
                    "chunk_busy",
                    f"{len(pending)} chunk(s) held by another worker",
                    ErrorKind.RETRYABLE,
                )
            if pending:
                time.sleep(0.2)

    def _missing(self, conn: Connection, chunk_ids: Iterable[str]) -> list[dict[str, Any]]:
        """The chunks (id and text) with no embedding under this model yet."""
        return fetch_all(
            conn, "chunks_missing_embedding", {"chunk_ids": sorted(chunk_ids), "model": self.model}
        )

    def _lock(self, conn: Connection, chunk_ids: Sequence[str]) -> set[str]:
        """Take the chunks no other worker holds, in one query; the locks last until commit."""
        rows = fetch_all(
            conn, "lock_free_chunks", {"chunk_ids": list(chunk_ids), "model": self.model}
        )
        return {row["chunk_id"] for row in rows}

    def _embed(
        self, conn: Connection, item: WorkItem, chunk_ids: set[str], calls: CallSink
    ) -> None:
        # Re-check under the locks: a peer may have committed since the first look.
        todo = self._missing(conn, chunk_ids) if chunk_ids else []
        groups = [
            todo[i : i + self.inputs_per_call] for i in range(0, len(todo), self.inputs_per_call)
        ]
        for group in groups:
            ids = [row["chunk_id"] for row in group]
            result = self.provider.embed(
                [row["text"] for row in group],
                idempotency_key=_idempotency_key(item, ids),
                on_call=calls,
            )
            execute_values(
                conn,
                "insert_embeddings",
                [
                    (cid, self.model, len(vec), _vector_literal(vec))
                    for cid, vec in zip(ids, result.vectors, strict=True)
                ],
                template="(%s, %s, %s, %s::vector)",
            )


def _idempotency_key(item: WorkItem, chunk_ids: Sequence[str]) -> str:
    """The item key for a request that carries the item's whole input, as most do.

    A request with part of it (a long document, or chunks a peer already embedded) gets the
    item key plus a hash of its chunk ids: a provider that de-duplicates by key must never
    answer one request with another's vectors.
    """
    if set(chunk_ids) == set(item.payload):
        return item.item_key
    return f"{item.item_key}-{sha256_bytes(','.join(sorted(chunk_ids)).encode())[:16]}"


def _vector_literal(vector: Sequence[float]) -> str:
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"
