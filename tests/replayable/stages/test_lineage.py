"""A stage and the planner agree on its spec hash, also after a deploy changed a version."""

from __future__ import annotations

from typing import Any

import pytest

from replayable.runner import spec_hash
from replayable.stages import chunk, embed, extract
from replayable.stages.chunk.chunker import ChunkConfig
from replayable.stages.chunk.spec import ChunkSpec
from replayable.stages.embed.spec import EmbedSpec
from replayable.stages.extract.spec import ExtractSpec
from replayable.stages.lineage import spec_hashes

CONFIG = ChunkConfig(size=200, overlap=20)


def built(stage: str) -> Any:
    """The stage as a task builds it; nothing it is given is used here."""
    if stage == "extract":
        return ExtractSpec(pool=None, max_bytes=1)  # type: ignore[arg-type]
    if stage == "chunk":
        return ChunkSpec(config=CONFIG, connect=None)  # type: ignore[arg-type]
    return EmbedSpec(
        provider=None,  # type: ignore[arg-type]
        model="m",
        chunker_key=CONFIG.key,
        connect=None,  # type: ignore[arg-type]
        budget=None,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("deployed", [None, "extract", "chunk", "embed"])
@pytest.mark.parametrize("stage", ["extract", "chunk", "embed"])
def test_a_built_stage_carries_the_versions_the_planner_reads(monkeypatch, stage, deployed):
    packages = {"extract": extract, "chunk": chunk, "embed": embed}
    if deployed:
        monkeypatch.setattr(packages[deployed], "VERSION", "9.9")
    assert spec_hash(built(stage)) == spec_hashes(CONFIG, "m", None)[stage]
