"""The UI's HTML pages: the overview, the failed list, the dead-letter list, one letter, the
search, and the invariant check.

Each list page takes its filters from :mod:`.filters`, the same declaration as its JSON twin
in :mod:`.api`, and renders the same model. Pages only read, in a read-only transaction; the
forms on them post to :mod:`.actions`. The search page asks :mod:`.search`, as its twin does,
which records the question's model call through the ledger's own connection.
"""

from __future__ import annotations

from typing import Any

from airflow.api_fastapi.core_api.security import GetUserDep
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse

from replayable import db
from replayable.web.api import Limit, Quiescent, check
from replayable.web.charts import chart_bars
from replayable.web.database import ReadConn
from replayable.web.filters import FailedQuery, LetterFilters, LetterId, LetterQuery, next_query
from replayable.web.models import ANY_ROUTE, ONE, PAGED, SEARCH_PAGE, DeadLetterList, FailedList
from replayable.web.reads import (
    dead_letter,
    failed_list,
    letter_list,
    letters_per_hour,
    stages,
    summary,
)
from replayable.web.render import page
from replayable.web.search import DEFAULT_K, find, search_input

router = APIRouter(responses=ANY_ROUTE)


@router.get("/", response_class=HTMLResponse)
def overview_page(conn: ReadConn) -> HTMLResponse:
    """Per stage, items by current status; open dead letters; letters created per hour."""
    chart = letters_per_hour(conn)
    return page("overview.html", summary=summary(conn), chart=chart, bars=chart_bars(chart))


@router.get("/failed", response_class=HTMLResponse, responses=PAGED)
def failed_page(conn: ReadConn, filters: FailedQuery) -> HTMLResponse:
    """Items whose current status is failed, filtered by stage and error class."""
    return _list_page(conn, "failed.html", filters.shown(), failed_list(conn, filters))


@router.get("/dead-letters", response_class=HTMLResponse, responses=PAGED)
def dead_letters_page(conn: ReadConn, filters: LetterQuery) -> HTMLResponse:
    """The dead-letter queue (open letters unless asked otherwise), each row expandable.

    Filters: stage, status, error class and when the letter was created (``since``
    inclusive, ``until`` exclusive; a time without a zone is UTC). Open letters can be ticked
    and redriven, or every open letter the filters match.
    """
    return _list_page(conn, "dead_letters.html", filters.shown(), letter_list(conn, filters))


def _list_page(
    conn: db.Connection, template: str, shown: dict[str, Any], data: FailedList | DeadLetterList
) -> HTMLResponse:
    """A list page: its rows, its filter form, the link to its next page."""
    return page(
        template,
        data=data,
        filters=shown,
        next_query=next_query(shown, data),
        stages=stages(conn),
    )


@router.get("/dead-letters/{letter_id}", response_class=HTMLResponse, responses=ONE)
def dead_letter_page(conn: ReadConn, letter_id: LetterId) -> HTMLResponse:
    """One dead letter: its full error, its resolution and every change made to it."""
    letter = dead_letter(conn, letter_id)
    return page("dead_letter.html", root="../", dl=letter, filters=LetterFilters().shown())


@router.get("/check", response_class=HTMLResponse)
def check_page(conn: ReadConn, quiescent: Quiescent = False, limit: Limit = 100) -> HTMLResponse:
    """The ledger against its invariants (ADR 0150): counts, then each violation."""
    return page("check.html", data=check(conn, quiescent, limit), limit=limit)


@router.get("/search", response_class=HTMLResponse, responses=SEARCH_PAGE)
async def search_page(
    request: Request,
    user: GetUserDep,
    q: str = "",
    k: str = "",
    source: str = "",
    model: str = "",
    mode: str = "",
    run: str = "",
    dimensions: str = "",
) -> HTMLResponse:
    """The search box and the chunks nearest its question; without a question, the box.

    Each parameter comes as the form's text: a value that cannot be searched (400), or a
    search that fails (502, 503) or is one too many this minute (429), is shown in the page
    with its status.
    """
    shown = {
        "q": q,
        "k": k or DEFAULT_K,
        "source": source,
        "model": model,
        "mode": mode,
        "run": run,
        "dimensions": dimensions,
    }
    if not q.strip():
        return page("search.html", shown=shown, found=None, error=None)
    try:
        asked = search_input(q, k, source, model, mode, run, dimensions)
        found = await find(request, asked, user.get_name())
    except HTTPException as refused:
        answer = page(
            "search.html", shown=shown, found=None, error=refused.detail, status=refused.status_code
        )
        answer.headers.update(refused.headers or {})
        return answer
    return page("search.html", shown=shown, found=found, error=None)
