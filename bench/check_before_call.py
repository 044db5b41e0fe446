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
    BenchError,
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

from replayable.budget import RequestBudget
from replayable.ledger import RunContext
from replayable.models.embeddings import HttpEmbeddingClient
from replayable.runner import BatchResult, StageSpec, run_batch
from replayable.settings import DEFAULT_MAX_IN_FLIGHT, DEFAULT_MODEL, PipelineSettings
from replayable.stages import extract
from replayable.stages.chunk.chunker import chunk_config_of
from replayable.stages.chunk.spec import ChunkSpec
from replayable.stages.embed.spec import EmbedSpec

MODEL = DEFAULT_MODEL
DOCS = 200
SENTENCES = 60  # about 5.6 kB of text: 8 chunks per document at the default 800/100
SMALL_BATCH = 20
LATENCY_MS = 20
REPEATS = 5
EMBED_TARGET = Target("≤ 0.10", at_most=0.10)
NO_CALLS = Target("= 0 calls", equals=0)


def _run(
    spec: StageSpec, doc_ids: Sequence[str], counter: StatementCounter, run_id: str
) -> tuple[float, BatchResult, int]:
    """Time one ``run_batch``; return (seconds, result, statements sent)."""
    counter.reset()
    seconds, result = timed(
        lambda: run_batch(
            spec,
            doc_ids,
            connect=counter.database,
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


def run(repeats: int = REPEATS, docs: int = DOCS) -> tuple[list[Row], dict[str, Any]]:
    """Measure first runs and re-runs of the chunk and embed stages."""
    settings = PipelineSettings()
    chunk_config = chunk_config_of(settings)
    runs = [(stage, which) for stage in ("chunk", "embed") for which in ("first", "rerun")]
    times: dict[tuple[str, str], list[float]] = {run: [] for run in runs}
    calls: dict[str, list[float]] = {"first": [], "rerun": []}
    statements: dict[tuple[str, str], int] = {}
    with services() as svc:
        svc.model.set_faults(latency_ms=LATENCY_MS)
        doc_ids = seed_documents(svc.dsn, docs, SENTENCES, extractor_version=extract.extractor_id())
        counter = StatementCounter(svc.dsn)
        client = HttpEmbeddingClient(base_url=svc.model.base_url, model=MODEL)
        specs: dict[str, StageSpec] = {
            "chunk": ChunkSpec(config=chunk_config, connect=counter.database),
            "embed": EmbedSpec(
                provider=client,
                model=MODEL,
                chunker_key=chunk_config.key,
                connect=counter.database,
                budget=RequestBudget(svc.model.base_url, DEFAULT_MAX_IN_FLIGHT),
                inputs_per_call=settings.embed_inputs_per_call,
                max_in_flight=DEFAULT_MAX_IN_FLIGHT,
            ),
        }
        try:
            for r in range(repeats):
                truncate(svc.dsn, STAGE_TABLES)
                for stage, which in runs:
                    svc.model.reset_stats()
                    seconds, result, sent = _run(specs[stage], doc_ids, counter, f"{r}-{which}")
                    _expect(result, doc_ids, processed=docs if which == "first" else 0)
                    times[stage, which].append(seconds)
                    statements[stage, which] = sent
                    if stage == "embed":
                        calls[which].append(svc.model.stats()["requests"])
            # Every item is done now: count what re-runs of a small and the full batch send.
            small = _run(specs["embed"], doc_ids[:SMALL_BATCH], counter, "count-small")[2]
            large = _run(specs["embed"], doc_ids, counter, "count-large")[2]
            server_counted = _server_count(svc, specs["embed"], doc_ids)
            chunks = count_rows(svc.dsn, "chunks")
        finally:
            client.close()

    t = {run: Samples(tuple(v)) for run, v in times.items()}
    c = {which: Samples(tuple(v), unit="calls") for which, v in calls.items()}
    rows = [
        Row(
            "B2.chunk",
            f"chunk: re-run vs first run ({docs} docs)",
            "first run",
            t["chunk", "first"],
            "re-run",
            t["chunk", "rerun"],
        ),
        Row(
            "B2",
            f"embed: re-run vs first run ({docs} docs)",
            "first run",
            t["embed", "first"],
            "re-run",
            t["embed", "rerun"],
            EMBED_TARGET,
        ),
        Row(
            "B2.calls",
            "embed: model calls on re-run",
            "first run",
            c["first"],
            "re-run",
            c["rerun"],
            NO_CALLS,
            target_on="measured",
        ),
        Row(
            "B2.stmts",
            "embed: statements per re-run batch",
            f"{SMALL_BATCH} docs",
            Samples((small,), unit="stmts"),
            f"{docs} docs",
            Samples((large,), unit="stmts"),
            notes=["O(1) per batch: a ratio of 1.00 means the count does not grow with the batch"],
        ),
    ]
    details: dict[str, Any] = {
        "documents": docs,
        "chunks": chunks,
        "latency_ms": LATENCY_MS,
        "inputs_per_call": settings.embed_inputs_per_call,
        "statements_last_repeat": {f"{st}_{w}": n for (st, w), n in statements.items()},
        "rerun_statements": {f"{SMALL_BATCH}_docs": small, f"{docs}_docs": large},
        "pg_stat_statements": server_counted,
        "notes": [
            f"{docs} documents, {chunks} chunks; embed: {settings.embed_inputs_per_call} inputs "
            f"per call, {LATENCY_MS} ms injected latency per call",
            "items processed on re-run: 0 for both stages (checked)",
            "statements sent (last repeat): "
            + "; ".join(f"{st} {w} {n}" for (st, w), n in statements.items()),
            (
                f"pg_stat_statements: {server_counted} statements on a {docs}-doc re-run"
                if isinstance(server_counted, int)
                else f"pg_stat_statements {server_counted}; statements are counted client-side "
                "instead: each cursor.execute on run_batch's connections is one"
            ),
        ],
    }
    return rows, details


def _server_count(svc: Services, spec: StageSpec, doc_ids: Sequence[str]) -> int | str:
    """Statements of a full re-run per pg_stat_statements, or why they were not counted."""
    if not pg_stat_statements_available(svc.dsn):
        return "skipped: not available in the embedded Postgres (pgserver)"
    counter = StatementCounter(svc.dsn)
    return server_statement_count(svc.dsn, lambda: _run(spec, doc_ids, counter, "count-server"))
