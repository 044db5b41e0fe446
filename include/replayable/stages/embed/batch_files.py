"""The sweeper's housekeeping of the Batch API: the provider's files and the ledger's
finished submissions (ADR 0117, 0148).

The embed stage's batch mode (:mod:`.batch`) deletes the files it collected; a file
uploaded by a worker that died before recording it, and the files of a finished batch that
a collect could not delete, are left for this sweep. Submissions
collected or abandoned before a retention are forgotten with their lines, so the batch
tables grow with the work in flight, not with every batch ever sent.
"""

from __future__ import annotations

import time

from replayable.db import Connection, execute, fetch_all
from replayable.models.batch_api import BatchApi, submission_of

# How long a finished submission's lines are kept: what they say (a line refused or lost,
# the windows a line missed) holds for this long (ADR 0146).
RETENTION_DAYS = 30


def prune_finished_submissions(
    conn: Connection, retention_days: float = RETENTION_DAYS, chunk: int = 1000
) -> int:
    """Delete submissions collected or abandoned over ``retention_days`` ago, with their
    lines, ``chunk`` at a time (each committed); return how many."""
    pruned = 0
    while True:
        params = {"retention_days": retention_days, "limit": chunk}
        deleted = execute(conn, "batches/prune_finished", params)
        conn.commit()
        pruned += deleted
        if deleted < chunk:
            return pruned


def sweep_orphan_files(api: BatchApi, conn: Connection, older_than_s: float = 3600.0) -> list[str]:
    """Delete the provider's batch files of ours that no submission needs; return their ids.

    - Input files (purpose ``batch``) named after a submission: a worker killed after its
      upload and before the file id was committed leaves the file at the provider; the
      submission that resumes finds it by name and uses it, so one is deleted only when no
      unfinished submission records it or is still being sent under its name.
    - Output and error files (purpose ``batch_output``, named after their batch) of a batch
      whose submission is collected or abandoned. A collect deletes them; these are the
      ones it could not (ADR 0148). Result files of batches the ledger does not know (not
      ours, or pruned) are left alone.
    """
    cutoff = time.time() - older_than_s
    inputs: dict[str, str] = {}
    outputs: dict[str, str] = {}
    for item in api.files(purpose=None):
        if float(item.get("created_at") or 0) > cutoff:
            continue
        name = str(item.get("filename") or "")
        if item.get("purpose") == "batch_output":
            if (batch_id := batch_of(name)) is not None:
                outputs[str(item["id"])] = batch_id
        elif (submission := submission_of(name)) is not None:
            inputs[str(item["id"])] = submission
    if not inputs and not outputs:
        return []
    known = {
        row["file_id"]
        for row in fetch_all(
            conn,
            "batches/known_file",
            {"file_ids": list(inputs), "submissions": list(inputs.values())},
        )
    }
    finished = {
        row["batch_id"]
        for row in fetch_all(
            conn, "batches/finished_batches", {"batch_ids": sorted(set(outputs.values()))}
        )
    }
    conn.commit()
    deleted = [file_id for file_id in inputs if file_id not in known]
    deleted += [file_id for file_id, batch_id in outputs.items() if batch_id in finished]
    for file_id in deleted:
        api.delete_file(file_id)
    return deleted


def batch_of(name: str) -> str | None:
    """The batch a result file is named after (``<batch id>_output.jsonl``,
    ``<batch id>_error.jsonl``, as OpenAI names them), or None."""
    for suffix in ("_output.jsonl", "_error.jsonl"):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name.removesuffix(suffix)
    return None
