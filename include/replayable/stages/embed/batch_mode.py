"""The embed stage through the provider's Batch API (``embed_mode: "batch"``, ADR 0117).

One pass over a batch of items, run each time the task runs or wakes:

1. **Check.** The chunks of the items that have no vector under the model and dimensions
   (ADR 0151) are missing;
   the rest cost nothing, as in sync mode.
2. **Collect.** Every submission not collected yet that holds a missing chunk is read at
   the provider. One that has ended is collected once (:mod:`.batch_collect`): vectors
   stored and lines costed in one transaction, each line ending done, failed (retryable:
   sent again by a later try, within the attempt cap), refused, missing (sent again as it
   was) or lost.
3. **Judge refusals.** A chunk in a line the provider refused alone, or in a line a
   completed batch lost, fails every document of the task that holds it, at once and
   naming it; a chunk in a refused line of several is sent again alone, so that the bad
   one is found. This is read from the ledger, so every task judges a shared chunk alike,
   whichever collected its line (ADR 0146).
4. **Submit.** Missing chunks that no submission holds are packed into lines as sync
   requests are (a line's ``custom_id`` is the Idempotency-Key a sync request for exactly
   those chunks carries) and submitted, split within the provider's per-batch limits. A
   submission is recorded, with its lines and a claim on each chunk, before anything is
   sent; its file is named after it and its batch carries it in the metadata, so a worker
   killed before the batch id is recorded finds both again instead of paying twice.
5. **Wait.** Items whose chunks are in a batch still running are released without
   spending an attempt, and the stage stops with :data:`BATCH_WAITING`; the operator
   defers the task to the triggerer on those batches (no worker slot is held), and the
   next pass collects them.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from replayable.db import Connection, Database, execute, execute_values, fetch_all
from replayable.models.batch_api import (
    ENDPOINT,
    MAX_BATCH_BYTES,
    MAX_BATCH_INPUTS,
    MAX_BATCH_REQUESTS,
    BatchApi,
)
from replayable.retry import Classified, ErrorKind, ItemError, classify
from replayable.runner import BatchIO, WorkItem
from replayable.stages.embed.batch_collect import Collector
from replayable.stages.embed.packing import estimate_tokens, pack
from replayable.stages.embed.store import request_key, too_long

if TYPE_CHECKING:
    from replayable.stages.embed.spec import EmbedSpec

log = logging.getLogger(__name__)

# The error class of items released to wait for a provider batch (the operator defers).
BATCH_WAITING = "batch_waiting"
# A submission no pass can advance (its batch or results unreadable, its upload refused) is
# abandoned at the end of this many passes that tried, its chunks freed (ADR 0147).
SUBMISSION_TRIES = 3


@dataclass(frozen=True)
class BatchLimits:
    """What one provider batch may hold: requests, embedding inputs, file bytes."""

    requests: int = MAX_BATCH_REQUESTS
    inputs: int = MAX_BATCH_INPUTS
    bytes: int = MAX_BATCH_BYTES


@dataclass(frozen=True)
class _Line:
    custom_id: str
    chunk_ids: tuple[str, ...]
    resent_from: str | None = None  # the submission of the missing line it sends again


def line_verdict(row: dict[str, Any]) -> ItemError:
    """The terminal error of a chunk a line decided (a ``batches/refused_chunks`` row): lost
    by a completed batch, or refused alone; it is not sent again, in either mode (ADR 0146)."""
    if row["status"] == "lost":
        why = f"a completed batch returned no result for line {row['custom_id']}"
    else:
        why = f"the provider refused it (line {row['custom_id']}): {row['error']}"
    return ItemError(
        row["error_class"] or "batch_line_lost",
        f"chunk {row['chunk_id']} is not embedded and will not be sent again: {why}",
        ErrorKind.TERMINAL,
    )


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
        # Chunks to send as lines of their own: each was in a line refused as bad (ADR 0146).
        self.alone: set[str] = set()
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
        missing = self._judge_refusals(missing)
        if not missing:
            return set()
        for sub in self._live(missing):
            self._try_to_advance(sub["submission"], partial(self._advance, sub))
        missing = [cid for cid in self._missing(missing) if not self._failed(cid)]
        missing = self._judge_refusals(missing)
        live = self._live(missing)
        held = {
            row["chunk_id"]
            for row in self.db.transaction(
                lambda conn: fetch_all(
                    conn,
                    "batches/held_chunks",
                    {**self._size(), "chunk_ids": missing},
                ),
                describe="embed: held chunks",
            )
        }
        free = [cid for cid in missing if cid not in held]
        if free:
            self._submit(free)
            live = self._live(missing)
        return {sub["batch_id"] or f"submission:{sub['submission']}" for sub in live}

    def _size(self) -> dict[str, Any]:
        """The model and dimensions (as stored) every query of the pass is scoped by."""
        return {"model": self.spec.model, "dimensions": self.spec.stored_dimensions}

    def _failed(self, chunk_id: str) -> bool:
        return all(item.item_key in self.errors for item in self.users[chunk_id])

    def _judge_refusals(self, chunk_ids: list[str]) -> list[str]:
        """Fail the documents of chunks refused alone or lost; mark chunks refused among
        others to be sent alone; return the chunks still to buy (ADR 0146)."""
        if not chunk_ids:
            return []
        params = {**self._size(), "chunk_ids": sorted(chunk_ids)}
        for row in self.db.transaction(
            lambda conn: fetch_all(conn, "batches/refused_chunks", params),
            describe="embed: refused chunks",
        ):
            cid = row["chunk_id"]
            if row["status"] == "refused" and row["size"] > 1:
                self.alone.add(cid)  # which of the line's chunks is bad is not known yet
                continue
            error = line_verdict(row)
            for item in self.users[cid]:
                self.errors.setdefault(item.item_key, error)
        return [cid for cid in chunk_ids if not self._failed(cid)]

    def _missing_with_sizes(self, chunk_ids: list[str]) -> list[str]:
        rows = self._query_missing(chunk_ids, with_text=False)
        self.tokens = {row["chunk_id"]: estimate_tokens(row["bytes"]) for row in rows}
        return [row["chunk_id"] for row in rows]

    def _missing(self, chunk_ids: list[str]) -> list[str]:
        return [row["chunk_id"] for row in self._query_missing(chunk_ids, with_text=False)]

    def _query_missing(self, chunk_ids: list[str], *, with_text: bool) -> list[dict[str, Any]]:
        if not chunk_ids:
            return []
        params = {**self._size(), "chunk_ids": sorted(chunk_ids), "with_text": with_text}
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
        params = {**self._size(), "chunk_ids": sorted(chunk_ids)}
        return self.db.transaction(
            lambda conn: fetch_all(conn, "batches/live_submissions", params),
            describe="embed: live batches",
        )

    # -- collecting --------------------------------------------------------------------

    def _try_to_advance(self, submission: str, step: Callable[[], None]) -> None:
        """Run ``step`` on a submission; if it fails, count the try against the submission
        alone, so that documents without a chunk in it are not failed with it (ADR 0147).

        A systemic failure (the key refused, no Batch API, the database gone) still stops
        the batch without spending anyone's attempts.
        """
        try:
            step()
        except Exception as error:
            classified = classify(error)
            if classified.kind is ErrorKind.SYSTEMIC:
                raise
            self._stuck(submission, classified)

    def _stuck(self, submission: str, error: Classified) -> None:
        """Count a pass that could not advance ``submission``; at the cap, abandon it: its
        chunks are freed and the items of this task that hold one fail with its error."""
        params = {
            "submission": submission,
            "error_class": error.error_class,
            "error": error.message[:2000],
            "max_tries": SUBMISSION_TRIES,
        }
        found = self.db.transaction(
            lambda conn: fetch_all(conn, "batches/submission_tried", params),
            describe="embed: a submission not advanced",
        )
        if not found:
            return  # collected or abandoned by a peer meanwhile
        row = found[0]
        if row["status"] != "abandoned":
            log.warning(
                "embed: submission %s not advanced (%d of %d tries): %s",
                submission,
                row["tries"],
                SUBMISSION_TRIES,
                error.message,
            )
            return
        log.error("embed: submission %s abandoned: %s", submission, error.message)
        failure = ItemError(
            error.error_class,
            f"submission {submission} (batch {row['batch_id'] or 'not created'}) was abandoned "
            f"after {row['tries']} passes could not advance it: {error.message}",
            ErrorKind.RETRYABLE,
        )
        for cid in row["chunk_ids"]:
            for item in self.users.get(cid, ()):
                self.errors.setdefault(item.item_key, failure)
        if row["input_file_id"]:
            self.forget_file(row["input_file_id"])

    def _advance(self, sub: dict[str, Any]) -> None:
        """Finish sending a submission left half-sent, or collect one whose batch ended."""
        if sub["provider"] != self.api.base_url:
            raise ItemError(
                "batch_provider_changed",
                f"submission {sub['submission']} was sent to {sub['provider']}; the model "
                f"connection now points to {self.api.base_url}, which cannot read it",
                ErrorKind.RETRYABLE,
            )
        if sub["batch_id"] is None:
            self._send(sub["submission"])
            return
        job = self.api.get(sub["batch_id"])
        if job.finished:
            Collector(self, sub["submission"], job).collect()

    def forget_file(self, file_id: str) -> None:
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
        params = {**self._size(), "chunk_ids": sorted(wanted)}
        for row in self.db.transaction(
            lambda conn: fetch_all(conn, "batches/missing_lines", params),
            describe="embed: missing lines",
        ):
            ids = tuple(row["chunk_ids"])
            if set(ids) <= wanted:
                lines.append(_Line(row["custom_id"], ids, row["submission"]))
                wanted -= set(ids)
        packed = [[cid] for cid in sorted(wanted & self.alone)]
        wanted -= self.alone
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
                self._try_to_advance(submission, partial(self._send, submission))

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
                    "dimensions": spec.stored_dimensions,
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
                    {**self._size(), "chunk_ids": ids, "submission": submission},
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
