"""The chunk stage as a :class:`~replayable.runner.StageSpec`: keys, input and output.

An item is one document's extracted text, keyed by the document, the extractor version and
the text's hash plus the chunker's version, size and overlap; its outputs are content-addressed
``chunks`` and the document's ``doc_chunks`` rows. Texts are read in groups of bounded size.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from replayable.db import Connection, Database, fetch_all
from replayable.retry import ItemError
from replayable.runner import BatchIO, StageSpec, WorkItem, Write
from replayable.stages import chunk, extract
from replayable.stages.chunk import chunker
from replayable.stages.chunk.chunker import ChunkConfig
from replayable.stages.lineage import chunk_lineage
from replayable.stages.texts import text_items


@dataclass
class ChunkSpec(StageSpec):
    """Split each document's extracted text into content-addressed chunks."""

    config: ChunkConfig
    connect: Callable[[], Database]
    # Read when the stage is built, as the planner reads them (stages.lineage.spec_hashes).
    # The extraction it reads: code version and engine policy (extract.extractor_id).
    extractor_version: str = field(default_factory=extract.extractor_id)
    code_version: str = field(default_factory=lambda: chunk.VERSION)
    name: str = "chunk"
    group_bytes: int = 16 * 2**20
    # Terminal limits (ADR 0087): a stored text over max_text_chars is never read into the
    # task process; a text that makes more chunks than max_chunks_per_doc is not stored.
    max_text_chars: int | None = None
    max_chunks_per_doc: int | None = None

    def key_config(self) -> dict[str, Any]:
        return {"size": self.config.size, "overlap": self.config.overlap}

    def lineage(self) -> dict[str, Any]:
        return chunk_lineage(self.config, self.extractor_version)

    def plan(self, conn: Connection, doc_ids: Sequence[str]) -> list[WorkItem]:
        # The extractor version is part of the key because doc_chunks rows are filed under
        # it; the chunk ids themselves are content addresses, shared across versions.
        return text_items(
            conn,
            self,
            doc_ids,
            extractor_version=self.extractor_version,
            payload=lambda row: (int(row["text_bytes"]), row["text_chars"]),
            max_text_chars=self.max_text_chars,
        )

    def process(self, items: Sequence[WorkItem], io: BatchIO) -> None:
        limit = self.max_text_chars
        fitting = []
        for item in items:
            chars = item.payload[1]
            if limit is not None and chars is not None and chars > limit:
                error = ItemError(
                    "oversize_text",
                    f"the stored text has {chars} characters, over max_text_chars ({limit})",
                )
                io.failed(item, error)
            else:
                fitting.append(item)
        database = self.connect()
        try:
            for group in _groups_by_size(fitting, self.group_bytes):
                texts = database.transaction(
                    functools.partial(self._texts, group=group), describe="chunk: read texts"
                )
                for item in group:
                    self._one(item, texts.get(item.doc_id, ""), io)
        finally:
            database.close()

    def _texts(self, conn: Connection, *, group: Sequence[WorkItem]) -> dict[str, str]:
        params = {
            "doc_ids": [item.doc_id for item in group],
            "extractor_version": self.extractor_version,
        }
        return {
            row["doc_id"]: row["text"] for row in fetch_all(conn, "stages/extraction_texts", params)
        }

    def _one(self, item: WorkItem, text: str, io: BatchIO) -> None:
        try:
            if not io.holds(item):
                raise ItemError("lease_lost", "another worker took the item over")
            chunks = chunker.chunk_text(text, self.config, self.max_chunks_per_doc)
            if not chunks:
                raise ItemError("empty_text", "the extracted text has no words")
        except Exception as error:
            io.failed(item, error)
            return
        io.done(
            item,
            [
                Write(
                    "stages/insert_chunks",
                    [(c.chunk_id, c.text) for c in chunks],
                    size=sum(len(c.text) for c in chunks),
                ),
                Write(
                    "stages/insert_doc_chunks",
                    [
                        (
                            item.doc_id,
                            self.extractor_version,
                            self.config.key,
                            c.ordinal,
                            c.chunk_id,
                        )
                        for c in chunks
                    ],
                ),
            ],
        )


def _groups_by_size(items: Sequence[WorkItem], limit: int) -> Iterator[list[WorkItem]]:
    group: list[WorkItem] = []
    size = 0
    for item in items:
        text_bytes = int(item.payload[0] or 0)
        if group and size + text_bytes > limit:
            yield group
            group, size = [], 0
        group.append(item)
        size += text_bytes
    if group:
        yield group
