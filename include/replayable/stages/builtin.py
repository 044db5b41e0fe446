"""The stages Replayable ships, as :class:`~replayable.stage.Stage` definitions.

``extract`` reads the document, ``chunk`` and ``summarize`` read the extracted text, and
``embed`` reads the chunks. Their spec hashes are the lineage of
:mod:`replayable.stages.lineage`, so that a ledger written before stages were definitions
keeps its keys. Each one builds its spec at task time from the run's settings; the model
stages build their clients from the model connection the operator reads, and share its budget.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from replayable.models import clients
from replayable.stage import BuildContext, Models, Pipeline, Stage
from replayable.stages import lineage
from replayable.stages.chunk.chunker import chunk_config_of
from replayable.stages.summarize.config import summary_config_of
from replayable.vocabulary import DEFAULT_STAGES, PIPELINE_DAG_ID

if TYPE_CHECKING:
    from replayable.budget import RequestBudget
    from replayable.models.choice import ModelChoice
    from replayable.models.endpoint import ModelSettings
    from replayable.runner import StageSpec
    from replayable.settings import PipelineSettings

# Added to the longest healthy call before a request's transaction counts as abandoned, for a
# worker that is only slow (short of CPU, pausing for garbage collection).
CALL_SLACK_S = 30.0


class _PackageVersion:
    """A shipped stage's code version: its package's ``VERSION``, read each time it is asked
    for, as the planner and the specs read it (ADR 0102)."""

    def __init__(self, package: str) -> None:
        self.package = package

    def __get__(self, instance: object, owner: type | None = None) -> str:
        return str(importlib.import_module(f"replayable.stages.{self.package}").VERSION)


class ExtractStage(Stage):
    """Text from each document's PDF, read in a guarded worker process (ADR 0103)."""

    name = "extract"
    reads = None
    last = False  # its spec never announces: a later stage does

    version = _PackageVersion("extract")

    def spec_hash(
        self, settings: PipelineSettings, models: Models, hashes: Mapping[str, str]
    ) -> str:
        return lineage.extract_hash(settings.extractor)

    def build(self, ctx: BuildContext) -> StageSpec:
        # Imported here: PDFium, pypdf and the process pool are task-time needs.
        from replayable import config, guards, sources
        from replayable.stages.extract.spec import ExtractSpec

        settings = ctx.settings
        workers = lineage.default_workers(ctx.documents)
        if config.queue_for_cores():
            # Before any claim, so that no lease is held while the batch waits (ADR 0123).
            ctx.stack.enter_context(guards.machine_cores(workers))
        pool = ctx.stack.enter_context(
            guards.GuardedPool(
                timeout_s=settings.item_timeout_s,
                memory_mb=settings.memory_mb,
                workers=workers,
            )
        )
        return ExtractSpec(
            pool=pool,
            max_bytes=settings.max_bytes,
            roots=sources.allowed_roots(),
            max_text_chars=settings.max_text_chars,
            engine=settings.extractor,
        )


class ChunkStage(Stage):
    """Each document's text in content-addressed chunks."""

    name = "chunk"
    reads = "extract"
    last = False  # its spec never announces: embed does

    version = _PackageVersion("chunk")

    def spec_hash(
        self, settings: PipelineSettings, models: Models, hashes: Mapping[str, str]
    ) -> str:
        return lineage.chunk_hash(chunk_config_of(settings), settings.extractor)

    def build(self, ctx: BuildContext) -> StageSpec:
        from replayable.stages.chunk.spec import ChunkSpec
        from replayable.stages.extract import extractor_id

        settings = ctx.settings
        return ChunkSpec(
            config=chunk_config_of(settings),
            extractor_version=extractor_id(settings.extractor),
            connect=ctx.connect,
            max_text_chars=settings.max_text_chars,
            max_chunks_per_doc=settings.max_chunks_per_doc,
        )


class EmbedStage(Stage):
    """A vector per chunk from the model connection's embeddings endpoint."""

    name = "embed"
    reads = "chunk"
    last = True

    version = _PackageVersion("embed")

    def spec_hash(
        self, settings: PipelineSettings, models: Models, hashes: Mapping[str, str]
    ) -> str:
        return lineage.embed_hash(
            models.embed, models.dimensions, chunk_config_of(settings), settings.extractor
        )

    def build(self, ctx: BuildContext) -> StageSpec:
        from replayable.stages.embed.spec import EmbedSpec
        from replayable.stages.extract import extractor_id

        settings = ctx.settings
        provider, choice, budget, retry = model_resources(ctx)
        client = clients.embedding_client(
            provider,
            model=choice.model,
            dimensions=choice.dimensions,
            max_in_flight=choice.max_in_flight,
            retry=retry,
        )
        ctx.stack.callback(client.close)
        # Sync mode too: it collects a provider batch that holds its chunks (ADR 0130).
        batches = clients.batch_api(provider, model=choice.model, retry=retry, budget=budget)
        ctx.stack.callback(batches.close)
        return EmbedSpec(
            provider=client,
            mode=settings.embed_mode,
            batches=batches,
            dag_id=ctx.dag_id,
            map_index=ctx.map_index,
            model=choice.model,
            chunker_key=chunk_config_of(settings).key,
            connect=ctx.connect,
            budget=budget,
            run_id=ctx.run_id,
            dimensions=choice.dimensions,
            extractor_version=extractor_id(settings.extractor),
            inputs_per_call=settings.embed_inputs_per_call,
            max_in_flight=choice.max_in_flight,
            max_call_s=max_call_s(choice, retry.max_total_s),
        )


class SummarizeStage(Stage):
    """A summary per document from the model connection's chat endpoint (ADR 0107)."""

    name = "summarize"
    reads = "extract"
    writes_artifacts = True

    version = _PackageVersion("summarize")

    def spec_hash(
        self, settings: PipelineSettings, models: Models, hashes: Mapping[str, str]
    ) -> str:
        return lineage.summary_hash(summary_config_of(settings, models.chat), settings.extractor)

    def build(self, ctx: BuildContext) -> StageSpec:
        from replayable.stages.extract import extractor_id
        from replayable.stages.summarize.spec import SummarizeSpec

        settings = ctx.settings
        provider, choice, budget, retry = model_resources(ctx)
        chat = clients.chat_client(
            provider,
            model=settings.summary_model,
            max_tokens=settings.summary_max_tokens,
            keep_truncated=settings.summary_keep_truncated,
            max_in_flight=choice.max_in_flight,
            retry=retry,
        )
        ctx.stack.callback(chat.close)
        return SummarizeSpec(
            provider=chat,
            config=summary_config_of(settings, chat.model),
            connect=ctx.connect,
            budget=budget,
            run_id=ctx.run_id,
            max_in_flight=choice.max_in_flight,
            extractor_version=extractor_id(settings.extractor),
            max_call_s=max_call_s(choice, retry.max_total_s),
            last_stage=bool(ctx.announces),
        )


def model_resources(
    ctx: BuildContext,
) -> tuple[ModelSettings, ModelChoice, RequestBudget, Any]:
    """The model connection's settings, the run's model choice, the shared budget and the
    retry bounds of one call, for a stage that calls the model provider.

    The slots and the rate every run shares are the connection's (ADR 0086); a run that
    asked for less sends with fewer threads and reserves its own rate as well. Every model
    stage draws on the one budget of the connection's provider.
    """
    from replayable.budget import RequestBudget
    from replayable.models.choice import model_choice
    from replayable.retry import CallRetry

    if ctx.model_provider is None:
        raise ValueError(
            f"model_provider: none was handed in to read the model connection "
            f"{ctx.model_conn_id!r} (the operator hands its hook's in)"
        )
    provider = ctx.model_provider()
    choice = model_choice(ctx.settings, provider)
    own_rps = choice.max_rps if choice.max_rps != choice.shared_rps else None
    budget = RequestBudget(
        choice.provider.base_url,
        choice.shared_in_flight,
        max_rps=choice.shared_rps,
        connect=ctx.connect,
        own_rps=own_rps,
        own_name=f"{choice.provider.base_url} run {ctx.run_id}",
        max_tpm=choice.provider.max_tpm,
    )
    ctx.stack.callback(budget.close)
    return provider, choice, budget, CallRetry()


def max_call_s(choice: ModelChoice, retries_s: float) -> float:
    """When a call has surely ended: its retries and waits, then one last request."""
    return retries_s + choice.provider.timeout_s + CALL_SLACK_S


EXTRACT = ExtractStage()
CHUNK = ChunkStage()
EMBED = EmbedStage()
SUMMARIZE = SummarizeStage()
# The stages of document_pipeline, in order (vocabulary.STAGES names them).
BUILTIN = (EXTRACT, CHUNK, EMBED, SUMMARIZE)


def document_pipeline(dag_id: str = PIPELINE_DAG_ID) -> Pipeline:
    """The shipped pipeline: extract, chunk, embed, and summarize when a run asks for it."""
    return Pipeline(dag_id, BUILTIN, default_stages=DEFAULT_STAGES)
