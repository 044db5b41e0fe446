"""What the stages share: the lineage each stage's spec hash is made of, and pool sizing.

A stage's spec hash names its code version and the config of every stage whose output it
reads (its lineage), so that a planner can tell which documents are done under the settings
of a run without building the stages. Keys:

- extract: document bytes (doc_id) + extractor version and engine policy;
- chunk: the document, extractor (version and policy) and text hash + chunker version, size,
  overlap;
- embed: the document and its chunk ids + embedder version, model and dimensions;
- summarize: the document, extractor (version and policy) and text hash + summarizer
  version, chat model, prompt, text read and answer length.

So re-extracted text that is identical keys to the chunks and embeddings that exist. Every
key names its document: two files with the same text share their chunks and vectors (paid
once, by content address and chunk lock), but each is its own item in every stage, with its
own outcome and its own ``document.ready`` (ADR 0085).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from replayable.knobs import DEFAULT_CHAT_MODEL
from replayable.runner import spec_hash_of
from replayable.stages import chunk, embed, extract, summarize
from replayable.stages.summarize.config import SummaryConfig

if TYPE_CHECKING:
    from replayable.stages.chunk.chunker import ChunkConfig


def chunk_lineage(config: ChunkConfig, extractor_version: str) -> dict[str, Any]:
    """The chunk stage's lineage: its size and overlap, and the extractor it reads from."""
    return {"size": config.size, "overlap": config.overlap, "extractor": extractor_version}


def embed_lineage(
    model: str, dimensions: int | None, chunker_key: str, extractor_version: str
) -> dict[str, Any]:
    """The embed stage's lineage: its model and dimensions, and the chunker and extractor."""
    return {
        "model": model,
        "dimensions": dimensions,
        "chunker": chunker_key,
        "extractor": extractor_version,
    }


def summary_lineage(config: SummaryConfig, extractor_version: str) -> dict[str, Any]:
    """The summarize stage's lineage: its key config, and the extractor it reads from."""
    return {**config.key(), "extractor": extractor_version}


def extract_hash(engine: str = extract.DEFAULT_ENGINE) -> str:
    """The extract stage's spec hash: its version and engine policy."""
    return spec_hash_of("extract", extract.VERSION, {"engine": engine})


def chunk_hash(config: ChunkConfig, engine: str = extract.DEFAULT_ENGINE) -> str:
    """The chunk stage's spec hash: its version, size and overlap, and the extractor."""
    return spec_hash_of("chunk", chunk.VERSION, chunk_lineage(config, extract.extractor_id(engine)))


def embed_hash(
    model: str,
    dimensions: int | None,
    config: ChunkConfig,
    engine: str = extract.DEFAULT_ENGINE,
) -> str:
    """The embed stage's spec hash: its version, model and dimensions, chunker, extractor."""
    lineage = embed_lineage(model, dimensions, config.key, extract.extractor_id(engine))
    return spec_hash_of("embed", embed.VERSION, lineage)


def summary_hash(config: SummaryConfig, engine: str = extract.DEFAULT_ENGINE) -> str:
    """The summarize stage's spec hash: its version and key config, and the extractor."""
    lineage = summary_lineage(config, extract.extractor_id(engine))
    return spec_hash_of("summarize", summarize.VERSION, lineage)


def spec_hashes(
    config: ChunkConfig,
    model: str,
    dimensions: int | None,
    engine: str = extract.DEFAULT_ENGINE,
    summary: SummaryConfig | None = None,
) -> dict[str, str]:
    """Each shipped stage's spec hash for a run's settings, without building the stages."""
    return {
        "extract": extract_hash(engine),
        "chunk": chunk_hash(config, engine),
        "embed": embed_hash(model, dimensions, config, engine),
        "summarize": summary_hash(summary or SummaryConfig(model=DEFAULT_CHAT_MODEL), engine),
    }


def default_workers(documents: int) -> int:
    """Guarded extraction workers for a batch: one per core, never more than its documents."""
    return max(1, min(os.cpu_count() or 1, documents))
