"""B5, provider saturation: the embed stage keeps the provider's whole budget busy.

The local model server answers every request after 100 ms and refuses (429) any request
beyond C = 4 in flight at once. The embed stage runs over synthetic documents with
``max_in_flight`` = C; its throughput in requests per second is compared with C / latency,
the most any client could get, and with a plain client that keeps C requests open (measured
in the same run, so the server's own overhead counts against both). The pipeline must cause
no 429 at all: its shared budget never lets a (C+1)-th request out.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from harness import (
    BenchError,
    Row,
    Samples,
    StatementCounter,
    Target,
    refusals_row,
    seed_documents,
    services,
    timed,
    truncate,
)

from replayable import db
from replayable.budget import RequestBudget
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
DOCS = 600
SENTENCES = 60
PER_CALL = 32
REPEATS = 3
TARGET = Target("≥ 0.8", at_least=0.8)
# What an embed run writes; emptied before each repeat so that every repeat pays in full.
EMBED_TABLES = (
    "model_call_items",
    "model_call_counts",
    "model_calls",
    "embeddings",
    "stage_counts",
    "stage_runs",
    "dead_letters",
    "dead_letter_counts",
)


def _raw(base_url: str, inputs: list[list[str]], *, run: int = 0) -> float:
    """Seconds for a plain client to send one request per list of ``inputs``, C at a time.

    It sends the texts the pipeline sends, PER_CALL to a request, so that the server's own
    work on them (it hashes every word after the latency) counts against both sides alike.
    """
    with httpx.Client(base_url=base_url, trust_env=False, timeout=30) as http:

        def one(i: int) -> None:
            body = {"model": "m", "input": inputs[i]}
            http.post("/embeddings", json=body, headers={"Idempotency-Key": f"raw-{run}-{i}"})

        with ThreadPoolExecutor(C) as pool:
            seconds, _ = timed(lambda: list(pool.map(one, range(len(inputs)))))
    return seconds


def _chunk_texts(dsn: str) -> list[list[str]]:
    """The chunks' texts, PER_CALL to a request, as the pipeline packs them (by chunk id)."""
    conn = db.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT text FROM replayable.chunks ORDER BY chunk_id")
            texts = [str(row[0]) for row in cur.fetchall()]
    finally:
        conn.close()
    return [texts[i : i + PER_CALL] for i in range(0, len(texts), PER_CALL)]


def run(repeats: int = REPEATS, docs: int = DOCS) -> tuple[list[Row], dict[str, Any]]:
    settings = PipelineSettings()
    pipeline: list[float] = []
    raw: list[float] = []
    ideal: list[float] = []
    rejected: list[float] = []
    peaks: list[int] = []
    with services() as svc:
        doc_ids = seed_documents(svc.dsn, docs, SENTENCES, extractor_version=extract.extractor_id())
        counter = StatementCounter(svc.dsn)
        run_batch(
            ChunkSpec(config=chunk_config_of(settings), connect=counter.database),
            doc_ids,
            connect=counter.database,
            ctx=RunContext(owner="bench", run_id="chunk"),
        )
        inputs = _chunk_texts(svc.dsn)
        client = HttpEmbeddingClient(base_url=svc.model.base_url, model="m", max_connections=C)
        try:
            for r in range(repeats):
                truncate(svc.dsn, EMBED_TABLES)
                svc.model.set_faults(latency_ms=LATENCY_MS, max_concurrency=C)
                svc.model.reset_stats()
                spec = EmbedSpec(
                    provider=client,
                    model="m",
                    chunker_key=chunk_config_of(settings).key,
                    connect=counter.database,
                    budget=RequestBudget(svc.model.base_url, C),
                    inputs_per_call=PER_CALL,
                    max_in_flight=C,
                )
                seconds, result = timed(
                    lambda r=r, spec=spec: run_batch(
                        spec,
                        doc_ids,
                        connect=counter.database,
                        ctx=RunContext(owner="bench", run_id=f"embed-{r}"),
                    )
                )
                stats = svc.model.stats()
                if len(result.done) != len(doc_ids):
                    raise BenchError(f"embed: {len(result.done)} of {len(doc_ids)} done")
                requests = stats["requests"]
                pipeline.append(seconds / requests)
                ideal.append(LATENCY_MS / 1000 / C)
                rejected.append(stats["rejected_concurrency"])
                peaks.append(stats["peak_in_flight"])
                svc.model.reset_stats()
                raw.append(_raw(svc.model.base_url, inputs, run=r) / len(inputs))
        finally:
            client.close()
            svc.model.clear_faults()
    # Seconds per request, so the ratio ideal / pipeline is throughput / (C / latency).
    rows = [
        Row(
            "B5",
            f"provider saturation: throughput / (C / latency), C={C}, {LATENCY_MS} ms",
            "pipeline, s/request",
            Samples(tuple(pipeline)),
            "C / latency, s/request",
            Samples(tuple(ideal)),
            TARGET,
            notes=["ratio = pipeline throughput / (C / latency) (higher is better)"],
        ),
        Row(
            "B5.raw",
            "provider saturation: throughput / a plain client keeping C open",
            "pipeline, s/request",
            Samples(tuple(pipeline)),
            "plain client, s/request",
            Samples(tuple(raw)),
            notes=["ratio = pipeline throughput / plain-client throughput"],
        ),
        refusals_row(
            "B5.429", "provider saturation: 429s the pipeline caused", "pipeline", rejected
        ),
    ]
    details = {
        "documents": docs,
        "c": C,
        "latency_ms": LATENCY_MS,
        "inputs_per_call": PER_CALL,
        "peak_in_flight": peaks,
        "requests_per_run": requests,
    }
    return rows, details
