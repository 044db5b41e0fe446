"""The Replayable UI inside Airflow: ledger overview, failed items, the dead-letter work list.

:func:`create_app` builds a FastAPI app that the plugin mounts on the API server. It serves
HTML pages (shown in an iframe at ``/plugin/replayable``) and the same data as JSON under
``api/``. Three things keep it safe to mount:

* **Authentication.** A Starlette mount inherits none of Airflow's per-route auth, so the
  app itself depends on Airflow's ``requires_access_view(AccessView.PLUGINS)``: a request
  needs a valid Airflow JWT (``Authorization: Bearer`` or the UI's ``_token`` cookie) of a
  user allowed to see plugins. Changing the work list also asks the auth manager about the
  custom view ``Replayable`` with method ``PUT``.
* **CSRF.** The UI cookie authenticates plugin requests, so a page on another origin could
  make a browser post to us with it. ``SameSite=Lax`` stops other *sites*, not other ports
  or subdomains of the same site; so every POST authenticated by the cookie must carry an
  ``Origin`` (or, failing that, ``Referer``) whose host is the request's ``Host`` or the
  host of ``[api] base_url``. Requests with a bearer token are exempt: a browser never adds
  one on its own.
* **Escaping.** Templates render with Jinja2 autoescaping on and never mark data safe; the
  pages carry no script, and a Content-Security-Policy forbids any.

Every SQL value is bound (queries live in ``sql/queries/web_*.sql`` and reuse the CLI's
read queries); a database connection is opened per request and closed after it.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from http import HTTPStatus
from pathlib import Path
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlencode, urlsplit

import jinja2
import psycopg2.errors
from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_view
from airflow.configuration import conf
from fastapi import APIRouter, Depends, FastAPI, Form, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from pydantic import BaseModel, BeforeValidator

from replayable import db
from replayable.settings import STAGES
from replayable.web.metrics import router as metrics_router

log = logging.getLogger(__name__)

DSN_CONN_ID = "replayable_db"
RESOURCE_NAME = "Replayable"

Stage = Literal["extract", "chunk", "embed"]  # replayable.settings.STAGES; a test checks
LetterStatus = Literal["open", "redriven", "ignored", "all"]
Limit = Annotated[int, Query(ge=1, le=500)]
After = Annotated[str | None, Query(max_length=400, pattern=r"^[A-Za-z0-9_-]+$")]

_OWNER_MAX = 200
_NOTE_MAX = 2000

# No script at all: an injected tag cannot run even if escaping were ever lost. Framing is
# limited to Airflow's own origin, where the UI shows this page in an iframe.
_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
    "form-action 'self'; frame-ancestors 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
}


# ---- data shapes (the JSON API returns these; the pages render them) ---------------------


class StageSummary(BaseModel):
    """Items of one stage by their current status, and its open dead letters."""

    stage: str
    pending: int = 0
    running: int = 0
    done: int = 0
    failed: int = 0
    dead: int = 0
    total: int = 0
    open_dead_letters: int = 0


class Summary(BaseModel):
    """Every stage (in pipeline order, empty ones too) and the open dead letters in all."""

    stages: list[StageSummary]
    open_dead_letters: int


class FailedItem(BaseModel):
    """An item whose current status in a stage is failed."""

    stage: str
    item_key: str
    doc_id: str
    uri: str | None
    attempts: int
    error_class: str | None
    last_error: str | None
    code_version: str
    dag_id: str | None
    run_id: str | None
    map_index: int | None
    try_number: int | None = None
    updated_at: datetime


class FailedList(BaseModel):
    """Failed items, newest first; ``matched`` counts them all, ``items`` up to the limit.

    ``next_after`` is the keyset cursor of the next page (pass it as ``after``), if any.
    """

    matched: int
    items: list[FailedItem]
    next_after: str | None = None


class DeadLetter(BaseModel):
    """One row of the dead-letter queue, with its full error and its resolution."""

    id: int
    stage: str
    item_key: str
    doc_id: str
    uri: str | None
    error_class: str
    error_kind: str
    error: str
    traceback: str | None
    attempts: int
    code_version: str
    dag_id: str | None
    run_id: str | None
    map_index: int | None
    status: str
    owner: str | None
    note: str | None
    created_at: datetime
    resolved_at: datetime | None
    resolved_by: str | None


class DeadLetterList(BaseModel):
    """Dead letters, newest first; ``matched`` counts them all; ``next_after`` pages on."""

    matched: int
    dead_letters: list[DeadLetter]
    next_after: str | None = None


# ---- queries -----------------------------------------------------------------------------


def summary(conn: db.Connection) -> Summary:
    """Items per stage by current status (the CLI's ``status`` queries), open dead letters."""
    params = {"run_id": None, "stages": list(STAGES)}
    counts = {row["stage"]: row for row in db.fetch_all(conn, "cli_status_stages", params)}
    dead = {row["stage"]: row for row in db.fetch_all(conn, "cli_status_dead_letters", params)}
    stages = [
        StageSummary(
            **counts.get(stage, {"stage": stage}),
            open_dead_letters=dead.get(stage, {}).get("n_open", 0),
        )
        for stage in [*STAGES, *sorted({*counts, *dead} - set(STAGES))]
    ]
    return Summary(stages=stages, open_dead_letters=sum(s.open_dead_letters for s in stages))


def failed_items(
    conn: db.Connection,
    stage: str | None,
    error_classes: list[str] | None,
    limit: int,
    after: str | None = None,
) -> FailedList:
    """Items whose current status is failed, newest first, one keyset page at a time."""
    at, after_stage, after_doc = _cursor(after, 3) if after else (None, None, None)
    rows = db.fetch_all(
        conn,
        "failed_items",
        {
            "stage": stage,
            "error_classes": error_classes,
            "limit": limit,
            "after_updated_at": at,
            "after_stage": after_stage,
            "after_doc_id": after_doc,
        },
    )
    matched = _matched(rows)
    items = [FailedItem(**row) for row in rows]
    last = items[-1] if len(items) == limit else None
    next_after = None
    if last is not None:
        next_after = _make_cursor(last.updated_at.isoformat(), last.stage, last.doc_id)
    return FailedList(matched=matched, items=items, next_after=next_after)


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
    at, after_id = _cursor(after, 2) if after else (None, None)
    params = {
        "stage": stage,
        "status": None if letter_status == "all" else letter_status,
        "error_classes": error_classes,
        "since": since,
        "until": until,
        "limit": limit,
        "after_created_at": at,
        "after_id": int(after_id) if after_id is not None else None,
    }
    rows = db.fetch_all(conn, "list_dead_letters", params)
    matched = _matched(rows)
    letters = [DeadLetter(**r) for r in rows]
    last = letters[-1] if len(letters) == limit else None
    next_after = _make_cursor(last.created_at.isoformat(), str(last.id)) if last else None
    return DeadLetterList(matched=matched, dead_letters=letters, next_after=next_after)


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
        if parts == 2:
            int(fields[1])
    except ValueError as err:
        raise HTTPException(HTTPStatus.BAD_REQUEST, f"after: not a page cursor ({err})") from err
    return fields


def change_open_letter(conn: db.Connection, query: str, params: dict[str, Any]) -> None:
    """Run ``query`` on the open letter ``params["id"]`` and commit; 404/409 if it cannot."""
    if db.execute(conn, query, params) == 1:
        conn.commit()
        return
    conn.rollback()
    found = db.fetch_all(conn, "web_dead_letter_status", {"id": params["id"]})
    if not found:
        raise HTTPException(HTTPStatus.NOT_FOUND, f"no dead letter {params['id']}")
    raise HTTPException(
        HTTPStatus.CONFLICT,
        f"dead letter {params['id']} is {found[0]['status']}; only open letters can change",
    )


def _matched(rows: list[dict[str, Any]]) -> int:
    """Take the window count off every row; it is the same on each."""
    counts = [int(row.pop("matched")) for row in rows]
    return counts[0] if counts else 0


# ---- dependencies ------------------------------------------------------------------------


def _open(request: Request) -> db.Connection:
    provider: Callable[[], str] = request.app.state.dsn_provider
    try:
        return db.connect(provider())
    # A missing Airflow connection or an unreachable server both mean the same to the
    # person looking at the page; the details go to the API server's log.
    except Exception as err:
        log.warning("replayable UI cannot reach its database: %s", err)
        raise HTTPException(
            HTTPStatus.SERVICE_UNAVAILABLE,
            f"The replayable database is unavailable; check the Airflow connection "
            f"{DSN_CONN_ID!r}.",
        ) from err


def _read_connection(request: Request) -> Iterator[db.Connection]:
    conn = _open(request)
    try:
        conn.set_session(readonly=True, autocommit=True)
        yield conn
    finally:
        conn.close()


def _write_connection(request: Request) -> Iterator[db.Connection]:
    conn = _open(request)
    try:
        yield conn
    finally:
        conn.close()  # without a commit, closing rolls back


ReadConn = Annotated[db.Connection, Depends(_read_connection)]
WriteConn = Annotated[db.Connection, Depends(_write_connection)]


def _allowed_hosts(request: Request) -> set[str]:
    hosts = {request.headers.get("host", "").lower()}
    if base_url := conf.get("api", "base_url", fallback=None):
        hosts.add(urlsplit(base_url).netloc.lower())
    return hosts - {""}


def require_same_origin(request: Request) -> None:
    """Refuse a cookie-authenticated POST that a page on another origin made (CSRF)."""
    if request.headers.get("authorization", "").lower().startswith("bearer "):
        return
    source = request.headers.get("origin") or request.headers.get("referer") or ""
    # "null" (a sandboxed or privacy-stripped origin) has no host and is refused too.
    if urlsplit(source).netloc.lower() not in _allowed_hosts(request):
        raise HTTPException(
            HTTPStatus.FORBIDDEN, "cross-origin request refused (Origin/Referer host)"
        )


def require_edit_access(user: GetUserDep) -> None:
    """Ask the auth manager whether ``user`` may change Replayable's work list."""
    # SimpleAuthManager allows any viewer here; FAB or Keycloak can map it to a permission.
    if not get_auth_manager().is_authorized_custom_view(
        method="PUT", resource_name=RESOURCE_NAME, user=user
    ):
        raise HTTPException(HTTPStatus.FORBIDDEN, "Forbidden")


# ---- pages and API -----------------------------------------------------------------------


def _when(moment: datetime | None) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if moment else ""


def _file_name(uri: str | None) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1] if uri else "?"


_templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).with_name("templates")),
    autoescape=True,  # every template, whatever its name: all output here is HTML
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_templates.filters.update(when=_when, file_name=_file_name)
_templates.globals.update(stages=STAGES, letter_statuses=get_args(LetterStatus))


def _page(name: str, **context: Any) -> HTMLResponse:
    return HTMLResponse(_templates.get_template(name).render(page=name, **context))


def _error_classes(values: list[str] | None) -> list[str] | None:
    """The distinct classes asked for (repeated or comma-separated), or None for any."""
    parts = (part.strip() for value in values or [] for part in value.split(","))
    # The filter form's empty text box submits "": that means any class, not class "".
    return list(dict.fromkeys(p for p in parts if p)) or None


ErrorClasses = Annotated[list[str] | None, Query()]


def _blank_is_none(value: object) -> object:
    # The filter forms' "any" choice submits an empty value.
    return None if value == "" else value


StageFilter = Annotated[Stage | None, BeforeValidator(_blank_is_none), Query()]
StageField = Annotated[Stage | None, BeforeValidator(_blank_is_none), Form()]
OwnerField = Annotated[str, Form(max_length=_OWNER_MAX)]
NoteField = Annotated[str, Form(max_length=_NOTE_MAX)]

router = APIRouter()


@router.get("/", response_class=HTMLResponse)
def overview_page(conn: ReadConn) -> HTMLResponse:
    """Per stage, items by current status; open dead letters."""
    return _page("overview.html", summary=summary(conn))


@router.get("/failed", response_class=HTMLResponse)
def failed_page(
    conn: ReadConn,
    stage: StageFilter = None,
    error_class: ErrorClasses = None,
    limit: Limit = 100,
    after: After = None,
) -> HTMLResponse:
    """Items whose current status is failed, filtered by stage and error class."""
    classes = _error_classes(error_class)
    data = failed_items(conn, stage, classes, limit, after)
    filters = {"stage": stage, "error_class": ", ".join(classes or []), "limit": limit}
    return _page("failed.html", data=data, filters=filters, next_query=_next(filters, data))


@router.get("/dead-letters", response_class=HTMLResponse)
def dead_letters_page(
    conn: ReadConn,
    stage: StageFilter = None,
    status: LetterStatus = "open",
    limit: Limit = 100,
    after: After = None,
) -> HTMLResponse:
    """The dead-letter queue (open letters unless asked otherwise), each row expandable."""
    data = dead_letters(conn, stage, status, limit, after)
    filters = {"stage": stage, "status": status, "limit": limit}
    return _page("dead_letters.html", data=data, filters=filters, next_query=_next(filters, data))


def _next(filters: dict[str, Any], data: FailedList | DeadLetterList) -> str | None:
    """The query string of the next page: the same filters and the cursor."""
    if data.next_after is None:
        return None
    kept = {k: v for k, v in filters.items() if v not in (None, "")}
    return urlencode({**kept, "after": data.next_after})


def _back_to_list(stage: str | None, letter_status: str, limit: int) -> RedirectResponse:
    query = {"status": letter_status, "limit": limit, **({"stage": stage} if stage else {})}
    # Relative, so that it works under any mount point and [api] base_url:
    # .../dead-letters/<id>/<action> → .../dead-letters
    return RedirectResponse(f"../../dead-letters?{urlencode(query)}", HTTPStatus.SEE_OTHER)


_EDIT = [Depends(require_same_origin), Depends(require_edit_access)]


@router.post("/dead-letters/{letter_id}/ignore", dependencies=_EDIT)
def ignore_dead_letter(
    letter_id: int,
    user: GetUserDep,
    conn: WriteConn,
    note: Annotated[str, Form(min_length=1, max_length=_NOTE_MAX)],
    stage: StageField = None,
    status: Annotated[LetterStatus, Form()] = "open",
    limit: Annotated[int, Form(ge=1, le=500)] = 100,
) -> RedirectResponse:
    """Resolve an open letter as ignored, recording who, when and why (the note)."""
    reason = note.strip()
    if not reason:
        # A resolution must say why (ADR 0007); blanks pass min_length, so check here.
        raise HTTPException(HTTPStatus.UNPROCESSABLE_ENTITY, "say why it is ignored")
    params = {"id": letter_id, "by": user.get_name(), "note": reason}
    change_open_letter(conn, "web_ignore_dead_letter", params)
    return _back_to_list(stage, status, limit)


@router.post("/dead-letters/{letter_id}/assign", dependencies=_EDIT)
def assign_dead_letter(
    letter_id: int,
    conn: WriteConn,
    owner: OwnerField = "",
    note: NoteField = "",
    stage: StageField = None,
    status: Annotated[LetterStatus, Form()] = "open",
    limit: Annotated[int, Form(ge=1, le=500)] = 100,
) -> RedirectResponse:
    """Set an open letter's owner and note; a blank field clears it."""
    params = {"id": letter_id, "owner": owner.strip() or None, "note": note.strip() or None}
    change_open_letter(conn, "web_assign_dead_letter", params)
    return _back_to_list(stage, status, limit)


@router.get("/api/summary")
def summary_api(conn: ReadConn) -> Summary:
    """The overview as JSON."""
    return summary(conn)


@router.get("/api/failed")
def failed_api(
    conn: ReadConn,
    stage: StageFilter = None,
    error_class: ErrorClasses = None,
    limit: Limit = 100,
    after: After = None,
) -> FailedList:
    """The failed list as JSON; ``next_after`` is the cursor of the next page."""
    return failed_items(conn, stage, _error_classes(error_class), limit, after)


@router.get("/api/dead-letters")
def dead_letters_api(
    conn: ReadConn,
    stage: StageFilter = None,
    status: LetterStatus = "open",
    limit: Limit = 100,
    after: After = None,
) -> DeadLetterList:
    """The dead-letter list as JSON, with full errors and tracebacks, a page at a time."""
    return dead_letters(conn, stage, status, limit, after)


async def _schema_missing(request: Request, exc: Exception) -> Response:
    return JSONResponse(
        {
            "detail": "The replayable database has no replayable schema yet; run the pipeline "
            "once (or `make start`) to create it."
        },
        HTTPStatus.SERVICE_UNAVAILABLE,
    )


def _default_dsn() -> str:
    # Imported here: replayable.operators loads the task SDK, which only this path needs.
    from replayable.operators import connection_dsn

    return connection_dsn(DSN_CONN_ID)


def create_app(dsn_provider: Callable[[], str] | None = None) -> FastAPI:
    """Build the UI app; ``dsn_provider`` returns the replayable database's DSN per request.

    By default the DSN comes from the Airflow connection ``replayable_db``. Building the app
    touches neither Airflow's auth manager nor any database, so the plugin loads cheaply in
    every Airflow process.
    """
    app = FastAPI(
        title="Replayable",
        # Plugin mounts get none of Airflow's auth: every route requires it here.
        dependencies=[Depends(requires_access_view(AccessView.PLUGINS))],
        # The docs routes would bypass the dependency above; the API is described in the
        # route docstrings instead.
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.dsn_provider = dsn_provider or _default_dsn
    app.include_router(router)
    app.include_router(metrics_router)  # its own auth: Airflow's or the scrape token
    app.add_exception_handler(psycopg2.errors.UndefinedTable, _schema_missing)

    @app.middleware("http")
    async def security_headers(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        response = await call_next(request)
        response.headers.update(_SECURITY_HEADERS)
        return response

    return app
