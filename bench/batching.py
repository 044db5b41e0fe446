"""Batching: one embeddings request per chunk vs. up to 32 chunks per request.

The same chunks are embedded from a clean embed state twice per repeat, once with
``inputs_per_call=1`` (the baseline) and once with 32, alternating so that drift on a
shared machine hits both alike. The local model server adds 20 ms per request, standing in
for a real provider's round trip. Items are documents and a request never spans two, so
documents here are long (about 40 chunks each) as a multi-page report would be.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from harness import BenchError, Row, Samples, count_rows, seed_documents, services, timed, truncate

from replayable import db
from replayable.ledger import RunContext
from replayable.runner import run_batch
from replayable.settings import PipelineSettings
from replayable.specs import ChunkSpec, EmbedSpec
from replayable.stages import extract
from replayable.stages.embed import HttpEmbeddingClient

DOCS = 10
SENTENCES = 300  # about 28 kB of text: 41 chunks per document at the default 800/100
LATENCY_MS = 20
REPEATS = 3
PER_CALL = (1, 32)
# Embed state only: the chunks stay, so both settings embed exactly the same ones.
EMBED_TABLES = ("model_calls", "embeddings", "dead_letters", "stage_runs")


def run(repeats: int = REPEATS) -> tuple[list[Row], dict[str, Any]]:
    """Embed the same chunks with 1 and with 32 inputs per call."""
    settings = PipelineSettings()
    chunk_config = settings.chunk_config
    times: dict[int, list[float]] = {n: [] for n in PER_CALL}
    requests: dict[int, list[float]] = {n: [] for n in PER_CALL}
    with services() as svc:
        doc_ids = seed_documents(svc.dsn, DOCS, SENTENCES, extractor_version=extract.VERSION)

        def connect() -> db.Connection:
            return db.connect(svc.dsn)

        chunked = run_batch(
            ChunkSpec(config=chunk_config), doc_ids, connect=connect, ctx=RunContext("bench")
        )
        if len(chunked.done) != DOCS:
            raise BenchError(f"chunking the batching corpus failed: {chunked.summary()}")
        chunks = count_rows(svc.dsn, "chunks")
        svc.model.set_faults(latency_ms=LATENCY_MS)
        client = HttpEmbeddingClient(base_url=svc.model.base_url, model=settings.model)
        try:
            for r in range(repeats):
                for per_call in PER_CALL:
                    truncate(svc.dsn, EMBED_TABLES)
                    svc.model.reset_stats()
                    spec = EmbedSpec(
                        provider=client,
                        model=settings.model,
                        chunker_key=chunk_config.key,
                        inputs_per_call=per_call,
                    )
                    ctx = RunContext("bench", run_id=f"r{r}-{per_call}")
                    seconds, result = timed(
                        partial(run_batch, spec, doc_ids, connect=connect, ctx=ctx)
                    )
                    embedded = count_rows(svc.dsn, "embeddings")
                    if len(result.done) != DOCS or embedded != chunks:
                        raise BenchError(
                            f"inputs_per_call={per_call}: {len(result.done)}/{DOCS} done, "
                            f"{embedded}/{chunks} chunks embedded"
                        )
                    times[per_call].append(seconds)
                    requests[per_call].append(svc.model.stats()["requests"])
        finally:
            client.close()

    one, many = PER_CALL
    rows = [
        Row(
            f"batching: embed time ({chunks} chunks)",
            f"{one} input/call",
            Samples(tuple(times[one])),
            f"{many} inputs/call",
            Samples(tuple(times[many])),
        ),
        Row(
            "batching: HTTP requests made",
            f"{one} input/call",
            Samples(tuple(requests[one]), unit="requests"),
            f"{many} inputs/call",
            Samples(tuple(requests[many]), unit="requests"),
        ),
    ]
    details: dict[str, Any] = {
        "documents": DOCS,
        "chunks": chunks,
        "latency_ms": LATENCY_MS,
        "notes": [
            f"{DOCS} documents, {chunks} chunks, {LATENCY_MS} ms injected latency per request; "
            "every chunk embedded once in every run (checked)",
        ],
    }
    return rows, details
