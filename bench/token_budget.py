"""B11, tokens per minute: the embed stage spends the provider's token budget, and no more.

The local model server answers every request after 100 ms and refuses (429) a request that
would take it past ``max_tpm`` tokens a minute (a token bucket of ``WINDOW_S`` seconds'
worth, refilled every moment). The embed stage runs over synthetic documents with the same
``max_tpm`` in its budget, which it spends on estimates before each send and corrects from
each response's ``usage``. The figure is the tokens a minute the provider charged over the
run, against ``max_tpm``; the pipeline must cause no 429 at all. Without the budget the
same run sends far faster than the limit (B11.unbudgeted counts the 429s it causes).
"""

from __future__ import annotations

from typing import Any

from harness import (
    BenchError,
    Row,
    Samples,
    Target,
    refusals_row,
    seed_documents,
    services,
    timed,
    truncate,
)
from saturation import EMBED_TABLES

from replayable.budget import RequestBudget
from replayable.db import Database
from replayable.ledger import RunContext
from replayable.models.embeddings import HttpEmbeddingClient
from replayable.runner import run_batch
from replayable.settings import PipelineSettings
from replayable.stages import extract
from replayable.stages.chunk.chunker import chunk_config_of
from replayable.stages.chunk.spec import ChunkSpec
from replayable.stages.embed.spec import EmbedSpec

C = 4
LATENCY_MS = 100
DOCS = 300
SENTENCES = 60
PER_CALL = 32
# About 15 s of tokens for the documents above; the provider's bucket holds 5 s of them.
MAX_TPM = 600_000
WINDOW_S = 5
REPEATS = 2
TARGET = Target("≥ 0.9", at_least=0.9)


def _embed(svc: Any, doc_ids: list[str], chunk_key: str, max_tpm: float | None, run: str) -> Any:
    truncate(svc.dsn, EMBED_TABLES)
    svc.model.set_faults(latency_ms=LATENCY_MS, max_tpm=MAX_TPM, tpm_window_s=WINDOW_S)
    svc.model.reset_stats()
    client = HttpEmbeddingClient(base_url=svc.model.base_url, model="m", max_connections=C)
    budget = RequestBudget(
        svc.model.base_url, C, max_tpm=max_tpm, connect=lambda: Database(svc.dsn)
    )
    spec = EmbedSpec(
        provider=client,
        model="m",
        chunker_key=chunk_key,
        connect=lambda: Database(svc.dsn),
        budget=budget,
        inputs_per_call=PER_CALL,
        max_in_flight=C,
    )
    try:
        seconds, result = timed(
            lambda: run_batch(
                spec,
                doc_ids,
                connect=lambda: Database(svc.dsn),
                ctx=RunContext(owner="bench", run_id=run),
            )
        )
    finally:
        budget.close()
        client.close()
    stats = svc.model.stats()
    return seconds, result, stats


def run(repeats: int = REPEATS, docs: int = DOCS) -> tuple[list[Row], dict[str, Any]]:
    settings = PipelineSettings()
    achieved: list[float] = []
    rejected: list[float] = []
    unbudgeted: list[float] = []
    with services() as svc:
        doc_ids = seed_documents(svc.dsn, docs, SENTENCES, extractor_version=extract.extractor_id())
        run_batch(
            ChunkSpec(config=chunk_config_of(settings), connect=lambda: Database(svc.dsn)),
            doc_ids,
            connect=lambda: Database(svc.dsn),
            ctx=RunContext(owner="bench", run_id="chunk"),
        )
        key = chunk_config_of(settings).key
        try:
            for r in range(repeats):
                seconds, result, stats = _embed(svc, doc_ids, key, MAX_TPM, f"tpm-{r}")
                if len(result.done) != len(doc_ids):
                    raise BenchError(f"embed: {len(result.done)} of {len(doc_ids)} done")
                achieved.append(stats["tokens_charged"] / seconds * 60)
                rejected.append(stats["rejected_tpm"])
            # The same run without max_tpm in the budget: the limit binds, at the provider.
            _, _, stats = _embed(svc, doc_ids, key, None, "no-tpm")
            unbudgeted.append(stats["rejected_tpm"])
        finally:
            svc.model.clear_faults()
    rows = [
        Row(
            "B11",
            f"tokens per minute achieved / max_tpm ({MAX_TPM:,}), {LATENCY_MS} ms, C={C}",
            "max_tpm",
            Samples((float(MAX_TPM),) * len(achieved), unit="tokens/min"),
            "charged by the provider, tokens/min",
            Samples(tuple(achieved), unit="tokens/min"),
            TARGET,
            notes=["ratio = tokens a minute the provider charged / max_tpm (higher is better)"],
        ),
        refusals_row(
            "B11.429", "tokens per minute: 429s the pipeline caused", "pipeline", rejected
        ),
        refusals_row(
            "B11.unbudgeted",
            "tokens per minute: 429s the same run causes without max_tpm in its budget",
            "without the budget",
            unbudgeted,
            target=None,
            notes=["context: the provider's limit binds this workload"],
        ),
    ]
    details = {
        "documents": docs,
        "c": C,
        "latency_ms": LATENCY_MS,
        "max_tpm": MAX_TPM,
        "window_s": WINDOW_S,
        "inputs_per_call": PER_CALL,
    }
    return rows, details
