"""The embed stage as a :class:`~replayable.runner.StageSpec`: keys, input, and which mode runs.

An item is one document's chunks, keyed by the document and its chunk ids plus the embedder
version, model and dimensions; its outputs are ``embeddings`` rows, one per chunk, model and
dimensions (ADR 0151), shared by every document with that chunk, and a ``model_calls`` row
per billable request. The spec plans the items and hands a batch of them to a mode: sync
(:mod:`.sync`, requests through :class:`~replayable.models.embeddings.HttpEmbeddingClient`
or any :class:`~replayable.models.embeddings.EmbeddingProvider`) or batch (:mod:`.batch`,
the provider's Batch API). The modes read the spec as an
:class:`~replayable.stages.embed.config.EmbedConfig` and import nothing of it (ADR 0157).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from replayable.budget import RequestBudget
from replayable.db import Connection, Database, fetch_all
from replayable.keys import item_key
from replayable.knobs import EMBED_MODES
from replayable.models.batch_api import BatchApi
from replayable.models.embeddings import EmbeddingProvider
from replayable.retry import Classified, ErrorKind
from replayable.runner import BatchIO, StageSpec, WorkItem
from replayable.stages import embed, extract
from replayable.stages.embed.batch import BATCH_WAITING, BatchModeEmbed
from replayable.stages.embed.config import BatchLimits
from replayable.stages.embed.packing import MAX_TOKENS_PER_INPUT, MAX_TOKENS_PER_REQUEST
from replayable.stages.embed.sync import SyncModeEmbed
from replayable.stages.lineage import embed_lineage


@dataclass
class EmbedSpec(StageSpec):
    """Embed the batch's chunks that no document has embedded yet under this model.

    Chunks of all the batch's documents are packed into full requests (``inputs_per_call``
    and ``max_request_tokens``; a chunk past ``max_input_tokens`` fails its documents
    before anything is sent), and up to ``max_in_flight`` requests are open at once, within
    a budget every worker shares (:class:`~replayable.budget.RequestBudget`): requests,
    requests a second and tokens a minute. Each request's vectors and its call
    records are committed as soon as it returns, under advisory locks on its chunks that
    last only for that transaction, so a vector is never paid for twice and never lost to a
    later failure. A worker never waits while holding locks: chunks a peer holds are left
    for a later round. A request that a provider refuses as bad (a 4xx) is split by
    document, so that only the document with the bad input is dead-lettered (ADR 0129).

    Whatever the mode, a chunk that a provider batch not collected yet holds is never bought
    again (ADR 0130): in sync mode its documents are handed to a batch-mode pass, which
    collects that batch once it has ended, or are released to wait for it without spending
    an attempt.
    """

    # A document whose embed item is done is ready: it announces document.ready (ADR 0040).
    last_stage: ClassVar[bool] = True
    # Its items do no work in the task process that a document could blow up (chunk counts
    # are bounded upstream), and items taken over after a kill must be packed as before, so
    # that a replayed request carries the key of the one in flight at the kill (ADR 0084).
    start_takeovers_together: ClassVar[bool] = True

    provider: EmbeddingProvider
    model: str
    chunker_key: str
    connect: Callable[[], Database]
    budget: RequestBudget
    run_id: str | None = None
    dimensions: int | None = None
    inputs_per_call: int = 32
    max_in_flight: int = 4
    # Read when the stage is built, as the planner reads them (stages.lineage.spec_hashes).
    # The extraction it reads: code version and engine policy (extract.extractor_id).
    extractor_version: str = field(default_factory=extract.extractor_id)
    code_version: str = field(default_factory=lambda: embed.VERSION)
    name: str = "embed"
    wait_for_peer_s: float = 300.0
    peer_poll_s: float = 0.5
    systemic_after: int = 5
    # How long a request's transaction may sit idle (in the provider call, retries and waits
    # included) before Postgres ends its session; None: no limit. Set it above the longest
    # healthy call, so that only a worker frozen or gone mid-request (SIGSTOP, a host that
    # died without closing its socket) loses its chunk locks and budget slot to its peers.
    max_call_s: float | None = None
    # Sender threads, and so database sessions, this task opens at most: each request holds
    # its chunk locks in a transaction of its own session, so the two come together, but a
    # run that may keep many requests in flight does not open as many sessions (ADR 0086).
    max_sessions: int = 16
    # The provider's per-request limits, in estimated tokens (stages.embed.packing).
    max_request_tokens: int = MAX_TOKENS_PER_REQUEST
    max_input_tokens: int = MAX_TOKENS_PER_INPUT
    # "sync": a request per packed set of chunks, answered at once; "batch": the same
    # requests as lines of provider batch jobs, collected when they end (ADR 0117), through
    # ``batches`` (the Files and Batch API of the same endpoint), within ``batch_limits``.
    mode: str = "sync"
    batches: BatchApi | None = None
    batch_limits: BatchLimits = field(default_factory=BatchLimits)
    # Where a submission came from (recorded with it).
    dag_id: str | None = None
    map_index: int | None = None
    # Set by a batch-mode pass: the batches its released items wait for (the operator
    # defers the task on them).
    waiting_on: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model: an embedding model is required (a param or the connection)")
        if self.inputs_per_call < 1 or self.max_in_flight < 1 or self.max_sessions < 1:
            raise ValueError("inputs_per_call, max_in_flight and max_sessions must be at least 1")
        if self.mode not in EMBED_MODES:
            raise ValueError(f"embed_mode: must be one of {list(EMBED_MODES)}, got {self.mode!r}")
        if self.mode == "batch" and self.batches is None:
            raise ValueError("embed_mode batch needs the provider's Batch API (batches)")

    def key_config(self) -> dict[str, Any]:
        return embed.key_config(self.model, self.dimensions)

    @property
    def stored_dimensions(self) -> int:
        """The dimensions its vectors and claims are stored under (0: the model's own)."""
        return embed.stored_dimensions(self.dimensions)

    @property
    def request_tokens(self) -> int:
        """The most estimated tokens one request carries.

        Under a tokens-per-minute budget, a minute's tokens shared by the budget's slots (and
        at most half a minute's): every request in flight at once, across all workers, then
        fits the provider's minute, so none waits more than about a minute for its tokens
        while its transaction holds its chunks (``max_call_s``), and the rest of the minute
        leaves room for estimates that fall short until the responses correct them (ADR 0106).
        """
        tpm = self.budget.max_tpm
        if tpm is None:
            return self.max_request_tokens
        share = min(tpm / 2, tpm / self.budget.slots)
        return max(1, min(self.max_request_tokens, int(share)))

    def lineage(self) -> dict[str, Any]:
        return embed_lineage(self.model, self.dimensions, self.chunker_key, self.extractor_version)

    def plan(self, conn: Connection, doc_ids: Sequence[str]) -> list[WorkItem]:
        rows = fetch_all(
            conn,
            "stages/doc_chunks_for",
            {
                "doc_ids": list(doc_ids),
                "extractor_version": self.extractor_version,
                "chunker_key": self.chunker_key,
                "model": self.model,
                "dimensions": self.stored_dimensions,
            },
        )
        by_doc: dict[str, list[str]] = defaultdict(list)
        missing: set[str] = set()  # documents with a chunk that has no vector yet
        for row in rows:
            by_doc[row["doc_id"]].append(row["chunk_id"])
            if not row["embedded"]:
                missing.add(row["doc_id"])
        cfg = self.key_config()
        return [
            WorkItem(
                doc_id,
                item_key(self.name, self.code_version, cfg, [doc_id, *ids]),
                ids,
                ready=doc_id not in missing,
            )
            for doc_id, ids in by_doc.items()
        ]

    def process(self, items: Sequence[WorkItem], io: BatchIO) -> None:
        if self.mode == "batch":
            self.waiting_on = BatchModeEmbed(self, items, io).run()
            return
        in_batch = SyncModeEmbed(self, items, io).run()
        if in_batch and not io.stopping:
            self._wait_for_batches(in_batch, io)

    def _wait_for_batches(self, items: list[WorkItem], io: BatchIO) -> None:
        """Leave items whose chunks provider batches hold to those batches (ADR 0130).

        With the Batch API at hand, a batch-mode pass takes them: it collects a batch that
        has ended and waits for one that runs, as a batch-mode run would. Without it, they
        are released without spending an attempt, and the task waits for the batches.
        """
        if self.batches is not None:
            self.waiting_on = BatchModeEmbed(self, items, io).run()
            return
        database = self.connect()
        try:
            live = database.transaction(
                lambda conn: fetch_all(
                    conn,
                    "batches/live_submissions",
                    {
                        "model": self.model,
                        "dimensions": self.stored_dimensions,
                        "chunk_ids": sorted({c for i in items for c in i.payload}),
                    },
                ),
                describe="embed: live batches",
            )
        finally:
            database.close()
        self.waiting_on = sorted(
            sub["batch_id"] or f"submission:{sub['submission']}" for sub in live
        )
        io.stop(
            Classified(
                BATCH_WAITING,
                ErrorKind.SYSTEMIC,
                f"{len(items)} document(s) wait for chunks that {len(live)} provider "
                "batch(es) hold: " + ", ".join(self.waiting_on[:5]),
            )
        )
