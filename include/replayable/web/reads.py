"""The UI's reads of the ledger: the overview, the failed list and the dead-letter queue.

The reads the CLI makes too come from :mod:`replayable.views`, the one read model of the
ledger; here they become the models (:mod:`.models`) that the JSON API returns and the pages
render. Lists are keyset-paged: a page's last row makes the cursor (``after``) of the next
one, an opaque string here, so a page costs the same at any depth. The reads only the UI
makes (one letter, the letters' histories, the chart) run their own queries from
``sql/queries/views/``, every value bound.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Callable, Sequence
from datetime import datetime
from http import HTTPStatus
from typing import Any, TypeVar

from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError

from replayable import db, mirror, views
from replayable.web.charts import CHART_HOURS
from replayable.web.filters import FailedFilters, LetterFilters
from replayable.web.models import (
    CostSummary,
    DeadLetter,
    DeadLetterList,
    FailedItem,
    FailedList,
    HourCount,
    IndexSummary,
    LetterChange,
    LettersPerHour,
    OutboxSummary,
    RunSummary,
    SearchSummary,
    Summary,
)

_Row = TypeVar("_Row")


def summary(conn: db.Connection) -> Summary:
    """Items per stage by current status (the CLI's ``status`` reads), open dead letters,
    costs, each user's searches (ADR 0153) and the newest runs."""
    stages = views.stage_summaries(conn)
    costs = views.model_costs(conn)
    return Summary(
        stages=stages,
        open_dead_letters=sum(s.open_dead_letters for s in stages),
        outbox=outbox_summary(conn),
        index=IndexSummary(**mirror.retracted(conn)),
        cost=CostSummary(days=views.COST_DAYS, **costs.as_dict()),
        searches=SearchSummary(
            days=views.COST_DAYS,
            by_user=views.search_costs(conn),
        ),
        runs=[RunSummary(**dataclasses.asdict(run)) for run in views.recent_runs(conn)],
    )


def outbox_summary(conn: db.Connection) -> OutboxSummary:
    """The outbox's counts (the metrics' counters) and its oldest pending event's age."""
    counts = views.outbox_counts(conn)
    return OutboxSummary(**dataclasses.asdict(counts))


def stages(conn: db.Connection) -> list[str]:
    """The stages a filter offers: the shipped ones, then those of your own the ledger has."""
    return views.known_stages(conn)


def _known(conn: db.Connection, stage: str | None) -> None:
    """422 for a stage the ledger has no items of: a misspelt filter is an error, not an
    empty page."""
    if stage is not None and stage not in (known := views.known_stages(conn)):
        # As FastAPI answers any other bad query value: a 422 that names the parameter.
        raise RequestValidationError(
            [
                {
                    "type": "enum",
                    "loc": ("query", "stage"),
                    "msg": f"Input should be one of {', '.join(known)}",
                    "input": stage,
                }
            ]
        )


def failed_items(
    conn: db.Connection,
    stage: str | None,
    error_classes: list[str] | None,
    limit: int,
    after: str | None = None,
) -> FailedList:
    """Items whose current status is failed, newest first, one keyset page at a time."""
    _known(conn, stage)
    cursor = _cursor(after, 3) if after else None
    page = views.failed_items(
        conn,
        stage=stage,
        error_classes=error_classes,
        limit=limit,
        after=(cursor[0], cursor[1], cursor[2]) if cursor else None,
    )
    items = [FailedItem(**row) for row in page.rows]
    next_after = _next_after(items, limit, lambda i: (i.updated_at.isoformat(), i.stage, i.doc_id))
    return FailedList(matched=page.matched, items=items, next_after=next_after)


def dead_letters(
    conn: db.Connection,
    stage: str | None,
    letter_status: str,
    limit: int,
    after: str | None = None,
    *,
    error_classes: list[str] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> DeadLetterList:
    """Dead letters with ``letter_status`` ("all" for any), newest first, one page at a time."""
    _known(conn, stage)
    cursor = _cursor(after, 2) if after else None
    page = views.dead_letters(
        conn,
        stage=stage,
        status=letter_status,
        error_classes=error_classes,
        since=since,
        until=until,
        limit=limit,
        after=(cursor[0], int(cursor[1])) if cursor else None,
    )
    letters = _with_history(conn, page.rows)
    next_after = _next_after(letters, limit, lambda d: (d.created_at.isoformat(), str(d.id)))
    return DeadLetterList(matched=page.matched, dead_letters=letters, next_after=next_after)


def failed_list(conn: db.Connection, filters: FailedFilters) -> FailedList:
    """The failed list of ``filters``, as its page and its JSON twin show it."""
    return failed_items(conn, filters.stage, filters.error_classes, filters.limit, filters.after)


def letter_list(conn: db.Connection, filters: LetterFilters) -> DeadLetterList:
    """The dead-letter list of ``filters``, as its page and its JSON twin show it."""
    return dead_letters(
        conn,
        filters.stage,
        filters.status,
        filters.limit,
        filters.after,
        error_classes=filters.error_classes,
        since=filters.since,
        until=filters.until,
    )


def dead_letter(conn: db.Connection, letter_id: int) -> DeadLetter:
    """One dead letter with its history; 404 if there is none with ``letter_id``."""
    rows = db.fetch_all(conn, "views/dead_letter", {"id": letter_id})
    if not rows:
        raise HTTPException(HTTPStatus.NOT_FOUND, f"no dead letter {letter_id}")
    return _with_history(conn, rows)[0]


def letters_per_hour(conn: db.Connection, hours: int = CHART_HOURS) -> LettersPerHour:
    """Dead letters created in each of the last ``hours`` hours (UTC), zeros included."""
    rows = db.fetch_all(conn, "views/dead_letters_per_hour", {"hours": hours})
    per_hour = [HourCount(hour=row["hour"], created=int(row["created"])) for row in rows]
    counts = [h.created for h in per_hour]
    return LettersPerHour(
        hours=hours, per_hour=per_hour, total=sum(counts), peak=max(counts, default=0)
    )


def _with_history(conn: db.Connection, rows: list[dict[str, Any]]) -> list[DeadLetter]:
    """Letters from ``rows``, each with its changes, read in one query for all of them."""
    changes: dict[int, list[LetterChange]] = {}
    if rows:
        ids = [row["id"] for row in rows]
        for change in db.fetch_all(conn, "views/dead_letter_history", {"ids": ids}):
            changes.setdefault(change.pop("letter_id"), []).append(LetterChange(**change))
    return [DeadLetter(**row, history=changes.get(row["id"], [])) for row in rows]


def _next_after(
    rows: Sequence[_Row], limit: int, key: Callable[[_Row], Sequence[str]]
) -> str | None:
    """The cursor of the page after ``rows``, made of ``key`` of its last; None when the page
    is not full (there is no next page)."""
    return _make_cursor(*key(rows[-1])) if rows and len(rows) == limit else None


def _make_cursor(*parts: str) -> str:
    return base64.urlsafe_b64encode("\x00".join(parts).encode()).decode().rstrip("=")


def _cursor(value: str, parts: int) -> tuple[str, ...]:
    """Decode a keyset cursor made by :func:`_make_cursor`; 400 if it is not one."""
    try:
        padded = value + "=" * (-len(value) % 4)
        fields = tuple(base64.urlsafe_b64decode(padded.encode()).decode().split("\x00"))
        if len(fields) != parts:
            raise ValueError(f"expected {parts} fields")
        datetime.fromisoformat(fields[0])
        if parts == 2 and not 0 < int(fields[1]) < 2**63:
            raise ValueError("not a letter id")
    except ValueError as err:
        raise HTTPException(HTTPStatus.BAD_REQUEST, f"after: not a page cursor ({err})") from err
    return fields
