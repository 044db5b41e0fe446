"""The embed stage through the provider's Batch API (``embed_mode: "batch"``, ADR 0117).

One pass over a batch of items, run each time the task runs or wakes:

1. **Check.** The chunks of the items that have no vector under the model are missing;
   the rest cost nothing, as in sync mode.
2. **Collect.** Every submission not collected yet that holds a missing chunk is read at
   the provider. One that has ended is collected under a row lock: its output lines'
   vectors are stored and each line is recorded as a billed call at the batch price, in
   one transaction, so a line is never stored or costed twice; its error lines fail the
   chunks' items with the line's error, classified as a synchronous answer would be
   (retryable ones are sent again by the task's next try, within the attempt cap;
   terminal ones are dead letters); lines an expired or cancelled batch never ran are
   *missing*, and are sent again, exactly as they were, under the same ``custom_id``.
3. **Submit.** Missing chunks that no submission holds are packed into lines as sync
   requests are (a line's ``custom_id`` is the Idempotency-Key a sync request for exactly
   those chunks carries) and submitted, split within the provider's per-batch limits. A
   submission is recorded, with its lines and a claim on each chunk, before anything is
   sent; its file is named after it and its batch carries it in the metadata, so a worker
   killed before the batch id is recorded finds both again instead of paying twice.
4. **Wait.** Items whose chunks are in a batch still running are released without
   spending an attempt, and the stage stops with :data:`BATCH_WAITING`; the operator
   defers the task to the triggerer on those batches (no worker slot is held), and the
   next pass collects them.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from replayable.db import Connection, Database, execute, execute_values, fetch_all
from replayable.retry import Classified, ErrorKind, ItemError, classify, classify_status
from replayable.runner import BatchIO, WorkItem
from replayable.stages.embed.batch_api import (
    ENDPOINT,
    MAX_BATCH_BYTES,
    MAX_BATCH_INPUTS,
    MAX_BATCH_REQUESTS,
    BatchApi,
    BatchJob,
)
from replayable.stages.embed.client import _parse
from replayable.stages.embed.packing import estimate_tokens, pack
from replayable.stages.embed.store import request_key, store_vectors, too_long
from replayable.stages.model_calls import record_calls
from replayable.stages.model_http import CallRecord

if TYPE_CHECKING:
    from replayable.stages.embed.spec import EmbedSpec

log = logging.getLogger(__name__)

# The error class of items released to wait for a provider batch (the operator defers).
BATCH_WAITING = "batch_waiting"
# A line an expired or cancelled batch did not run is sent again this many times before
# its items fail (and spend an attempt).
MISSED_WINDOWS = 3


@dataclass(frozen=True)
class BatchLimits:
    """What one provider batch may hold: requests, embedding inputs, file bytes."""

    requests: int = MAX_BATCH_REQUESTS
    inputs: int = MAX_BATCH_INPUTS
    bytes: int = MAX_BATCH_BYTES


@dataclass(frozen=True)
class _LineEnd:
    """How a collected line ended: done, failed (with its error) or missing; its chunks."""

    status: str
    error: BaseException | None
    chunk_ids: list[str]


@dataclass(frozen=True)
class _Vectors:
    """The vectors of a collected batch's lines, stored together."""

    chunk_ids: list[str]
    vectors: list[list[float]]


@dataclass(frozen=True)
class _Line:
    custom_id: str
    chunk_ids: tuple[str, ...]
    resent_from: str | None = None  # the submission of the missing line it sends again


class BatchModeEmbed:
    """One pass of the embed stage in batch mode over claimed items (see the module doc)."""

    def __init__(self, spec: EmbedSpec, items: Sequence[WorkItem], io: BatchIO) -> None:
        assert spec.batches is not None
        self.spec = spec
        self.api: BatchApi = spec.batches
        self.io = io
        self.items = list(items)
        self.users: dict[str, list[WorkItem]] = defaultdict(list)
        for item in items:
            for cid in dict.fromkeys(item.payload):
                self.users[cid].append(item)
        self.errors: dict[str, BaseException] = {}
        self.tokens: dict[str, int] = {}
        # Chunk sets to send as lines of their own: a document's part of a line refused as bad.
        self.solo: list[list[str]] = []
        self.db: Database = spec.connect()

    def run(self) -> None:
        try:
            waiting = self._run()
            missing = set(self._missing(list(self.users)))
        finally:
            self.db.close()
        self.spec.waiting_on = sorted(waiting)
        held: list[WorkItem] = []
        incomplete = ItemError(
            "incomplete", "some chunks have no embedding yet", ErrorKind.RETRYABLE
        )
        for item in self.items:
            error = self.errors.get(item.item_key)
            if error is not None:
                self.io.failed(item, error)
            elif not missing & set(item.payload):
                self.io.done(item)  # the ledger says done only when every chunk has its vector
            elif waiting:
                held.append(item)
            else:
                self.io.failed(item, incomplete)
        if held:
            self.io.stop(
                Classified(
                    BATCH_WAITING,
                    ErrorKind.SYSTEMIC,
                    f"{len(held)} document(s) wait for {len(waiting)} provider batch(es): "
                    + ", ".join(sorted(waiting)[:5]),
                )
            )

    # -- the pass ----------------------------------------------------------------------

    def _run(self) -> set[str]:
        """Collect, submit; return the batch ids (or submissions) still to wait for."""
        missing = self._missing_with_sizes(list(self.users))
        self._refuse_too_long()
        missing = [cid for cid in missing if cid in self.tokens and not self._failed(cid)]
        if not missing:
            return set()
        for sub in self._live(missing):
            self._advance(sub)
        missing = [cid for cid in self._missing(missing) if not self._failed(cid)]
        live = self._live(missing)
        held = {
            row["chunk_id"]
            for row in self.db.transaction(
                lambda conn: fetch_all(
                    conn,
                    "batches/held_chunks",
                    {"model": self.spec.model, "chunk_ids": missing},
                ),
                describe="embed: held chunks",
            )
        }
        free = [cid for cid in missing if cid not in held]
        if free:
            self._submit(free)
            live = self._live(missing)
        return {sub["batch_id"] or f"submission:{sub['submission']}" for sub in live}

    def _failed(self, chunk_id: str) -> bool:
        return all(item.item_key in self.errors for item in self.users[chunk_id])

    def _missing_with_sizes(self, chunk_ids: list[str]) -> list[str]:
        rows = self._query_missing(chunk_ids, with_text=False)
        self.tokens = {row["chunk_id"]: estimate_tokens(row["bytes"]) for row in rows}
        return [row["chunk_id"] for row in rows]

    def _missing(self, chunk_ids: list[str]) -> list[str]:
        return [row["chunk_id"] for row in self._query_missing(chunk_ids, with_text=False)]

    def _query_missing(self, chunk_ids: list[str], *, with_text: bool) -> list[dict[str, Any]]:
        if not chunk_ids:
            return []
        params = {"chunk_ids": sorted(chunk_ids), "model": self.spec.model, "with_text": with_text}
        return self.db.transaction(
            lambda conn: fetch_all(conn, "stages/chunks_missing_embedding", params),
            describe="embed: check",
        )

    def _refuse_too_long(self) -> None:
        refused = too_long(self.tokens, self.spec.max_input_tokens)
        for cid, error in refused.items():
            for item in self.users[cid]:
                self.errors.setdefault(item.item_key, error)
        self.tokens = {cid: t for cid, t in self.tokens.items() if cid not in refused}

    def _live(self, chunk_ids: list[str]) -> list[dict[str, Any]]:
        if not chunk_ids:
            return []
        params = {"model": self.spec.model, "chunk_ids": sorted(chunk_ids)}
        return self.db.transaction(
            lambda conn: fetch_all(conn, "batches/live_submissions", params),
            describe="embed: live batches",
        )

    # -- collecting --------------------------------------------------------------------

    def _advance(self, sub: dict[str, Any]) -> None:
        """Finish sending a submission left half-sent, or collect one whose batch ended."""
        if sub["batch_id"] is None:
            self._send(sub["submission"])
            return
        job = self.api.get(sub["batch_id"])
        if job.finished:
            self._collect(sub["submission"], job)

    def _collect(self, submission: str, job: BatchJob) -> None:
        """Store a finished batch's results, once, under the submission's row lock.

        The result files are read only once the lock is held and the submission is still
        waiting: the worker that collects a batch deletes its files, so a peer that saw it
        running a moment before must find it collected, not fetch files that are gone.
        """
        files = [f for f in (job.output_file_id, job.error_file_id) if f]
        inputs: list[str] = []
        refused = ItemError(
            "batch_failed",
            f"the provider failed batch {job.id}: {job.errors or 'no reason given'}",
            ErrorKind.RETRYABLE,
        )

        def store(conn: Connection) -> dict[str, _LineEnd]:
            inputs.clear()
            rows = fetch_all(conn, "batches/lock_submission", {"submission": submission})
            if not rows or rows[0]["status"] != "waiting":
                return {}  # another worker collects it, or has
            results: dict[str, tuple[int, Any]] = {}
            for file_id in files:
                for raw in self.api.content(file_id).splitlines():
                    if raw.strip():
                        custom_id, status, body = _result(json.loads(raw))
                        results[custom_id] = (status, body)
            run_id = rows[0]["run_id"]
            if rows[0]["input_file_id"]:
                inputs.append(rows[0]["input_file_id"])
            lines = fetch_all(conn, "batches/submission_lines", {"submission": submission})
            outcome: dict[str, _LineEnd] = {}
            vectors = _Vectors([], [])  # every line's, stored in one statement
            for line in lines:
                if line["status"] != "submitted":
                    continue
                custom_id, chunk_ids = line["custom_id"], list(line["chunk_ids"])
                if job.status == "failed":
                    # The provider refused the file as a whole (validation): no line ran,
                    # and sending it again as it was would fail again.
                    outcome[custom_id] = _LineEnd("failed", refused, chunk_ids)
                    continue
                status, body = results.get(custom_id, (0, None))
                line_status, error = self._store_line(
                    conn, custom_id, chunk_ids, status, body, run_id, vectors
                )
                outcome[custom_id] = _LineEnd(line_status, error, chunk_ids)
            store_vectors(conn, self.spec.model, vectors.chunk_ids, vectors.vectors)
            keys = sorted(outcome)
            errors = [outcome[k].error for k in keys]
            execute(
                conn,
                "batches/finish_lines",
                {
                    "submission": submission,
                    "custom_ids": keys,
                    "statuses": [outcome[k].status for k in keys],
                    "error_classes": [getattr(e, "error_class", None) for e in errors],
                    "error_kinds": [
                        e.kind.value if isinstance(e, ItemError) else None for e in errors
                    ],
                    "errors": [str(e) if e is not None else None for e in errors],
                },
            )
            execute(
                conn, "batches/collected", {"submission": submission, "provider_status": job.status}
            )
            return outcome

        outcome = self.db.transaction(store, describe=f"embed: collect {job.id}")
        if not outcome:
            return
        for end in outcome.values():
            if end.status != "failed" or end.error is None:
                continue
            error, chunk_ids = end.error, end.chunk_ids
            owners = {i.item_key: i for c in chunk_ids for i in self.users.get(c, ())}
            if classify(error).kind is ErrorKind.TERMINAL and len(owners) > 1:
                # One bad input fails the whole line: send each document's part on its own,
                # so that only the document with the bad input is dead-lettered.
                for item in owners.values():
                    self.solo.append([c for c in chunk_ids if item in self.users[c]])
                continue
            for key in owners:
                self.errors.setdefault(key, error)
        for file_id in [*inputs, *files]:  # the provider keeps files until deleted
            self._forget_file(file_id)
        log.info("embed: batch %s %s: %s", job.id, job.status, dict(job.counts) or "no counts")

    def _store_line(
        self,
        conn: Connection,
        custom_id: str,
        chunk_ids: list[str],
        status: int,
        body: Any,
        run_id: str | None,
        vectors: _Vectors,
    ) -> tuple[str, BaseException | None]:
        """Record one line's billed call and keep its vectors in ``vectors``; return its
        status and error."""
        spec = self.spec
        if status == 0:
            # The batch ended before it ran (expired, cancelled): sent again as it was, the
            # first times; a line that keeps missing its window fails its items, and their
            # attempts bound it like any other failure.
            tries = fetch_all(conn, "batches/line_tries", {"custom_id": custom_id})[0]["n"]
            if tries < MISSED_WINDOWS:
                return "missing", None
            error = ItemError(
                "batch_expired",
                f"batch line {custom_id} was not run in {tries + 1} batch windows",
                ErrorKind.RETRYABLE,
            )
            return "failed", error
        if status != 200:
            message = _error_message(body)
            error_class, kind = classify_status(status)
            if kind is ErrorKind.SYSTEMIC:
                kind = ErrorKind.RETRYABLE  # a line refused for its key: try it again
            self._record(conn, custom_id, chunk_ids, run_id, error_class, status, 0, None)
            return "failed", ItemError(error_class, f"batch line: {message}", kind)
        try:
            result = _parse(body, len(chunk_ids))
        except ItemError as error:
            self._record(conn, custom_id, chunk_ids, run_id, error.error_class, 200, 0, None)
            return "failed", error
        vectors.chunk_ids.extend(chunk_ids)
        vectors.vectors.extend(result.vectors)
        price = getattr(spec.provider, "price", None)
        cost = price.of(result.tokens, 0, "batch") if price is not None else None
        self._record(conn, custom_id, chunk_ids, run_id, "ok", 200, result.tokens, cost)
        return "done", None

    def _record(
        self,
        conn: Connection,
        custom_id: str,
        chunk_ids: list[str],
        run_id: str | None,
        status: str,
        http_status: int,
        tokens: int,
        cost: float | None,
    ) -> None:
        share: dict[str, int] = defaultdict(int)
        for cid in chunk_ids:
            users = self.users.get(cid)
            if users:
                share[users[0].item_key] += 1
        call = CallRecord(
            custom_id,
            1,
            status,
            http_status,
            0,
            len(chunk_ids),
            tokens,
            model=self.spec.model,
            cost_usd=cost,
            mode="batch",
        )
        attempt = max(
            (self.io.attempt(self.users[c][0]) for c in chunk_ids if c in self.users), default=1
        )
        record_calls(
            conn, [call], stage=self.spec.name, run_id=run_id, attempt=attempt, share=share
        )

    def _forget_file(self, file_id: str) -> None:
        try:
            self.api.delete_file(file_id)
        except Exception:  # the orphan sweep deletes it later
            log.warning("embed: could not delete the provider file %s", file_id, exc_info=True)

    # -- submitting --------------------------------------------------------------------

    def _submit(self, chunk_ids: list[str]) -> None:
        """Record and send submissions for ``chunk_ids`` (none of which a batch holds)."""
        spec = self.spec
        wanted = set(chunk_ids)
        lines: list[_Line] = []
        params = {"chunk_ids": sorted(wanted)}
        for row in self.db.transaction(
            lambda conn: fetch_all(conn, "batches/missing_lines", params),
            describe="embed: missing lines",
        ):
            ids = tuple(row["chunk_ids"])
            if set(ids) <= wanted:
                lines.append(_Line(row["custom_id"], ids, row["submission"]))
                wanted -= set(ids)
        packed: list[list[str]] = []
        for part in self.solo:
            if part and set(part) <= wanted:
                packed.append(sorted(part))
                wanted -= set(part)
        self.solo = []
        packed += pack(
            [(cid, self.tokens[cid]) for cid in sorted(wanted)],
            max_inputs=spec.inputs_per_call,
            max_tokens=spec.max_request_tokens,
        )
        lines += [
            _Line(request_key(spec.model, spec.dimensions, ids), tuple(ids)) for ids in packed
        ]
        texts = {
            row["chunk_id"]: row["text"]
            for row in self._query_missing(
                [c for line in lines for c in line.chunk_ids], with_text=True
            )
        }
        for group in self._split(lines, texts):
            submission = uuid.uuid4().hex
            if self._record_submission(submission, group):
                self._send(submission)

    def _split(self, lines: list[_Line], texts: dict[str, str]) -> Iterable[list[_Line]]:
        limits = self.spec.batch_limits
        group: list[_Line] = []
        inputs = size = 0
        for line in lines:
            if any(cid not in texts for cid in line.chunk_ids):
                continue  # embedded meanwhile
            line_size = len(self._jsonl(line, texts)) + 1
            if group and (
                len(group) >= limits.requests
                or inputs + len(line.chunk_ids) > limits.inputs
                or size + line_size > limits.bytes
            ):
                yield group
                group, inputs, size = [], 0, 0
            group.append(line)
            inputs += len(line.chunk_ids)
            size += line_size
        if group:
            yield group

    def _jsonl(self, line: _Line, texts: dict[str, str]) -> bytes:
        body: dict[str, Any] = {
            "model": self.spec.model,
            "input": [texts[cid] for cid in line.chunk_ids],
        }
        if self.spec.dimensions:
            body["dimensions"] = self.spec.dimensions
        return json.dumps(
            {"custom_id": line.custom_id, "method": "POST", "url": ENDPOINT, "body": body},
            separators=(",", ":"),
        ).encode()

    def _record_submission(self, submission: str, lines: list[_Line]) -> bool:
        """Claim the lines' chunks and record the submission; False if a peer had them all."""
        spec = self.spec

        def record(conn: Connection) -> bool:
            execute(
                conn,
                "batches/insert_submission",
                {
                    "submission": submission,
                    "provider": self.api.base_url,
                    "model": spec.model,
                    "lines": len(lines),
                    "inputs": sum(len(line.chunk_ids) for line in lines),
                    "dag_id": spec.dag_id,
                    "run_id": spec.run_id,
                    "map_index": spec.map_index,
                },
            )
            ids = [cid for line in lines for cid in line.chunk_ids]
            taken = {
                row["chunk_id"]
                for row in fetch_all(
                    conn,
                    "batches/reserve_chunks",
                    {"model": spec.model, "chunk_ids": ids, "submission": submission},
                )
            }
            mine = [line for line in lines if set(line.chunk_ids) <= taken]
            if len(mine) < len(lines):
                # A peer submitted some of them first: ours would pay for its chunks twice.
                conn.rollback()
                return False
            execute_values(
                conn,
                "batches/insert_lines",
                [(submission, line.custom_id, list(line.chunk_ids)) for line in mine],
                template="(%s, %s, %s::text[])",
            )
            resent = [line for line in mine if line.resent_from]
            if resent:
                execute(
                    conn,
                    "batches/resent_lines",
                    {
                        "submissions": [line.resent_from for line in resent],
                        "custom_ids": [line.custom_id for line in resent],
                    },
                )
            return True

        return self.db.transaction(record, describe="embed: record a batch")

    def _send(self, submission: str) -> None:
        """Upload a recorded submission and create its batch, once, under its row lock.

        Whatever a killed worker sent before is found again first: the file by its name,
        the batch by its metadata. The row stays locked until the batch id is committed.
        """

        def send(conn: Connection) -> None:
            rows = fetch_all(conn, "batches/lock_submission", {"submission": submission})
            if not rows or rows[0]["batch_id"] is not None:
                return  # being sent by another worker, or sent
            row = rows[0]
            job = self.api.find_batch(submission, since=row["created_at"] - 60)
            if job is None:
                file_id = row["input_file_id"] or self.api.find_file(submission)
                if file_id is None:
                    file_id = self.api.upload(submission, self._file_of(conn, submission))
                execute(conn, "batches/set_file", {"submission": submission, "file_id": file_id})
                job = self.api.create(submission, file_id)
            execute(
                conn,
                "batches/set_batch",
                {"submission": submission, "batch_id": job.id, "provider_status": job.status},
            )
            log.info("embed: submission %s is batch %s (%s)", submission, job.id, job.status)

        self.db.transaction(send, describe="embed: send a batch")

    def _file_of(self, conn: Connection, submission: str) -> bytes:
        lines = [
            _Line(row["custom_id"], tuple(row["chunk_ids"]))
            for row in fetch_all(conn, "batches/submission_lines", {"submission": submission})
        ]
        ids = sorted({cid for line in lines for cid in line.chunk_ids})
        texts = {
            row["chunk_id"]: row["text"]
            for row in fetch_all(conn, "batches/chunk_texts", {"chunk_ids": ids})
        }
        return b"\n".join(self._jsonl(line, texts) for line in lines) + b"\n"


def _result(line: Any) -> tuple[str, int, Any]:
    """A result line's custom_id, HTTP status (0: never ran) and body."""
    custom_id = str(line["custom_id"])
    response = line.get("response")
    if not response:
        return custom_id, 0, line.get("error")  # expired or cancelled before it ran
    return custom_id, int(response.get("status_code") or 0), response.get("body")


def _error_message(body: Any) -> str:
    try:
        return str(body["error"]["message"])[:500]
    except (KeyError, TypeError):
        return str(body)[:500]
