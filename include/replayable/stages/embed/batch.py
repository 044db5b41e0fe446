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
4. **Submit.** Missing chunks that no submission holds are packed into lines and
   submitted (:mod:`.batch_submit`), each submission recorded before anything is sent.
5. **Wait.** Items whose chunks are in a batch still running are released without
   spending an attempt, and the stage stops with :data:`BATCH_WAITING`; the operator
   defers the task to the triggerer on those batches (no worker slot is held), and the
   next pass collects them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from replayable.db import fetch_all
from replayable.models.batch_api import BatchApi
from replayable.retry import Classified, ErrorKind, ItemError, classify
from replayable.runner import BatchIO, WorkItem
from replayable.stages.embed.batch_collect import Collector
from replayable.stages.embed.batch_submit import Submitter
from replayable.stages.embed.config import EmbedConfig
from replayable.stages.embed.packing import estimate_tokens
from replayable.stages.embed.passes import EmbedPass
from replayable.stages.embed.store import line_verdict

log = logging.getLogger(__name__)

# The error class of items released to wait for a provider batch (the operator defers).
BATCH_WAITING = "batch_waiting"
# A submission no pass can advance (its batch or results unreadable, its upload refused) is
# abandoned at the end of this many passes that tried, its chunks freed (ADR 0147).
SUBMISSION_TRIES = 3


class BatchModeEmbed(EmbedPass):
    """One pass of the embed stage in batch mode over claimed items (see the module doc)."""

    def __init__(self, spec: EmbedConfig, items: Sequence[WorkItem], io: BatchIO) -> None:
        assert spec.batches is not None
        super().__init__(spec, items, io)
        self.api: BatchApi = spec.batches
        # Chunks to send as lines of their own: each was in a line refused as bad (ADR 0146).
        self.alone: set[str] = set()
        self.db = spec.connect()
        self.submitter = Submitter(spec, self.db, self.api)

    def run(self) -> list[str]:
        """Collect, submit and report; return the batch ids (or submissions) its released
        items wait for (the operator defers the task on them)."""
        try:
            waiting = self._run()
            missing = set(self._missing(list(self.users)))
        finally:
            self.db.close()
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
        return sorted(waiting)

    # -- the pass ----------------------------------------------------------------------

    def _run(self) -> set[str]:
        """Collect, submit; return the batch ids (or submissions) still to wait for."""
        missing = self._missing_with_sizes(list(self.users))
        refused = self._refuse_too_long()
        self.tokens = {cid: t for cid, t in self.tokens.items() if cid not in refused}
        missing = [cid for cid in missing if cid in self.tokens and not self._failed(cid)]
        missing = self._judge_refusals(missing)
        if not missing:
            return set()
        for sub in self._live(missing):
            self._try_to_advance(sub["submission"], partial(self._advance, sub))
        missing = [cid for cid in self._missing(missing) if not self._failed(cid)]
        missing = self._judge_refusals(missing)
        live = self._live(missing)
        rows = self._of_chunks(self.db, "batches/held_chunks", missing, "embed: held chunks")
        held = {row["chunk_id"] for row in rows}
        free = [cid for cid in missing if cid not in held]
        if free:
            for submission in self.submitter.record(free, self.tokens, self.alone):
                self._try_to_advance(submission, partial(self.submitter.send, submission))
            live = self._live(missing)
        return {sub["batch_id"] or f"submission:{sub['submission']}" for sub in live}

    def _failed(self, chunk_id: str) -> bool:
        return all(item.item_key in self.errors for item in self.users[chunk_id])

    def _judge_refusals(self, chunk_ids: list[str]) -> list[str]:
        """Fail the documents of chunks refused alone or lost; mark chunks refused among
        others to be sent alone; return the chunks still to buy (ADR 0146)."""
        if not chunk_ids:
            return []
        for row in self._of_chunks(
            self.db, "batches/refused_chunks", chunk_ids, "embed: refused chunks"
        ):
            cid = row["chunk_id"]
            if row["status"] == "refused" and row["size"] > 1:
                self.alone.add(cid)  # which of the line's chunks is bad is not known yet
                continue
            self.blame(cid, line_verdict(row))
        return [cid for cid in chunk_ids if not self._failed(cid)]

    def _missing_with_sizes(self, chunk_ids: list[str]) -> list[str]:
        rows = self._query_missing(chunk_ids)
        self.tokens = {row["chunk_id"]: estimate_tokens(row["bytes"]) for row in rows}
        return [row["chunk_id"] for row in rows]

    def _missing(self, chunk_ids: list[str]) -> list[str]:
        return [row["chunk_id"] for row in self._query_missing(chunk_ids)]

    def _query_missing(self, chunk_ids: list[str]) -> list[dict[str, Any]]:
        if not chunk_ids:
            return []
        return self._of_chunks(
            self.db, "stages/chunks_missing_embedding", chunk_ids, "embed: check", with_text=False
        )

    def _live(self, chunk_ids: list[str]) -> list[dict[str, Any]]:
        if not chunk_ids:
            return []
        return self._of_chunks(
            self.db, "batches/live_submissions", chunk_ids, "embed: live batches"
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
            self.blame(cid, failure)
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
            self.submitter.send(sub["submission"])
            return
        job = self.api.get(sub["batch_id"])
        if job.finished:
            Collector(self, sub["submission"], job).collect()

    def forget_file(self, file_id: str) -> None:
        try:
            self.api.delete_file(file_id)
        except Exception:  # the orphan sweep deletes it later
            log.warning("embed: could not delete the provider file %s", file_id, exc_info=True)
