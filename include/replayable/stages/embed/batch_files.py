"""The sweeper's housekeeping of the Batch API: the provider's files and the ledger's
finished submissions (ADR 0117, 0131).

The embed stage's batch mode (:mod:`.batch_mode`) deletes the files it collected; a file
uploaded by a worker that died before recording it is left for this sweep. Submissions
collected or abandoned before a retention are forgotten with their lines, so the batch
tables grow with the work in flight, not with every batch ever sent.
"""

from __future__ import annotations

import time

from replayable.db import Connection, execute, fetch_all
from replayable.stages.embed.batch_api import BatchApi, submission_of

# How long a finished submission's lines are kept: what they say (a line refused or lost,
# the windows a line missed) holds for this long (ADR 0130).
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
    """Delete the provider's batch input files of ours that no submission records.

    A worker killed after its upload and before the file id was committed leaves the file
    at the provider; the submission that resumes finds it by name and uses it, so an
    orphan is only a file whose submission was recorded under another file or never at all.
    """
    cutoff = time.time() - older_than_s
    candidates = {
        str(item["id"]): submission
        for item in api.files()
        if (submission := submission_of(str(item.get("filename") or ""))) is not None
        and float(item.get("created_at") or 0) <= cutoff
    }
    if not candidates:
        return []
    known = {
        row["file_id"]
        for row in fetch_all(
            conn,
            "batches/known_file",
            {"file_ids": list(candidates), "submissions": list(candidates.values())},
        )
    }
    conn.commit()
    deleted = [file_id for file_id in candidates if file_id not in known]
    for file_id in deleted:
        api.delete_file(file_id)
    return deleted
