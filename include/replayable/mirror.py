"""The index mirrors the sources (ADR 0138): deletions and updates flow through.

A run over a whole source (a folder or a file, not a glob's subset; a re-run or a redrive
lists nothing) compares its listing with the last complete listing of that source. A
document none of whose paths holds it any more, in this source or another, is retracted:
it leaves search at once, a ``document.deleted`` event (``document.updated`` when a path of
it now holds other bytes) goes through the outbox, and the sweep removes what only it held
after :data:`RETENTION_DAYS`. A retracted document found again by any run is restored,
with every output it had, so with no model call.

The guard: a listing that is empty, or that missed a folder it could not read, retracts
nothing; nor does one that would retract more than ``max_retract_fraction`` of the
documents the last listing held, unless the run confirms that exact number with
``confirm_retract``. The last listing then stays, and the run says why. Nothing here
imports Airflow.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from replayable import sources
from replayable.db import Connection, execute, fetch_all

log = logging.getLogger(__name__)

# How long a retracted document's text, chunks and vectors are kept before the sweep
# removes what no other document holds: a week to notice a mistake and bring files back.
RETENTION_DAYS = 7
# Documents one sweep purges at most (each purge is one transaction).
PURGE_LIMIT = 1000


@dataclass(frozen=True)
class Policy:
    """How far a run may retract: a share of the last listing's documents, or exactly the
    ``confirm`` documents a person counted (the override a refusal names)."""

    max_fraction: float = 0.2
    confirm: int | None = None


def source_key(source: str) -> str:
    """The name a source's listing is kept under: its path, resolved."""
    return os.path.realpath(os.path.expanduser(source))


def mirror(
    conn: Connection,
    source: str,
    *,
    dag_id: str,
    run_id: str,
    unlisted: Sequence[str] = (),
    policy: Policy | None = None,
) -> dict[str, Any]:
    """Restore the retracted documents this run found, then, for a whole ``source`` under a
    ``policy``, retract what its listing lost, unless the guard refuses. Runs in discover's
    transaction (its temporary tables ``discover_found``); returns the comparison's counts.
    """
    which = {"dag_id": dag_id, "run_id": run_id}
    execute(conn, "mirror/restore", which)
    if policy is None or not sources.is_whole(source):
        return {}
    params = {**which, "source": source_key(source)}
    counts = fetch_all(conn, "mirror/compare", params)[0]
    reason = refusal(source, counts, list(unlisted), policy)
    if reason is None:
        execute(conn, "mirror/apply", params)
        if counts["deleted"] or counts["updated"]:
            log.info(
                "%s: %d document(s) retracted as deleted, %d superseded as updated",
                source,
                counts["deleted"],
                counts["updated"],
            )
    else:
        execute(conn, "mirror/refuse", {**which, "reason": reason})
        log.warning("%s", reason)
    return {**counts, "refused": reason}


def refusal(
    source: str, counts: Mapping[str, Any], unlisted: Sequence[str], policy: Policy
) -> str | None:
    """Why the listing of ``source`` may not retract what it lost; None when it may."""
    before = int(counts["listed_before"])
    retract = int(counts["deleted"]) + int(counts["updated"])
    if not retract:
        return None
    if unlisted:
        shown = ", ".join(list(unlisted)[:3]) + (" …" if len(unlisted) > 3 else "")
        return (
            f"nothing retracted: {len(unlisted)} folder(s) of {source} could not be listed "
            f"({shown}), so the listing is incomplete; fix their permissions or mount and run "
            "again"
        )
    if not int(counts["listed_now"]):
        return (
            f"nothing retracted: the listing of {source} is empty, where the last complete "
            f"listing held {before} document(s); an unmounted volume or an expired credential "
            "looks the same, so an empty listing never retracts"
        )
    fraction = retract / max(before, 1)
    if fraction <= policy.max_fraction or policy.confirm == retract:
        return None
    return (
        f"nothing retracted: {retract} of the {before} document(s) of {source}'s last listing "
        f"are gone or changed (a fraction of {fraction:.4g}), over max_retract_fraction "
        f"{policy.max_fraction:g}; if they were removed on purpose, run again with conf "
        f"{json.dumps({'confirm_retract': retract})}"
    )


def run_counts(conn: Connection, *, dag_id: str, run_id: str) -> dict[str, Any]:
    """What the run did to the index: retracted, superseded, restored; why it refused."""
    row = fetch_all(conn, "mirror/run_counts", {"dag_id": dag_id, "run_id": run_id})[0]
    return {
        "retracted": int(row["retracted"]),
        "superseded": int(row["superseded"]),
        "restored": int(row["restored"]),
        "refused": row["refused"],
    }


def report_line(counts: Mapping[str, Any] | None) -> str | None:
    """The report's line about the index, when the run changed it or refused to."""
    if not counts:
        return None
    line = (
        f"index: {counts['retracted']} retracted (deleted), {counts['superseded']} superseded "
        f"(updated), {counts['restored']} restored"
    )
    if counts.get("refused"):
        line += f"\n  {counts['refused']}"
    elif not (counts["retracted"] or counts["superseded"] or counts["restored"]):
        return None
    return line


def retracted(conn: Connection) -> dict[str, int]:
    """Documents out of search now, and how many of them are purged."""
    row = fetch_all(conn, "mirror/retracted")[0]
    return {"retracted": int(row["retracted"]), "purged": int(row["purged"])}


def purge(
    conn: Connection, *, retention_days: float = RETENTION_DAYS, limit: int = PURGE_LIMIT
) -> int:
    """Remove what documents retracted over ``retention_days`` ago alone held; commit."""
    rows = fetch_all(conn, "mirror/purge", {"retention_days": retention_days, "limit": limit})
    conn.commit()
    return len(rows)
