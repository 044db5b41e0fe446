"""The UI's JSON API under ``api/``: the pages' data, for scripts and other tools.

Each list route takes the same filters as its page (:mod:`.filters`) and returns the model
the page renders (:mod:`.models`), with full errors, tracebacks and histories; the search
returns the chunks its page lists (:mod:`.search`).
"""

from __future__ import annotations

from typing import Annotated

from airflow.api_fastapi.core_api.security import GetUserDep
from fastapi import APIRouter, Query, Request

from replayable import invariants
from replayable.web.database import ReadConn
from replayable.web.filters import FailedQuery, LetterId, LetterQuery
from replayable.web.models import (
    ANY_ROUTE,
    ONE,
    PAGED,
    SEARCHED,
    CheckReport,
    DeadLetter,
    DeadLetterList,
    FailedList,
    LettersPerHour,
    SearchAnswer,
    Summary,
)
from replayable.web.reads import dead_letter, failed_list, letter_list, letters_per_hour, summary
from replayable.web.search import (
    DEFAULT_K,
    Dimensions,
    Hits,
    Mode,
    ModelName,
    Question,
    Source,
    find,
    search_input,
)

router = APIRouter(responses=ANY_ROUTE)

# How long each statement of a check may take: the whole ledger is read, about 20 s at a
# million documents (B22), past the UI's usual statement timeout.
CHECK_TIMEOUT_S = 120.0


@router.get("/api/summary")
def summary_api(conn: ReadConn) -> Summary:
    """The overview as JSON."""
    return summary(conn)


# Before /api/dead-letters/{letter_id}, which would otherwise take "per-hour" for an id.
@router.get("/api/dead-letters/per-hour")
def letters_per_hour_api(conn: ReadConn) -> LettersPerHour:
    """The overview's chart as JSON: letters created per hour over the last 48 hours (UTC)."""
    return letters_per_hour(conn)


@router.get("/api/failed", responses=PAGED)
def failed_api(conn: ReadConn, filters: FailedQuery) -> FailedList:
    """The failed list as JSON; ``next_after`` is the cursor of the next page."""
    return failed_list(conn, filters)


@router.get("/api/dead-letters", responses=PAGED)
def dead_letters_api(conn: ReadConn, filters: LetterQuery) -> DeadLetterList:
    """The dead-letter list as JSON, with full errors, tracebacks and histories."""
    return letter_list(conn, filters)


@router.get("/api/dead-letters/{letter_id}", responses=ONE)
def dead_letter_api(conn: ReadConn, letter_id: LetterId) -> DeadLetter:
    """One dead letter as JSON, with its history."""
    return dead_letter(conn, letter_id)


@router.get("/api/search", responses=SEARCHED)
async def search_api(
    request: Request,
    user: GetUserDep,
    q: Question,
    k: Hits = DEFAULT_K,
    source: Source = None,
    model: ModelName = None,
    mode: Mode = "hybrid",
    run: ModelName = None,
    dimensions: Dimensions = None,
) -> SearchAnswer:
    """The ``k`` chunks best for the question ``q``, as JSON: of the documents whose URI
    starts with ``source``, among the vectors of ``model`` (default: the model that holds
    the current vectors), by ``mode``: ``vector``, ``text`` (shared words) or ``hybrid``
    (both, fused by reciprocal rank); under the settings of the run ``run`` (default: the
    pipeline's most recent complete run), at ``dimensions`` (default: the settings'; 0: the
    model's own size, ADR 0151). The answer says what it covered. At most
    ``[replayable] searches_per_user_per_minute`` a minute per user (429, ADR 0153)."""
    asked = search_input(q, k, source, model, mode, run, dimensions)
    return await find(request, asked, user.get_name())


Quiescent = Annotated[bool, Query(description="no run, sweep or redrive is in progress")]
Limit = Annotated[int, Query(ge=1, le=1000, description="rows listed per invariant")]


def check(conn: ReadConn, quiescent: bool, limit: int) -> CheckReport:
    """The ledger against its invariants, for the check's page and its JSON twin."""
    found = invariants.run_check(conn, quiescent=quiescent, limit=limit, timeout_s=CHECK_TIMEOUT_S)
    return CheckReport.model_validate(found.as_dict())


@router.get("/api/check")
def check_api(conn: ReadConn, quiescent: Quiescent = False, limit: Limit = 100) -> CheckReport:
    """The ledger against its invariants, as ``replayable check --json`` prints it (ADR 0150).

    Reads the whole ledger in one read-only snapshot: seconds on a large one.
    """
    return check(conn, quiescent, limit)
