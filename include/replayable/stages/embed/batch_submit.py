"""Submitting the embed stage's missing chunks as provider batches (ADR 0117, 0146).

Missing chunks are packed into lines as sync requests are (a line's ``custom_id`` is the
Idempotency-Key a sync request for exactly those chunks carries), beside the lines a batch
never ran, sent again as they were, and the chunks refused among others, each alone; the
lines are split within the provider's per-batch limits. A submission is recorded, with its
lines and a claim on each chunk, before anything is sent; its file is named after it and
its batch carries it in the metadata, so a worker killed before the batch id is recorded
finds both again instead of paying twice.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from replayable.db import Connection, Database, execute, execute_values, fetch_all
from replayable.models.batch_api import ENDPOINT, BatchApi
from replayable.stages.embed.config import EmbedConfig, scope
from replayable.stages.embed.packing import pack
from replayable.stages.embed.store import request_key

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Line:
    custom_id: str
    chunk_ids: tuple[str, ...]
    resent_from: str | None = None  # the submission of the missing line it sends again


class Submitter:
    """Record and send the submissions of one batch-mode pass (``db`` is the pass's)."""

    def __init__(self, spec: EmbedConfig, db: Database, api: BatchApi) -> None:
        self.spec = spec
        self.db = db
        self.api = api

    def record(
        self, chunk_ids: list[str], tokens: dict[str, int], alone: set[str]
    ) -> Iterator[str]:
        """Record submissions for ``chunk_ids`` (none of which a batch holds), yielding each
        as it is recorded, for the caller to send before the next is recorded.

        ``tokens`` are the chunks' estimates; the chunks in ``alone`` go a line each.
        """
        spec = self.spec
        wanted = set(chunk_ids)
        lines: list[_Line] = []
        params = {**scope(self.spec), "chunk_ids": sorted(wanted)}
        for row in self.db.transaction(
            lambda conn: fetch_all(conn, "batches/missing_lines", params),
            describe="embed: missing lines",
        ):
            ids = tuple(row["chunk_ids"])
            if set(ids) <= wanted:
                lines.append(_Line(row["custom_id"], ids, row["submission"]))
                wanted -= set(ids)
        packed = [[cid] for cid in sorted(wanted & alone)]
        wanted -= alone
        packed += pack(
            [(cid, tokens[cid]) for cid in sorted(wanted)],
            max_inputs=spec.inputs_per_call,
            max_tokens=spec.max_request_tokens,
        )
        lines += [
            _Line(request_key(spec.model, spec.dimensions, ids), tuple(ids)) for ids in packed
        ]
        texts = {row["chunk_id"]: row["text"] for row in self._texts(lines)}
        for group in self._split(lines, texts):
            submission = uuid.uuid4().hex
            if self._record(submission, group):
                yield submission

    def _texts(self, lines: list[_Line]) -> list[dict[str, Any]]:
        """The texts of the lines' chunks that still have no vector."""
        chunk_ids = [c for line in lines for c in line.chunk_ids]
        if not chunk_ids:
            return []
        params = {**scope(self.spec), "chunk_ids": sorted(chunk_ids), "with_text": True}
        return self.db.transaction(
            lambda conn: fetch_all(conn, "stages/chunks_missing_embedding", params),
            describe="embed: check",
        )

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

    def _record(self, submission: str, lines: list[_Line]) -> bool:
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
                    {**scope(self.spec), "chunk_ids": ids, "submission": submission},
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

    def send(self, submission: str) -> None:
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
