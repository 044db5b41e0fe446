"""The embed stage in sync mode: a request per packed set of chunks, answered at once.

Chunks of all the batch's documents are packed into full requests, sent by a pool of
threads within this task's cap and the shared budget, and each request's vectors and call
records are committed as it returns, under advisory locks on its chunks (see ``EmbedSpec``).
Chunks a provider batch holds are never bought here: their items are handed back to the
spec, which leaves them to the batch mode (ADR 0130).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg2

from replayable.db import Connection, fetch_all
from replayable.models.embeddings import CallRecord, EmbeddingResult
from replayable.retry import ErrorKind, ItemError, classify
from replayable.runner import BatchIO, WorkItem
from replayable.stages.embed.config import EmbedConfig, scope
from replayable.stages.embed.packing import estimate_tokens, pack
from replayable.stages.embed.passes import EmbedPass
from replayable.stages.embed.store import line_verdict, request_key, store_vectors
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
    counted: bool = False  # its failure is in the streak already (see SyncModeEmbed._turn)


class SyncModeEmbed(EmbedPass):
    """One embed batch: pack, send in parallel, commit per request, attribute failures."""

    def __init__(self, spec: EmbedConfig, items: Sequence[WorkItem], io: BatchIO) -> None:
        super().__init__(spec, items, io)
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
        missing = self._of_chunks(
            self.sessions.get(),
            "stages/chunks_missing_embedding",
            self.users,
            "embed: check",
            with_text=False,
        )
        self.tokens = {row["chunk_id"]: estimate_tokens(row["bytes"]) for row in missing}
        self.too_long = self._refuse_too_long()
        self._refuse_lost(sorted(cid for cid in self.tokens if cid not in self.too_long))
        pending = sorted(
            cid for cid in self.tokens if cid not in self.too_long and cid not in self.lost
        )
        self.held = self._in_batches(pending)
        pending = [cid for cid in pending if cid not in self.held]
        if self._rounds(pending) and not self.io.stopping:
            self._settle_unfinished()

    def _rounds(self, pending: list[str]) -> bool:
        """Send ``pending`` round after round, until each is stored, held by a provider
        batch or failed; False if chunks a peer held outlasted ``wait_for_peer_s``."""
        spec = self.spec
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
            busy: list[str] = []
            solo = []
            for request in self._sent(requests, first_round):
                busy += request.busy
                self.held.update(request.in_batch)
                if request.error is not None:
                    solo += self._failed(request)
            first_round = False
            pending = self._still_missing(busy)
            if pending and time.monotonic() > deadline:
                error = ItemError(
                    "chunk_busy",
                    f"{len(pending)} chunk(s) held by another worker for over "
                    f"{spec.wait_for_peer_s:.0f} s",
                    ErrorKind.RETRYABLE,
                )
                for cid in pending:
                    self.blame(cid, error)
                return False
            if pending and not solo:
                time.sleep(spec.peer_poll_s)  # no locks are held while waiting
        return True

    def _sent(self, requests: list[list[str]], first_round: bool) -> Iterator[_Request]:
        """Send one round's requests, yielding each as it returns, in order."""
        if first_round and len(requests) > 1:
            # Slow start: one request alone first, so that a refused key or a provider that
            # is down costs one request, not max_in_flight of them.
            yield self._send(requests[0])
            requests = requests[1:]
        yield from self._threads.map(self._send, [] if self.io.stopping else requests)

    def _settle_unfinished(self) -> None:
        """Leave to its provider batch an item with a chunk that one holds; fail the items
        with any other chunk still unembedded (the ledger says done only when every chunk
        of the item has its vector)."""
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

    def _refuse_lost(self, chunk_ids: list[str]) -> None:
        """Fail the documents of chunks a completed batch charged and returned no result for:
        bought once already, never again, in this mode as in batch mode (ADR 0146)."""
        if not chunk_ids:
            return
        rows = self._of_chunks(
            self.sessions.get(), "batches/refused_chunks", chunk_ids, "embed: lost lines"
        )
        for row in rows:
            if row["status"] != "lost":
                continue  # a refusal is not charged: this mode sends it and splits it
            self.lost.add(row["chunk_id"])
            self.blame(row["chunk_id"], line_verdict(row))

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
        rows = self._of_chunks(
            self.sessions.get(), "batches/held_chunks", chunk_ids, "embed: held by batches"
        )
        return {row["chunk_id"] for row in rows}

    def _still_missing(self, chunk_ids: list[str]) -> list[str]:
        if not chunk_ids:
            return []
        rows = self._of_chunks(
            self.sessions.get(),
            "stages/chunks_missing_embedding",
            chunk_ids,
            "embed: recheck",
            with_text=False,
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
            todo = self._lock(conn, request)
            if not todo:
                return
            answered = self._call(conn, request, todo)
            if answered is None:
                return
            key = _request_key(spec, request.chunk_ids)
        result, calls = answered
        ids = request.chunk_ids if len(request.chunk_ids) == len(result.vectors) else []
        store_vectors(conn, spec.model, spec.stored_dimensions, ids, result.vectors)
        self._record(conn, ids, calls)
        request.stored = ids
        self._answered.pop(key, None)

    def _lock(self, conn: Connection, request: _Request) -> list[dict[str, Any]]:
        """Lock the request's chunks that no peer holds; return those still to buy, with
        their texts (the rest are noted on the request as busy or in a provider batch)."""
        spec = self.spec
        if spec.max_call_s is not None:
            ms = str(round(spec.max_call_s * 1000))
            fetch_all(conn, "ledger/limit_idle_transaction", {"ms": ms})
        locked = {
            row["chunk_id"]
            for row in fetch_all(
                conn,
                "stages/lock_free_chunks",
                {**scope(self.spec), "chunk_ids": request.chunk_ids},
            )
        }
        request.busy = [cid for cid in request.chunk_ids if cid not in locked]
        # Under their locks, which a submission's claim takes too (reserve_chunks): a
        # chunk a provider batch holds is that batch's to buy (ADR 0130).
        request.in_batch = [
            row["chunk_id"]
            for row in fetch_all(
                conn, "batches/held_chunks", {**scope(self.spec), "chunk_ids": sorted(locked)}
            )
        ]
        todo = sorted(locked.difference(request.in_batch))
        return fetch_all(
            conn,
            "stages/chunks_missing_embedding",
            {**scope(self.spec), "chunk_ids": todo, "with_text": True},
        )

    def _call(
        self, conn: Connection, request: _Request, todo: list[dict[str, Any]]
    ) -> tuple[EmbeddingResult, list[CallRecord]] | None:
        """Buy the vectors of ``todo`` (locked); return them with the call records, or None
        with the error on the request (its billable records committed)."""
        spec = self.spec
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
            return None
        answered = (result, calls)
        self._answered[key] = answered  # kept before anything else can fail
        correct_tokens(spec.budget, estimate, calls, spec.name)
        request.chunk_ids = ids
        return answered

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


def _request_key(spec: EmbedConfig, chunk_ids: Sequence[str]) -> str:
    return request_key(spec.model, spec.dimensions, chunk_ids)
