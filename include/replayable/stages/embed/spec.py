"""The embed stage as a :class:`~replayable.runner.StageSpec`: keys, input and output.

An item is one document's chunks, keyed by the document and its chunk ids plus the embedder
version, model and dimensions; its outputs are ``embeddings`` rows, one per chunk, model and
dimensions (ADR 0151), shared by every document with that chunk, and a ``model_calls`` row
per billable request. A batch packs the chunks no document has embedded yet into requests
and sends them through :class:`~replayable.models.embeddings.HttpEmbeddingClient` (or any
:class:`~replayable.models.embeddings.EmbeddingProvider`).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import psycopg2

from replayable.budget import RequestBudget
from replayable.db import Connection, Database, fetch_all
from replayable.keys import item_key
from replayable.knobs import EMBED_MODES
from replayable.models.batch_api import BatchApi
from replayable.models.embeddings import CallRecord, EmbeddingProvider, EmbeddingResult
from replayable.retry import Classified, ErrorKind, ItemError, classify
from replayable.runner import BatchIO, StageSpec, WorkItem
from replayable.stages import embed, extract
from replayable.stages.embed.batch_mode import (
    BATCH_WAITING,
    BatchLimits,
    BatchModeEmbed,
    line_verdict,
)
from replayable.stages.embed.packing import (
    MAX_TOKENS_PER_INPUT,
    MAX_TOKENS_PER_REQUEST,
    estimate_tokens,
    pack,
)
from replayable.stages.embed.store import request_key, store_vectors, too_long
from replayable.stages.lineage import embed_lineage
from replayable.stages.model_calls import FailureStreak, Sessions, correct_tokens, record_calls


@dataclass
class _Request:
    """The outcome of one packed request: chunks stored, chunks a peer held, chunks a provider
    batch holds, or an error."""

    chunk_ids: list[str]
    stored: list[str] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)
    in_batch: list[str] = field(default_factory=list)
    error: BaseException | None = None
    counted: bool = False  # its failure is in the streak already (see _EmbedBatch._turn)


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
            BatchModeEmbed(self, items, io).run()
            return
        in_batch = _EmbedBatch(self, items, io).run()
        if in_batch and not io.stopping:
            self._wait_for_batches(in_batch, io)

    def _wait_for_batches(self, items: list[WorkItem], io: BatchIO) -> None:
        """Leave items whose chunks provider batches hold to those batches (ADR 0130).

        With the Batch API at hand, a batch-mode pass takes them: it collects a batch that
        has ended and waits for one that runs, as a batch-mode run would. Without it, they
        are released without spending an attempt, and the task waits for the batches.
        """
        if self.batches is not None:
            BatchModeEmbed(self, items, io).run()
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


class _EmbedBatch:
    """One embed batch: pack, send in parallel, commit per request, attribute failures."""

    def __init__(self, spec: EmbedSpec, items: Sequence[WorkItem], io: BatchIO) -> None:
        self.spec = spec
        self.io = io
        self.items = list(items)
        self.users: dict[str, list[WorkItem]] = defaultdict(list)
        for item in items:
            for cid in dict.fromkeys(item.payload):
                self.users[cid].append(item)
        self.errors: dict[str, BaseException] = {}
        self.tokens: dict[str, int] = {}  # estimated, by chunk
        self.too_long: set[str] = set()
        self.lost: set[str] = set()  # chunks a completed batch charged and lost
        # Chunks a provider batch not collected yet holds (never bought here), and the items
        # that wait for them.
        self.held: set[str] = set()
        self.in_batch: set[str] = set()
        self.streak = FailureStreak(spec.systemic_after)
        self.sessions = Sessions(spec.connect)
        # This task's own cap on requests in flight (a run's max_in_flight may only lower
        # the shared budget); there are more senders than it, see run().
        self._in_flight = threading.BoundedSemaphore(spec.max_in_flight)
        # Responses that came back but are not stored yet, by request: kept across a lost
        # database connection so that storing them again never pays again.
        self._answered: dict[str, tuple[EmbeddingResult, list[CallRecord]]] = {}

    def run(self) -> list[WorkItem]:
        """Embed the items' chunks and report their outcomes; return the items left to wait
        for chunks that a provider batch holds (unreported)."""
        # One pool for every round: each thread keeps its one connection while the batch
        # waits round after round for chunks a peer holds. Twice as many senders as slots:
        # while one stores and commits its answer, another already holds the slot it freed,
        # so no slot idles between two sends (the budget still caps requests in flight).
        senders = min(2 * self.spec.max_in_flight, self.spec.max_sessions)
        self._threads = ThreadPoolExecutor(senders, thread_name_prefix="embed")
        try:
            self._run()
        finally:
            self._threads.shutdown()
            self.sessions.close()
        waiting: list[WorkItem] = []
        for item in self.items:
            error = self.errors.get(item.item_key)
            if error is not None:
                self.io.failed(item, error)
            elif item.item_key in self.in_batch:
                waiting.append(item)
            elif not self.io.stopping:
                self.io.done(item)
            # Stopping: the runner releases the rest without spending their attempts.
        return waiting

    def _run(self) -> None:
        spec = self.spec
        missing = self.sessions.get().transaction(
            lambda conn: fetch_all(
                conn,
                "stages/chunks_missing_embedding",
                {
                    "chunk_ids": sorted(self.users),
                    "model": spec.model,
                    "dimensions": spec.stored_dimensions,
                    "with_text": False,
                },
            ),
            describe="embed: check",
        )
        self.tokens = {row["chunk_id"]: estimate_tokens(row["bytes"]) for row in missing}
        self._refuse_too_long()
        self._refuse_lost(sorted(cid for cid in self.tokens if cid not in self.too_long))
        pending = sorted(
            cid for cid in self.tokens if cid not in self.too_long and cid not in self.lost
        )
        self.held = self._in_batches(pending)
        pending = [cid for cid in pending if cid not in self.held]
        solo: list[list[str]] = []
        first_round = True
        deadline = time.monotonic() + spec.wait_for_peer_s
        while (pending or solo) and not self.io.stopping:
            live = [cid for cid in pending if self._wanted(cid)]
            requests = pack(
                [(cid, self.tokens[cid]) for cid in live],
                max_inputs=spec.inputs_per_call,
                max_tokens=spec.request_tokens,
            )
            # Parts of a refused request, less the chunks no live item of ours needs now.
            requests += [part for part in map(self._still_wanted, solo) if part]
            solo = []
            busy: list[str] = []
            if first_round and len(requests) > 1:
                # Slow start: one request alone first, so that a refused key or a provider that
                # is down costs one request, not max_in_flight of them.
                probe = self._send(requests[0])
                requests = requests[1:]
                busy += probe.busy
                self.held.update(probe.in_batch)
                if probe.error is not None:
                    solo += self._failed(probe)
            first_round = False
            for request in self._threads.map(self._send, [] if self.io.stopping else requests):
                busy += request.busy
                self.held.update(request.in_batch)
                if request.error is not None:
                    solo += self._failed(request)
            pending = self._still_missing(busy)
            if pending and time.monotonic() > deadline:
                error = ItemError(
                    "chunk_busy",
                    f"{len(pending)} chunk(s) held by another worker for over "
                    f"{spec.wait_for_peer_s:.0f} s",
                    ErrorKind.RETRYABLE,
                )
                for cid in pending:
                    for item in self.users[cid]:
                        self.errors.setdefault(item.item_key, error)
                return
            if pending and not solo:
                time.sleep(spec.peer_poll_s)  # no locks are held while waiting
        if self.io.stopping:
            return
        # The ledger only says done when every chunk of the item has its vector; one that
        # waits for a provider batch is left to it, the rest are incomplete.
        unfinished = self._still_missing(list(self.users))
        held = self._in_batches([cid for cid in unfinished if cid in self.held])
        incomplete = ItemError(
            "incomplete", "some chunks have no embedding yet", ErrorKind.RETRYABLE
        )
        for cid in unfinished:
            for item in self.users[cid]:
                if cid in held:
                    self.in_batch.add(item.item_key)
                else:
                    self.errors.setdefault(item.item_key, incomplete)

    def _refuse_too_long(self) -> None:
        """Fail the documents of chunks past the per-input limit, before anything is sent."""
        refused = too_long(self.tokens, self.spec.max_input_tokens)
        self.too_long = set(refused)
        for cid, error in refused.items():
            for item in self.users[cid]:
                self.errors.setdefault(item.item_key, error)

    def _refuse_lost(self, chunk_ids: list[str]) -> None:
        """Fail the documents of chunks a completed batch charged and returned no result for:
        bought once already, never again, in this mode as in batch mode (ADR 0146)."""
        if not chunk_ids:
            return
        params = {
            "model": self.spec.model,
            "dimensions": self.spec.stored_dimensions,
            "chunk_ids": chunk_ids,
        }
        rows = self.sessions.get().transaction(
            lambda conn: fetch_all(conn, "batches/refused_chunks", params),
            describe="embed: lost lines",
        )
        for row in rows:
            if row["status"] != "lost":
                continue  # a refusal is not charged: this mode sends it and splits it
            self.lost.add(row["chunk_id"])
            for item in self.users[row["chunk_id"]]:
                self.errors.setdefault(item.item_key, line_verdict(row))

    def _wanted(self, chunk_id: str) -> bool:
        """Whether some item that still needs ``chunk_id`` is ours and has not failed."""
        return any(
            item.item_key not in self.errors and self.io.holds(item)
            for item in self.users[chunk_id]
        )

    def _still_wanted(self, chunk_ids: list[str]) -> list[str]:
        return [cid for cid in chunk_ids if cid not in self.held and self._wanted(cid)]

    def _in_batches(self, chunk_ids: list[str]) -> set[str]:
        """Which of ``chunk_ids`` a provider batch not collected yet holds."""
        if not chunk_ids:
            return set()
        params = {
            "model": self.spec.model,
            "dimensions": self.spec.stored_dimensions,
            "chunk_ids": sorted(chunk_ids),
        }
        rows = self.sessions.get().transaction(
            lambda conn: fetch_all(conn, "batches/held_chunks", params),
            describe="embed: held by batches",
        )
        return {row["chunk_id"] for row in rows}

    def _still_missing(self, chunk_ids: list[str]) -> list[str]:
        if not chunk_ids:
            return []
        params = {
            "chunk_ids": sorted(chunk_ids),
            "model": self.spec.model,
            "dimensions": self.spec.stored_dimensions,
            "with_text": False,
        }
        rows = self.sessions.get().transaction(
            lambda conn: fetch_all(conn, "stages/chunks_missing_embedding", params),
            describe="embed: recheck",
        )
        return [row["chunk_id"] for row in rows]

    def _failed(self, request: _Request) -> list[list[str]]:
        """Attribute a failed request to its items; return smaller requests to send instead.

        A request refused as bad (terminal) that carries several documents' chunks is split
        into parts that partition it, so that only the documents holding the bad input fail,
        in at most twice as many requests as it has chunks (ADR 0129): by document when no
        two of them share a chunk of it, else in halves. A single chunk refused as bad fails
        every document that holds it, with the chunk named in the error.
        """
        assert request.error is not None
        error = classify(request.error)
        if error.kind is ErrorKind.SYSTEMIC or error.error_class == "not_attempted":
            return []  # the batch is stopping (see _send); no item is to blame
        chunk_ids = request.chunk_ids
        owners = {item.item_key: item for cid in chunk_ids for item in self.users[cid]}
        if error.kind is ErrorKind.TERMINAL and len(chunk_ids) == 1:
            refused = ItemError(
                error.error_class,
                f"the provider refused chunk {chunk_ids[0]} (held by {len(owners)} "
                f"document(s) of this batch): {request.error}",
                ErrorKind.TERMINAL,
            ).with_traceback(request.error.__traceback__)  # the full error, where it was raised
            refused.__cause__ = request.error
            for key in owners:
                self.errors.setdefault(key, refused)
            return []
        if error.kind is ErrorKind.TERMINAL and len(owners) > 1:
            parts = list(
                dict.fromkeys(
                    tuple(cid for cid in chunk_ids if item in self.users[cid])
                    for item in owners.values()
                )
            )
            if len(parts) > 1 and sum(map(len, parts)) == len(chunk_ids):
                return [list(part) for part in parts]  # no chunk in two parts
            half = len(chunk_ids) // 2
            return [chunk_ids[:half], chunk_ids[half:]]
        for key in owners:
            self.errors.setdefault(key, request.error)
        return []

    def _count(self, request: _Request) -> None:
        """Stop the batch on a systemic error, or when request after request fails."""
        if request.error is None:
            if request.stored:
                self.streak.succeeded()
            return
        if not request.counted:
            self._failure(request.error)

    def _failure(self, error: BaseException) -> None:
        stop = self.streak.failed(error)
        if stop is not None:
            self.io.stop(stop)  # now, so that no other thread starts a request

    def _send(self, chunk_ids: list[str]) -> _Request:
        request = _Request(chunk_ids)
        if self.io.stopping:
            request.error = _NotAttempted("not_attempted", "the batch stopped", ErrorKind.RETRYABLE)
            return request
        try:
            self.sessions.get().transaction(
                lambda conn: self._send_in(conn, request), describe="embed: request"
            )
        except _NotAttempted as error:
            request.error = error  # its turn came after the batch began to stop
            return request
        except Exception as error:
            request.error = error
        self._count(request)
        return request

    def _send_in(self, conn: Connection, request: _Request) -> None:
        """Lock, re-check, call and store one request, all in one transaction."""
        spec = self.spec
        request.stored, request.in_batch, request.error = [], [], None
        key = _request_key(spec, request.chunk_ids)
        answered = self._answered.get(key)
        if answered is None:
            if spec.max_call_s is not None:
                ms = str(round(spec.max_call_s * 1000))
                fetch_all(conn, "ledger/limit_idle_transaction", {"ms": ms})
            locked = {
                row["chunk_id"]
                for row in fetch_all(
                    conn,
                    "stages/lock_free_chunks",
                    {
                        "chunk_ids": request.chunk_ids,
                        "model": spec.model,
                        "dimensions": spec.stored_dimensions,
                    },
                )
            }
            request.busy = [cid for cid in request.chunk_ids if cid not in locked]
            # Under their locks, which a submission's claim takes too (reserve_chunks): a
            # chunk a provider batch holds is that batch's to buy (ADR 0130).
            request.in_batch = [
                row["chunk_id"]
                for row in fetch_all(
                    conn,
                    "batches/held_chunks",
                    {
                        "model": spec.model,
                        "dimensions": spec.stored_dimensions,
                        "chunk_ids": sorted(locked),
                    },
                )
            ]
            todo = fetch_all(
                conn,
                "stages/chunks_missing_embedding",
                {
                    "chunk_ids": sorted(locked.difference(request.in_batch)),
                    "model": spec.model,
                    "dimensions": spec.stored_dimensions,
                    "with_text": True,
                },
            )
            if not todo:
                return
            ids = [row["chunk_id"] for row in todo]
            key = _request_key(spec, ids)
            calls: list[CallRecord] = []
            estimate = sum(self.tokens[cid] for cid in ids)
            failure: BaseException | None = None
            with self._turn():
                try:
                    result = spec.provider.embed(
                        [row["text"] for row in todo],
                        idempotency_key=key,
                        on_call=calls.append,
                        # The slot is taken by a statement on this transaction's session,
                        # just before each try: a session ended while the request waited
                        # for its turn fails here, and the request begins again, before a
                        # byte is sent without its chunk locks (ADR 0115).
                        gate=lambda: spec.budget.slot(conn, estimate),
                    )
                except psycopg2.Error:
                    raise  # the budget's database: the transaction runs this again
                except Exception as error:
                    # Counted before the turn passes on, so that a stop it causes is seen
                    # by the sender that takes the turn next.
                    failure, request.counted = error, True
                    self._failure(error)
            if failure is not None:
                # The failed tries are billable records too; commit them, then report. The
                # failure is the chunks sent's, not those a peer held or had stored.
                correct_tokens(spec.budget, estimate, calls, spec.name)
                self._record(conn, ids, calls)
                request.chunk_ids, request.error = ids, failure
                return
            answered = (result, calls)
            self._answered[key] = answered  # kept before anything else can fail
            correct_tokens(spec.budget, estimate, calls, spec.name)
            request.chunk_ids = ids
        result, calls = answered
        ids = request.chunk_ids if len(request.chunk_ids) == len(result.vectors) else []
        store_vectors(conn, spec.model, spec.stored_dimensions, ids, result.vectors)
        self._record(conn, ids, calls)
        request.stored = ids
        self._answered.pop(key, None)

    @contextmanager
    def _turn(self) -> Iterator[None]:
        """One of this task's own slots, for a request and its retries (each try also takes
        a slot of the shared budget). A sender whose turn comes after the batch began to
        stop sends nothing and blames no item."""
        with self._in_flight:
            if self.io.stopping:
                raise _NotAttempted("not_attempted", "the batch stopped", ErrorKind.RETRYABLE)
            yield

    def _record(self, conn: Connection, chunk_ids: list[str], calls: list[CallRecord]) -> None:
        """Store each call with the items whose inputs it carried (each chunk counted once)."""
        share: dict[str, int] = defaultdict(int)
        for cid in chunk_ids:
            share[self.users[cid][0].item_key] += 1
        attempt = max(
            (self.io.attempt(item) for cid in chunk_ids for item in self.users[cid][:1]),
            default=1,
        )
        record_calls(
            conn,
            calls,
            stage=self.spec.name,
            run_id=self.spec.run_id,
            attempt=attempt,
            share=share,
        )


class _NotAttempted(ItemError):
    """A request the batch did not send because it began to stop: no item is to blame."""


def _request_key(spec: EmbedSpec, chunk_ids: Sequence[str]) -> str:
    return request_key(spec.model, spec.dimensions, chunk_ids)
