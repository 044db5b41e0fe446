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


def built(stage: str, engine: str | None = None) -> Any:
    """The stage as a task builds it (operators.py); nothing it is given is used here.

    Without ``engine``, each stage's defaults.
    """
    if stage == "extract":
        engines = {"engine": engine} if engine else {}
        return ExtractSpec(pool=None, max_bytes=1, **engines)  # type: ignore[arg-type]
    extractor = {"extractor_version": extract.extractor_id(engine)} if engine else {}
    if stage == "chunk":
        return ChunkSpec(config=CONFIG, connect=None, **extractor)  # type: ignore[arg-type]
    return EmbedSpec(
        provider=None,  # type: ignore[arg-type]
        model="m",
        chunker_key=CONFIG.key,
        connect=None,  # type: ignore[arg-type]
        budget=None,  # type: ignore[arg-type]
        **extractor,
    )


@pytest.mark.parametrize("deployed", [None, "extract", "chunk", "embed"])
@pytest.mark.parametrize("stage", ["extract", "chunk", "embed"])
def test_a_built_stage_carries_the_versions_the_planner_reads(monkeypatch, stage, deployed):
    packages = {"extract": extract, "chunk": chunk, "embed": embed}
    if deployed:
        monkeypatch.setattr(packages[deployed], "VERSION", "9.9")
    assert spec_hash(built(stage)) == spec_hashes(CONFIG, "m", None)[stage]


@pytest.mark.parametrize("engine", extract.ENGINES)
@pytest.mark.parametrize("stage", ["extract", "chunk", "embed"])
def test_a_stage_built_for_an_engine_policy_has_the_planners_hash_for_it(stage, engine):
    assert spec_hash(built(stage, engine)) == spec_hashes(CONFIG, "m", None, engine)[stage]


def test_each_engine_policy_keys_every_stage_apart():
    """Another policy re-extracts, and so names another extraction downstream (ADR 0103)."""
    by_engine = [spec_hashes(CONFIG, "m", None, engine) for engine in extract.ENGINES]
    for stage in ("extract", "chunk", "embed"):
        assert len({hashes[stage] for hashes in by_engine}) == len(extract.ENGINES)
    configs = [built("extract", engine).key_config() for engine in extract.ENGINES]
    assert [config["engine"] for config in configs] == list(extract.ENGINES)
