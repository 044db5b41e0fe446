"""``replayable failed``, ``dead-letters`` and ``outbox list``: what failed, and the backlog."""

from __future__ import annotations

from typing import Any

from replayable import db, views


def failed_data(
    conn: db.Connection, stage: str | None, error_classes: list[str] | None, limit: int
) -> dict[str, Any]:
    """Items whose current status is failed, newest first, and how many match in all."""
    page = views.failed_items(conn, stage=stage, error_classes=error_classes, limit=limit)
    return {"matched": page.matched, "items": page.rows}


def dead_letters_data(
    conn: db.Connection, stage: str | None, status: str, limit: int
) -> dict[str, Any]:
    """Dead letters (``status`` "all" for every status), newest first."""
    page = views.dead_letters(conn, stage=stage, status=status, limit=limit)
    return {"matched": page.matched, "dead_letters": page.rows}


def outbox_data(conn: db.Connection, status: str, limit: int) -> dict[str, Any]:
    """Counts per status (from the counters), the backlog's age, and events of ``status``."""
    counts = views.outbox_counts(conn)
    return {
        "counts": counts.by_status(),
        "oldest_pending_age_s": counts.oldest_pending_age_s,
        "status": status,
        "events": views.outbox_events(conn, status, limit),
    }
