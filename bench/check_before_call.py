"""Check before call: re-running a batch that is done costs a few queries and no model calls.

For the chunk and the embed stage, a first run over ~200 synthetic documents (the baseline)
is compared with a re-run of the same batch. The embed stage talks to the local model
server with 20 ms of latency per request, standing in for a real provider. The number of
statements a re-run sends is compared between a small and a large batch: it should not
grow with the batch (invariant 2: one check per batch, not per row).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness import (
    STAGE_TABLES,
    Row,
    Samples,
    Services,
    StatementCounter,
    Target,
    count_rows,
    pg_stat_statements_available,
    seed_documents,
    server_statement_count,
    services,
    timed,
    truncate,
)

from replayable.ledger import RunContext
from replayable.runner import BatchResult, StageSpec, run_batch
from replayable.settings import PipelineSettings
from replayable.specs import ChunkSpec, EmbedSpec
from replayable.stages import extract
from replayable.stages.embed import HttpEmbeddingClient

DOCS = 200
SENTENCES = 60  # about 5.6 kB of text: 8 chunks per document at the default 800/100
SMALL_BATCH = 20
LATENCY_MS = 20
REPEATS = 5
EMBED_TARGET = Target("≤ 0.10", at_most=0.10)
NO_CALLS = Target("= 0 calls", equals=0)


class BenchError(RuntimeError):
    """The benchmark's own precondition failed: its figures would mean nothing."""


def _run(
    spec: StageSpec, doc_ids: Sequence[str], counter: StatementCounter, run_id: str
) -> tuple[float, BatchResult, int]:
    """Time one ``run_batch``; return (seconds, result, statements sent)."""
    counter.reset()
    seconds, result = timed(
        lambda: run_batch(
            spec,
            doc_ids,
            connect=counter.connect,
            ctx=RunContext(owner="bench", run_id=run_id),
        )
    )
    return seconds, result, counter.statements


def _expect(result: BatchResult, doc_ids: Sequence[str], *, processed: int) -> None:
    if sorted(result.done) != sorted(doc_ids) or result.processed != processed:
        raise BenchError(
            f"{result.stage}: expected all {len(doc_ids)} documents done with {processed} "
            f"processed, got {len(result.done)} done, {result.processed} processed, "
            f"failed={result.failed[:3]} dead={result.dead[:3]}"
        )


def run(repeats: int = REPEATS) -> tuple[list[Row], dict[str, Any]]:
    """Measure first runs and re-runs of the chunk and embed stages."""
    settings = PipelineSettings()
    chunk_config = settings.chunk_config
    times: dict[str, list[float]] = {k: [] for k in ("chunk1", "chunk2", "embed1", "embed2")}
    calls: dict[str, list[float]] = {"embed1": [], "embed2": []}
    statements: dict[str, int] = {}
    with services() as svc:
        svc.model.set_faults(latency_ms=LATENCY_MS)
        doc_ids = seed_documents(svc.dsn, DOCS, SENTENCES, extractor_version=extract.VERSION)
        counter = StatementCounter(svc.dsn)
        client = HttpEmbeddingClient(base_url=svc.model.base_url, model=settings.model)
        chunk_spec = ChunkSpec(config=chunk_config)
        embed_spec = EmbedSpec(
            provider=client,
            model=settings.model,
            chunker_key=chunk_config.key,
            inputs_per_call=settings.embed_inputs_per_call,
        )
        try:
            for r in range(repeats):
                truncate(svc.dsn, STAGE_TABLES)
                for stage, spec in (("chunk", chunk_spec), ("embed", embed_spec)):
                    for attempt in (1, 2):
                        svc.model.reset_stats()
                        seconds, result, sent = _run(spec, doc_ids, counter, f"r{r}-{attempt}")
                        _expect(result, doc_ids, processed=DOCS if attempt == 1 else 0)
                        times[f"{stage}{attempt}"].append(seconds)
                        statements[f"{stage}{attempt}"] = sent
                        if stage == "embed":
                            calls[f"embed{attempt}"].append(svc.model.stats()["requests"])
            # Every item is done now: re-runs of a small and the full batch, counted.
            small = _run(embed_spec, doc_ids[:SMALL_BATCH], counter, "count-small")[2]
            large = _run(embed_spec, doc_ids, counter, "count-large")[2]
            server_counted = _server_count(svc, embed_spec, doc_ids)
            chunks = count_rows(svc.dsn, "chunks")
        finally:
            client.close()

    t = {k: Samples(tuple(v)) for k, v in times.items()}
    c = {k: Samples(tuple(v), unit="calls") for k, v in calls.items()}
    rows = [
        Row(
            f"check-before-call: chunk re-run ({DOCS} docs)",
            "first run",
            t["chunk1"],
            "re-run",
            t["chunk2"],
        ),
        Row(
            f"check-before-call: embed re-run ({DOCS} docs, {LATENCY_MS} ms/call)",
            "first run",
            t["embed1"],
            "re-run",
            t["embed2"],
            EMBED_TARGET,
        ),
        Row(
            "check-before-call: model calls on embed re-run",
            "first run",
            c["embed1"],
            "re-run",
            c["embed2"],
            NO_CALLS,
            target_on="measured",
        ),
        Row(
            "check-before-call: statements per re-run batch (client-side count)",
            f"{SMALL_BATCH} docs",
            Samples((small,), unit="stmts"),
            f"{DOCS} docs",
            Samples((large,), unit="stmts"),
            notes=["O(1) per batch: a ratio of 1.00 means the count does not grow with the batch"],
        ),
    ]
    details: dict[str, Any] = {
        "documents": DOCS,
        "chunks": chunks,
        "latency_ms": LATENCY_MS,
        "inputs_per_call": settings.embed_inputs_per_call,
        "statements_last_repeat": statements,
        "rerun_statements": {f"{SMALL_BATCH}_docs": small, f"{DOCS}_docs": large},
        "pg_stat_statements": server_counted,
        "notes": [
            f"{DOCS} documents, {chunks} chunks; embed: {settings.embed_inputs_per_call} inputs "
            f"per call, {LATENCY_MS} ms injected latency per call",
            "items processed on re-run: 0 for both stages (checked)",
            f"statements sent, last repeat: {statements}",
            (
                f"pg_stat_statements: {server_counted} statements on a {DOCS}-doc re-run"
                if isinstance(server_counted, int)
                else f"pg_stat_statements {server_counted}; statements counted client-side "
                "instead (each cursor.execute of run_batch's connections is one)"
            ),
        ],
    }
    return rows, details


def _server_count(svc: Services, spec: EmbedSpec, doc_ids: Sequence[str]) -> int | str:
    """Statements of a full re-run per pg_stat_statements, or why they were not counted."""
    if not pg_stat_statements_available(svc.dsn):
        return "skipped: not available in the embedded Postgres (pgserver)"
    counter = StatementCounter(svc.dsn)
    return server_statement_count(svc.dsn, lambda: _run(spec, doc_ids, counter, "count-server"))
