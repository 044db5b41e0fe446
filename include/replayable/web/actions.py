"""The UI's changes to the dead-letter work list: ignore, assign, and redrive.

Every change is a form post from a page, refused unless it comes from the page's own origin
(or with a bearer token) and the user may edit ``document_pipeline`` (trigger it, for a
redrive) (:mod:`.security`). Ignore and assign change an open letter and record the change,
with its actor, in the letter's history (ADR 0015); then they lead back to the list with the
filters the form carried along. A redrive only reads the ledger and asks Airflow for the
runs (:mod:`.redrive`).
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

from airflow.api_fastapi.core_api.security import GetUserDep
from fastapi import APIRouter, Depends, Form, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse
from pydantic import AfterValidator, Field

from replayable import db
from replayable.web.database import WriteConn, pooled
from replayable.web.filters import (
    LetterFilters,
    LetterForm,
    LetterId,
    OpenLetterForm,
    kept,
)
from replayable.web.models import ANY_ROUTE, ONE, RedriveRun, Responses, problem
from replayable.web.redrive import airflow_api_root, ask_airflow, plan_redrive
from replayable.web.render import page
from replayable.web.security import (
    callers_token,
    require_edit_access,
    require_same_origin,
    require_trigger_access,
)

_OWNER_MAX = 200
_NOTE_MAX = 2000
# Free text people type: no control characters but tab and line breaks (Postgres refuses NUL,
# terminals act on the rest).
_CONTROL = r"\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f"
_TEXT = rf"^[^{_CONTROL}]*$"
_REASON = rf"^[^{_CONTROL}]*[^\s{_CONTROL}][^{_CONTROL}]*$"  # and not only spaces


def _at_least_three(text: str) -> str:
    text = text.strip()
    if len(text) < 3:
        raise ValueError("say why in at least 3 characters")
    return text


OwnerField = Annotated[str, Form(max_length=_OWNER_MAX, pattern=_TEXT)]
NoteField = Annotated[str, Form(max_length=_NOTE_MAX, pattern=_TEXT)]
# A resolution must say why (ADR 0007): at least one character that is not a space.
ReasonField = Annotated[str, Form(min_length=1, max_length=_NOTE_MAX, pattern=_REASON)]
# A redrive's reason goes into the run's conf, whose schema wants one line of 3 or more.
RedriveReasonField = Annotated[
    str,
    AfterValidator(_at_least_three),
    Form(min_length=3, max_length=_NOTE_MAX, pattern=r"^[^\x00-\x1f\x7f-\x9f]*$"),
]
RedriveScope = Literal["selected", "matching"]
LetterIds = Annotated[list[Annotated[int, Field(ge=1, le=2**63 - 1)]] | None, Form(max_length=500)]
ReturnField = Annotated[Literal["list", "letter"], Form()]

_CHANGE: Responses = {**ONE, 409: problem("The letter is no longer open")}
_REDRIVE: Responses = {
    400: problem("No letter ticked, or Airflow rejected the run's conf"),
    409: problem("No open dead letter matches"),
    502: problem("Airflow's REST API could not be reached, or failed"),
}
_EDIT = [Depends(require_same_origin), Depends(require_edit_access)]

router = APIRouter(responses=ANY_ROUTE)


def change_open_letter(conn: db.Connection, query: str, params: dict[str, Any]) -> None:
    """Run ``query`` on the open letter ``params["id"]`` and commit; 404/409 if it cannot."""
    if db.execute(conn, query, params) == 1:
        conn.commit()
        return
    conn.rollback()
    found = db.fetch_all(conn, "views/dead_letter_status", {"id": params["id"]})
    if not found:
        raise HTTPException(HTTPStatus.NOT_FOUND, f"no dead letter {params['id']}")
    raise HTTPException(
        HTTPStatus.CONFLICT,
        f"dead letter {params['id']} is {found[0]['status']}; only open letters can change",
    )


def _back(letter_id: int, return_to: str, filters: LetterFilters) -> RedirectResponse:
    # Relative, so that it works under any mount point and [api] base_url:
    # .../dead-letters/<id>/<action> → .../dead-letters/<id> or .../dead-letters
    if return_to == "letter":
        return RedirectResponse(f"../{letter_id}", HTTPStatus.SEE_OTHER)
    query = urlencode(kept(filters.shown()))
    return RedirectResponse(f"../../dead-letters?{query}", HTTPStatus.SEE_OTHER)


@router.post(
    "/dead-letters/{letter_id}/ignore",
    dependencies=_EDIT,
    status_code=HTTPStatus.SEE_OTHER,
    response_class=RedirectResponse,
    responses=_CHANGE,
)
def ignore_dead_letter(
    letter_id: LetterId,
    user: GetUserDep,
    conn: WriteConn,
    reason: ReasonField,
    filters: LetterForm,
    return_to: ReturnField = "list",
) -> RedirectResponse:
    """Resolve an open letter as ignored, recording who, when and why; its note stays."""
    params = {"id": letter_id, "by": user.get_name(), "reason": reason.strip()}
    change_open_letter(conn, "dead_letters/ignore", params)
    return _back(letter_id, return_to, filters)


@router.post(
    "/dead-letters/{letter_id}/assign",
    dependencies=_EDIT,
    status_code=HTTPStatus.SEE_OTHER,
    response_class=RedirectResponse,
    responses=_CHANGE,
)
def assign_dead_letter(
    letter_id: LetterId,
    user: GetUserDep,
    conn: WriteConn,
    filters: LetterForm,
    owner: OwnerField = "",
    note: NoteField = "",
    return_to: ReturnField = "list",
) -> RedirectResponse:
    """Set an open letter's owner and note (a blank field clears it); the history keeps both."""
    params = {
        "id": letter_id,
        "by": user.get_name(),
        "owner": owner.strip() or None,
        "note": note.strip() or None,
    }
    change_open_letter(conn, "dead_letters/assign", params)
    return _back(letter_id, return_to, filters)


@router.post(
    "/dead-letters/redrive",
    dependencies=[Depends(require_same_origin), Depends(require_trigger_access)],
    response_class=HTMLResponse,
    responses=_REDRIVE,
)
async def redrive_dead_letters(
    request: Request,
    user: GetUserDep,
    token: Annotated[str, Depends(callers_token)],
    reason: RedriveReasonField,
    scope: Annotated[RedriveScope, Form()],
    filters: OpenLetterForm,
    ids: LetterIds = None,
) -> HTMLResponse:
    """Redrive the ticked open letters, or every open letter the filters match (ADR 0062).

    Triggers ``document_pipeline`` with a ``redrive`` conf through Airflow's REST API as the
    logged-in user (their own JWT), one run per stage, and shows the runs it started. The
    ledger is only read here: the run itself closes the letters as redriven. The letters are
    read in a worker thread whose connection is given back before Airflow is asked, and
    Airflow is awaited on the event loop (ADR 0073).
    """
    if scope == "selected" and not ids:
        raise HTTPException(HTTPStatus.BAD_REQUEST, "Tick the letters to redrive first.")
    selected = scope == "selected"
    by = user.get_name()

    def plan() -> list[RedriveRun]:
        with pooled(request.app.state.pool, readonly=True) as conn:
            return plan_redrive(
                conn,
                by=by,
                reason=reason,
                ids=list(dict.fromkeys(ids or [])) if selected else None,
                stage=None if selected else filters.stage,
                error_classes=None if selected else filters.error_classes,
                since=None if selected else filters.since,
                until=None if selected else filters.until,
            )

    runs = await run_in_threadpool(plan)
    runs = await ask_airflow(
        runs, api_root=airflow_api_root(request), token=token, by=by, reason=reason
    )
    back = urlencode(kept(filters.shown()))
    return page("redrive.html", root="../", runs=runs, reason=reason, back=back)
