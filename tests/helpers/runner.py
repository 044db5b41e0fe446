"""Running stages in tests: documents to run them on, the embed stage against the local model
server, and what its provider charged."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from checks import rows, seed_extraction
from replayable import db
from replayable.budget import RequestBudget
from replayable.keys import sha256_bytes
from replayable.ledger import RunContext
from replayable.models.embeddings import HttpEmbeddingClient
from replayable.retry import CallRetry
from replayable.runner import Limits, StageSpec, WorkItem, run_batch
from replayable.stages.chunk.chunker import ChunkConfig
from replayable.stages.embed.spec import EmbedSpec

CHUNKS = ChunkConfig(size=200, overlap=20)
FAST = CallRetry(max_attempts=8, base_s=0.01, cap_s=0.05, max_total_s=30)
BOILERPLATE = " ".join(f"Standard terms clause {j} applies to every shipment." for j in range(12))


def seed_documents(conn, n: int, *, shared: str = "", tag: str = "doc") -> list[str]:
    """Documents with extracted text, as the extract stage would leave them."""
    ids = []
    for i in range(n):
        body = " ".join(f"{tag}{i} sentence {j} about topic {j % 7}." for j in range(60))
        text = f"{body} {shared}".strip()
        doc_id = sha256_bytes(text.encode())
        seed_extraction(conn, doc_id, f"/docs/{tag}{i}.pdf", text)
        ids.append(doc_id)
    conn.commit()
    return sorted(ids)


def count(conn, sql: str, *params) -> int:
    with conn.cursor() as cur:
        cur.execute(sql, params)
        value = cur.fetchone()[0]
    conn.commit()
    return int(value or 0)


def wait_for(condition, timeout_s: float = 60.0, every_s: float = 0.05):
    """Poll ``condition`` until it returns something true; return that, or fail at the deadline.

    The deadline turns a hang into a failure (ADR 0128): it is many times what a loaded
    machine takes, never a bound on how fast the code under test is.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(every_s)
    pytest.fail(f"gave up waiting for {condition.__name__}")


def connect_to(dsn):
    return lambda: db.Database(dsn, outage_s=30)


def embed_spec(
    base_url: str, dsn: str, *, in_flight: int = 4, per_call: int = 8, rps: float | None = None
) -> EmbedSpec:
    client = HttpEmbeddingClient(base_url=base_url, model="m", retry=FAST, timeout_s=10)
    return EmbedSpec(
        provider=client,
        model="m",
        chunker_key=CHUNKS.key,
        connect=connect_to(dsn),
        budget=RequestBudget(base_url, in_flight, max_rps=rps, connect=connect_to(dsn)),
        inputs_per_call=per_call,
        max_in_flight=in_flight,
        peer_poll_s=0.05,
    )


def run(spec, dsn, doc_ids, owner="w1", **limits):
    return run_batch(
        spec,
        doc_ids,
        connect=connect_to(dsn),
        ctx=RunContext(owner=owner, run_id="run-1"),
        limits=Limits(**limits),
    )


def paid_once(model, conn) -> None:
    """At the provider, every distinct chunk text was charged exactly once."""
    stats = model.stats()
    assert set(stats["input_success_counts"].values()) == {1}
    assert stats["inputs_embedded"] == count(conn, "SELECT count(*) FROM replayable.chunks")


def chunk_digests(conn, doc_ids) -> set[str]:
    """sha256 of the text of every chunk of ``doc_ids``: how the provider counts its inputs."""
    found = rows(
        conn,
        "SELECT DISTINCT c.text FROM replayable.doc_chunks d"
        " JOIN replayable.chunks c USING (chunk_id) WHERE d.doc_id = ANY(%s)",
        list(doc_ids),
    )
    return {sha256_bytes(text.encode()) for (text,) in found}


def sent_per_chunk(server) -> dict[str, int]:
    """Requests that carried each chunk, as the provider counted them.

    The provider counts inputs by text only when it charges them, so these are all the
    requests only when every request was charged: nothing failed, nothing was replayed.
    """
    stats = server.stats()
    assert stats["requests"] == stats["succeeded"] == stats["charged"], stats
    return dict(stats["input_success_counts"])


class ItemPerDocument(StageSpec):
    """A stage of one item per document, keyed ``{item_prefix}-{doc_id}``, with no
    configuration and no input: a test's stage writes only its ``process``."""

    name = "slow"
    code_version = "1"
    item_prefix = "slow"

    def key_config(self):
        return {}

    def lineage(self):
        return {}

    def plan(self, conn, doc_ids):
        return [WorkItem(doc_id, f"{self.item_prefix}-{doc_id}") for doc_id in doc_ids]


def on_workers(worker: Callable[[Any, int], None], parts: Sequence[Any]) -> None:
    """Run ``worker(part, n)`` for each part on a thread of its own, all at once; wait for
    them all (a give-up of two minutes each)."""
    threads = [threading.Thread(target=worker, args=(p, n)) for n, p in enumerate(parts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
