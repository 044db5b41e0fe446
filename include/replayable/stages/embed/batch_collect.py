"""Collecting an ended provider batch for the embed stage's batch mode (ADR 0117, 0146, 0148).

A batch that has ended is collected once, under its submission's row lock: its output
lines' vectors are stored and each line is recorded as a billed call at the batch price, in
one transaction, so a line is never stored or costed twice. The result files are read line
by line as they arrive and stored a slice at a time, never whole (ADR 0148). Each line ends:

- ``done``: its vectors are stored;
- ``failed``: retryably (a 5xx, 429, an unreadable answer, a batch failed as a whole): its
  chunks' items of this task fail with it, and a later try sends it again, within the cap;
- ``refused``: the provider answered its input as bad (a terminal 4xx). No item is blamed
  here: which chunk is bad is read from the ledger by every task alike
  (:class:`~replayable.stages.embed.batch.BatchModeEmbed`, ADR 0146);
- ``missing``: an expired or cancelled batch never ran it: it is sent again as it was,
  under the same ``custom_id``, a few times, then its items fail;
- ``lost``: a completed batch has no result for it. It may have been charged, so it is
  never sent again: its chunks' documents end dead (ADR 0146).
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Protocol

from replayable.db import Connection, Database, execute, fetch_all
from replayable.models.batch_api import BatchApi, BatchJob
from replayable.models.embeddings import _parse
from replayable.models.http import CallRecord
from replayable.retry import ErrorKind, ItemError, classify_status
from replayable.runner import BatchIO, WorkItem
from replayable.stages.embed.config import EmbedConfig
from replayable.stages.embed.store import store_vectors
from replayable.stages.model_calls import record_calls

log = logging.getLogger(__name__)

# A line an expired or cancelled batch did not run is sent again this many times before
# its items fail (and spend an attempt).
MISSED_WINDOWS = 3
# A collect stores the vectors of its result lines this many inputs at a time: a full-size
# batch's results (up to 50,000 inputs of 3,072 dimensions) are never all in memory.
SLICE_INPUTS = 1000


@dataclass(frozen=True)
class LineEnd:
    """How a collected line ended (see the module doc), its error and its chunks."""

    status: str
    error: BaseException | None
    chunk_ids: list[str]


@dataclass(frozen=True)
class _Vectors:
    """The vectors of a collected batch's lines, stored together."""

    chunk_ids: list[str]
    vectors: list[list[float]]


class CollectingPass(Protocol):
    """What a collect reads and reports to of the batch-mode pass it runs in
    (:class:`~replayable.stages.embed.batch.BatchModeEmbed`)."""

    spec: EmbedConfig
    db: Database
    api: BatchApi
    io: BatchIO
    users: dict[str, list[WorkItem]]

    def blame(self, chunk_id: str, error: BaseException) -> None:
        """Fail every item of the pass that uses ``chunk_id`` (unless it failed already)."""

    def forget_file(self, file_id: str) -> None:
        """Delete a provider file, or leave it to the orphan sweep."""


class Collector:
    """Collect one ended batch of a submission for a pass (``embed``)."""

    def __init__(self, embed: CollectingPass, submission: str, job: BatchJob) -> None:
        self.embed = embed
        self.spec = embed.spec
        self.submission = submission
        self.job = job
        self.files = [f for f in (job.output_file_id, job.error_file_id) if f]
        self.inputs: list[str] = []
        # Earlier windows each missing line missed, read in one statement (see _store).
        self.tries: dict[str, int] = {}

    def collect(self) -> None:
        """Store the batch's results, once, under the submission's row lock.

        The result files are read only once the lock is held and the submission is still
        waiting: the worker that collects a batch deletes its files, so a peer that saw it
        running a moment before must find it collected, not fetch files that are gone.
        """
        job = self.job
        outcome = self.embed.db.transaction(self._store, describe=f"embed: collect {job.id}")
        if not outcome:
            return
        for end in outcome.values():
            if end.status != "failed" or end.error is None:
                continue  # refused and lost lines are judged per chunk by every task alike
            for cid in end.chunk_ids:
                self.embed.blame(cid, end.error)
        for file_id in [*self.inputs, *self.files]:  # the provider keeps files until deleted
            self.embed.forget_file(file_id)
        log.info("embed: batch %s %s: %s", job.id, job.status, dict(job.counts) or "no counts")

    def _store(self, conn: Connection) -> dict[str, LineEnd]:
        """Read the result files as they arrive, line by line, and store their vectors a
        slice at a time, all in this one transaction; then end the lines no file had."""
        job, submission = self.job, self.submission
        self.inputs.clear()
        rows = fetch_all(conn, "batches/lock_submission", {"submission": submission})
        if not rows or rows[0]["status"] != "waiting":
            return {}  # another worker collects it, or has
        run_id = rows[0]["run_id"]
        # The vectors are the submission's: its model at the dimensions it asked for.
        model, dimensions = rows[0]["model"], rows[0]["dimensions"]
        if rows[0]["input_file_id"]:
            self.inputs.append(rows[0]["input_file_id"])
        lines = {
            line["custom_id"]: list(line["chunk_ids"])
            for line in fetch_all(conn, "batches/submission_lines", {"submission": submission})
            if line["status"] == "submitted"
        }
        outcome: dict[str, LineEnd] = {}
        if job.status == "failed":
            # The provider refused the file as a whole (validation): no line ran, and
            # sending it again as it was would fail again.
            refused = ItemError(
                "batch_failed",
                f"the provider failed batch {job.id}: {job.errors or 'no reason given'}",
                ErrorKind.RETRYABLE,
            )
            outcome = {cid: LineEnd("failed", refused, chunks) for cid, chunks in lines.items()}
            lines = {}
        vectors = _Vectors([], [])  # a slice, stored when it holds SLICE_INPUTS vectors
        for file_id in self.files if lines else []:
            with self.embed.api.result_lines(file_id) as results:
                for number, raw in enumerate(results, 1):
                    if not raw.strip():
                        continue
                    custom_id, status, body = _result(raw, file_id, number)
                    chunk_ids = lines.get(custom_id)
                    if chunk_ids is None or custom_id in outcome or status == 0:
                        continue  # not this batch's, twice, or never run (see below)
                    line_status, error = self._store_line(
                        conn, custom_id, chunk_ids, status, body, run_id, vectors
                    )
                    outcome[custom_id] = LineEnd(line_status, error, chunk_ids)
                    if len(vectors.chunk_ids) >= SLICE_INPUTS:
                        store_vectors(conn, model, dimensions, vectors.chunk_ids, vectors.vectors)
                        vectors = _Vectors([], [])
        store_vectors(conn, model, dimensions, vectors.chunk_ids, vectors.vectors)
        unrun = sorted(cid for cid in lines if cid not in outcome)
        if unrun and job.status in ("expired", "cancelled"):
            self.tries = {
                row["custom_id"]: row["n"]
                for row in fetch_all(conn, "batches/line_tries", {"custom_ids": unrun})
            }
        for custom_id in unrun:
            line_status, error = self._store_line(
                conn, custom_id, lines[custom_id], 0, None, run_id, vectors
            )
            outcome[custom_id] = LineEnd(line_status, error, lines[custom_id])
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
                "error_kinds": [e.kind.value if isinstance(e, ItemError) else None for e in errors],
                "errors": [str(e) if e is not None else None for e in errors],
            },
        )
        execute(
            conn, "batches/collected", {"submission": submission, "provider_status": job.status}
        )
        return outcome

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
        if status == 0 and self.job.status == "completed":
            # A completed batch ran every line: one it returns nothing for may have been
            # charged, so it is an error, never a line to send again (ADR 0146).
            self._record(conn, custom_id, chunk_ids, run_id, "batch_line_lost", None, 0, None)
            return "lost", ItemError(
                "batch_line_lost",
                f"batch {self.job.id} completed without a result for line {custom_id}; "
                "the provider may have charged it",
                ErrorKind.TERMINAL,
            )
        if status == 0:
            # The batch ended before it ran (expired, cancelled): sent again as it was, the
            # first times; a line that keeps missing its window fails its items, and their
            # attempts bound it like any other failure.
            tries = self.tries.get(custom_id, 0)
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
            error = ItemError(error_class, f"batch line: {message}", kind)
            return ("refused" if kind is ErrorKind.TERMINAL else "failed"), error
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
        http_status: int | None,
        tokens: int,
        cost: float | None,
    ) -> None:
        users = self.embed.users
        share: dict[str, int] = defaultdict(int)
        for cid in chunk_ids:
            if users.get(cid):
                share[users[cid][0].item_key] += 1
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
            (self.embed.io.attempt(users[c][0]) for c in chunk_ids if users.get(c)), default=1
        )
        record_calls(
            conn, [call], stage=self.spec.name, run_id=run_id, attempt=attempt, share=share
        )


def _result(raw: str | bytes, file_id: str, number: int) -> tuple[str, int, Any]:
    """A result line's custom_id, HTTP status (0: never ran) and body; ``bad_response``
    for a line that is not one."""
    try:
        line = json.loads(raw)
        custom_id = str(line["custom_id"])
        response = line.get("response")
        if not response:
            return custom_id, 0, line.get("error")  # expired or cancelled before it ran
        return custom_id, int(response.get("status_code") or 0), response.get("body")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ItemError(
            "bad_response",
            f"line {number} of the provider's result file {file_id} is unreadable: {exc!r}",
            ErrorKind.RETRYABLE,
        ) from exc


def _error_message(body: Any) -> str:
    try:
        return str(body["error"]["message"])[:500]
    except (KeyError, TypeError):
        return str(body)[:500]
