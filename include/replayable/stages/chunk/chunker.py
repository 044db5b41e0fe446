"""Split text into overlapping, content-addressed chunks: the chunk stage's work.

Deterministic: the same text, version and config give the same chunks, so identical
re-extracted text maps onto chunks (and embeddings) that already exist.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from replayable.keys import sha256_bytes
from replayable.knobs import DEFAULTS, check_chunking
from replayable.retry import ItemError
from replayable.stages.chunk import VERSION

if TYPE_CHECKING:
    from replayable.settings import PipelineSettings

_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class ChunkConfig:
    """Target chunk size and overlap, in characters."""

    size: int = DEFAULTS["chunk_size"]
    overlap: int = DEFAULTS["chunk_overlap"]

    def __post_init__(self) -> None:
        check_chunking(self.size, self.overlap)

    @property
    def key(self) -> str:
        """Name of this chunker setup: version, size and overlap."""
        return f"v{VERSION}-s{self.size}-o{self.overlap}"


def chunk_config_of(settings: PipelineSettings) -> ChunkConfig:
    """The chunk stage's config under a run's settings."""
    return ChunkConfig(size=settings.chunk_size, overlap=settings.chunk_overlap)


@dataclass(frozen=True)
class Chunk:
    """One chunk: its content address, its position in the document and its text."""

    chunk_id: str
    ordinal: int
    text: str


def chunk_id(text: str) -> str:
    """Content address of a chunk: sha256 of the chunker version and the chunk text."""
    return sha256_bytes(f"{VERSION}\x00{text}".encode())


def chunk_text(text: str, config: ChunkConfig, max_chunks: int | None = None) -> list[Chunk]:
    """Split ``text`` into chunks of about ``config.size`` characters on word boundaries.

    Past ``max_chunks`` it stops with ItemError ``oversize_text`` (terminal, ADR 0087).
    """
    words = _SPACE.sub(" ", text).strip().split(" ")
    if words == [""]:
        return []
    chunks: list[Chunk] = []
    start = 0
    while start < len(words):
        end, length = start, 0
        while end < len(words) and (length == 0 or length + 1 + len(words[end]) <= config.size):
            length += len(words[end]) + (1 if length else 0)
            end += 1
        piece = " ".join(words[start:end])
        if max_chunks is not None and len(chunks) >= max_chunks:
            raise ItemError(
                "oversize_text", f"the text makes more than max_chunks_per_doc ({max_chunks})"
            )
        chunks.append(Chunk(chunk_id(piece), len(chunks), piece))
        if end >= len(words):
            break
        # Step back over whole words worth about `overlap` characters, always moving forward.
        back, kept = end, 0
        while back > start + 1 and kept + len(words[back - 1]) + 1 <= config.overlap:
            back -= 1
            kept += len(words[back]) + 1
        start = back
    return chunks
