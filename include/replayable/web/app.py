"""The Replayable UI inside Airflow: ledger overview, failed items, the dead-letter work list.

:func:`create_app` builds a FastAPI app that the plugin mounts on the API server. It serves
HTML pages (shown in an iframe at ``/plugin/replayable``) and the same data as JSON under
``api/``. What keeps it safe to mount (ADR 0008, 0015):

* **Authentication and roles.** A Starlette mount inherits none of Airflow's per-route auth,
  so the app itself depends on Airflow's ``requires_access_view(AccessView.PLUGINS)``: a
  request needs a valid Airflow JWT (``Authorization: Bearer`` or the UI's ``_token`` cookie).
  Reading also needs permission to read the DAG ``document_pipeline``; changing the work list
  (assign, ignore) needs permission to edit it, both asked through the auth manager's DAG
  authorization (SimpleAuthManager: viewer reads, user, op and admin change).
* **CSRF.** The UI cookie authenticates plugin requests, so a page on another origin could
  make a browser post to us with it. Every POST that is not authenticated by a (non-blank)
  bearer token must carry an ``Origin`` (or, failing that, ``Referer``) whose scheme, host
  and port are the request's own or those of ``[api] base_url``.
* **Escaping and headers.** Templates render with Jinja2 autoescaping on and never mark data
  safe; the pages carry no script, and a Content-Security-Policy forbids any.
* **The database.** A small pool with a statement timeout (:mod:`.pool`); GET routes run in
  read-only transactions. Each change is recorded, with its actor, in the letter's history.

Every SQL value is bound (queries live in ``sql/queries/web_*.sql`` and reuse the CLI's
read queries).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import logging
import pathlib
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from http import HTTPStatus
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlencode, urlsplit

import httpx
import jinja2
import psycopg2
import psycopg2.errors
from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
from airflow.api_fastapi.auth.managers.models.resource_details import (
    AccessView,
    DagAccessEntity,
    DagDetails,
)
from airflow.api_fastapi.core_api.security import (
    GetUserDep,
    bearer_scheme,
    requires_access_view,
)
from airflow.configuration import conf
from fastapi import APIRouter, Depends, FastAPI, Form, HTTPException, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    Field,
    StringConstraints,
    computed_field,
)

from replayable import airflow_http, db
from replayable.settings import STAGES
from replayable.web.metrics import router as metrics_router
from replayable.web.pool import RETRY_AFTER_S, ConnectionPool, PoolBusyError

log = logging.getLogger(__name__)

DSN_CONN_ID = "replayable_db"
UI_DSN_CONN_ID = "replayable_ui_db"  # used instead when it exists
# The DAG whose dead letters these are: reading them needs permission to read it, changing
# them permission to edit it (a test checks it is the DAG file's id).
DAG_ID = "document_pipeline"

Stage = Literal["extract", "chunk", "embed"]  # replayable.settings.STAGES; a test checks
LetterStatus = Literal["open", "redriven", "ignored", "all"]
ReturnTo = Literal["list", "letter"]
Limit = Annotated[int, Query(ge=1, le=500)]
After = Annotated[str | None, Query(max_length=400, pattern=r"^[A-Za-z0-9_-]+$")]
LetterId = Annotated[int, Path(ge=1, le=2**63 - 1)]  # a bigserial
ErrorClass = Annotated[str, StringConstraints(max_length=200, pattern=r"^[A-Za-z0-9_.:, -]*$")]

CHART_HOURS = 48
_OWNER_MAX = 200
_NOTE_MAX = 2000
# Free text people type: no control characters but tab and line breaks (Postgres refuses NUL,
# terminals act on the rest).
_CONTROL = r"\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f"
_TEXT = rf"^[^{_CONTROL}]*$"
_REASON = rf"^[^{_CONTROL}]*[^\s{_CONTROL}][^{_CONTROL}]*$"  # and not only spaces

# No script at all: an injected tag cannot run even if escaping were ever lost. Framing is
# limited to Airflow's own origin, where the UI shows this page in an iframe. Pages hold
# ledger data behind a login: no cache keeps them.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
    "form-action 'self'; frame-ancestors 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "SAMEORIGIN",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-store",
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


class OutboxSummary(BaseModel):
    """The event outbox (ADR 0072): events waiting (the backlog), published and dead.

    ``oldest_pending_age_s`` is how long the oldest waiting event has waited (None: none).
    """

    pending: int = 0
    published: int = 0
    dead: int = 0
    oldest_pending_age_s: float | None = None

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented pattern
    @property
    def oldest_wait(self) -> str | None:
        """The oldest wait for people: "2 h 5 min", "12 min"."""
        if self.oldest_pending_age_s is None:
            return None
        minutes = int(self.oldest_pending_age_s // 60)
        return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


class Summary(BaseModel):
    """Every stage (in pipeline order, empty ones too), the open dead letters in all, and
    the outbox."""

    stages: list[StageSummary]
    open_dead_letters: int
    outbox: OutboxSummary = OutboxSummary()


class AirflowLinks(BaseModel):
    """Where a row's work happened in Airflow's UI, relative to Airflow's base URL (ADR 0060).

    ``run`` is the DAG run, ``task_instance`` the ``batch.<stage>`` task instance (its details)
    and ``log`` its log, of the recorded try when there is one.
    """

    run: str
    task_instance: str
    log: str


def _links(
    dag_id: str | None,
    run_id: str | None,
    stage: str,
    map_index: int | None,
    try_number: int | None,
) -> AirflowLinks | None:
    found = airflow_http.task_links(
        dag_id=dag_id, run_id=run_id, stage=stage, map_index=map_index, try_number=try_number
    )
    return AirflowLinks(**dataclasses.asdict(found)) if found else None


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

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented pattern
    @property
    def links(self) -> AirflowLinks | None:
        """The item's last task try in Airflow's UI."""
        return _links(self.dag_id, self.run_id, self.stage, self.map_index, self.try_number)


class FailedList(BaseModel):
    """Failed items, newest first; ``matched`` counts them all, ``items`` up to the limit.

    ``next_after`` is the keyset cursor of the next page (pass it as ``after``), if any.
    """

    matched: int
    items: list[FailedItem]
    next_after: str | None = None


class LetterChange(BaseModel):
    """One change to a dead letter: who, when, and what the letter became."""

    at: datetime
    actor: str
    action: str
    status: str
    owner: str | None
    note: str | None
    resolution: str | None


class DeadLetter(BaseModel):
    """One row of the dead-letter queue, with its full error, its resolution and history."""

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
    try_number: int | None = None
    status: str
    owner: str | None
    note: str | None
    created_at: datetime
    resolved_at: datetime | None
    resolved_by: str | None
    resolution: str | None = None
    history: list[LetterChange] = []

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented pattern
    @property
    def links(self) -> AirflowLinks | None:
        """The task try that dead-lettered the item, in Airflow's UI."""
        return _links(self.dag_id, self.run_id, self.stage, self.map_index, self.try_number)


class DeadLetterList(BaseModel):
    """Dead letters, newest first; ``matched`` counts them all; ``next_after`` pages on."""

    matched: int
    dead_letters: list[DeadLetter]
    next_after: str | None = None


class HourCount(BaseModel):
    """Dead letters created in the hour that starts at ``hour`` (UTC)."""

    hour: datetime
    created: int


class LettersPerHour(BaseModel):
    """Dead letters created per hour over the last ``hours`` hours, the current hour last."""

    hours: int
    per_hour: list[HourCount]
    total: int
    peak: int


class RedriveRun(BaseModel):
    """One redrive run asked of Airflow: a stage's letters, and the run or Airflow's answer."""

    stage: str
    letters: int
    documents: int
    conf: dict[str, Any]
    run_id: str | None = None
    run_link: str | None = None  # relative to Airflow's base URL
    refused: str | None = None


class Problem(BaseModel):
    """Why a request was refused."""

    detail: str


# ---- queries -----------------------------------------------------------------------------


def summary(conn: db.Connection) -> Summary:
    """Items per stage by current status (the CLI's ``status`` queries), open dead letters."""
    params = {"run_id": None, "stages": list(STAGES)}
    counts = {row["stage"]: row for row in db.fetch_all(conn, "views/status_stages", params)}
    dead = {row["stage"]: row for row in db.fetch_all(conn, "views/status_dead_letters", params)}
    stages = [
        StageSummary(
            **counts.get(stage, {"stage": stage}),
            open_dead_letters=dead.get(stage, {}).get("n_open", 0),
        )
        for stage in [*STAGES, *sorted({*counts, *dead} - set(STAGES))]
    ]
    return Summary(
        stages=stages,
        open_dead_letters=sum(s.open_dead_letters for s in stages),
        outbox=outbox_summary(conn),
    )


def outbox_summary(conn: db.Connection) -> OutboxSummary:
    """The outbox's counts (the metrics' counters) and its oldest pending event's age."""
    counts = {row["status"]: int(row["n"]) for row in db.fetch_all(conn, "metrics/outbox")}
    oldest = db.fetch_all(conn, "outbox/oldest_pending")
    return OutboxSummary(
        pending=counts.get("pending", 0),
        published=counts.get("published", 0),
        dead=counts.get("dead", 0),
        oldest_pending_age_s=float(oldest[0]["age_s"]) if oldest else None,
    )


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
        "views/failed_items",
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
    rows = db.fetch_all(conn, "views/list_dead_letters", params)
    matched = _matched(rows)
    letters = _with_history(conn, rows)
    last = letters[-1] if len(letters) == limit else None
    next_after = _make_cursor(last.created_at.isoformat(), str(last.id)) if last else None
    return DeadLetterList(matched=matched, dead_letters=letters, next_after=next_after)


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


@dataclasses.dataclass(frozen=True)
class _Bar:
    x: int
    y: float
    height: float
    hour: HourCount
    since: str  # the hour's bounds, as the dead-letter filters take them
    until: str


_CHART_BAR_W, _CHART_H = 20, 120  # SVG user units: 48 bars of 20 make 960 wide


def _chart_bars(data: LettersPerHour) -> list[_Bar]:
    """One bar per hour, scaled to the peak; an empty hour gets a 1-unit stub."""
    bars = []
    for i, hour in enumerate(data.per_hour):
        height = max(_CHART_H * hour.created / data.peak, 2.0) if hour.created else 1.0
        bars.append(
            _Bar(
                x=i * _CHART_BAR_W,
                y=_CHART_H - height,
                height=height,
                hour=hour,
                since=_filter_time(hour.hour),
                until=_filter_time(hour.hour + timedelta(hours=1)),
            )
        )
    return bars


def plan_redrive(
    conn: db.Connection,
    *,
    by: str,
    reason: str,
    ids: list[int] | None = None,
    stage: str | None = None,
    error_classes: list[str] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[RedriveRun]:
    """The document_pipeline runs that redrive open dead letters, one per stage; none asked yet.

    The letters are ``ids`` (ticked on the page), or else every open letter matching the
    filters; a filtered redrive ends at ``until`` or, at the latest, when the letters were
    counted, so that letters arriving later are not taken along unseen. 409 if no open letter
    matches. Only reads: :func:`ask_airflow` then triggers the runs, with the connection
    given back (ADR 0073).
    """
    params = {
        "ids": ids,
        "stage": stage,
        "error_classes": error_classes,
        "since": since,
        "until": until,
    }
    scopes = db.fetch_all(conn, "plan/redrive_scope", params)
    if not scopes:
        raise HTTPException(HTTPStatus.CONFLICT, "No open dead letter matches: nothing to redrive.")
    runs: list[RedriveRun] = []
    for scope in scopes:
        selection: dict[str, Any] = {"stage": scope["stage"]}
        if ids is not None:
            selection["ids"] = [int(i) for i in scope["ids"]]
        else:
            if error_classes:
                selection["error_class"] = error_classes
            if since is not None:
                selection["since"] = since.isoformat()
            as_of: datetime = scope["as_of"]
            selection["until"] = (as_of if until is None else min(until, as_of)).isoformat()
        selection.update(reason=reason, by=by)
        runs.append(
            RedriveRun(
                stage=scope["stage"],
                letters=int(scope["letters"]),
                documents=int(scope["documents"]),
                conf={"redrive": selection},
            )
        )
    return runs


async def ask_airflow(
    runs: list[RedriveRun], *, api_root: str, token: str, by: str, reason: str
) -> list[RedriveRun]:
    """Ask Airflow's REST API for each planned run, with ``token``, the caller's own JWT.

    Airflow checks their permission and records them as the triggering user. The first
    refusal stops: raised as the page's answer if no run has started, else recorded on the
    run it refused. Awaited, so that no worker thread of the API server waits for the API
    server (ADR 0073).
    """
    stopped: str | None = None
    for number, run in enumerate(runs):
        if stopped is not None:
            run.refused = f"not asked: {stopped}"
            continue
        note = f"Redrive of {run.letters} {run.stage} dead letters by {by}: {reason}"
        try:
            started = await airflow_http.trigger_run_async(
                api_root, token, DAG_ID, run.conf, note=note[:1000]
            )
        except (airflow_http.AirflowRefusedError, httpx.HTTPError) as err:
            refusal = _airflow_refusal(err, api_root)
            if number == 0:
                raise refusal from err
            stopped = f"the {runs[0].stage} run before it was refused"
            run.refused = str(refusal.detail)
            continue
        run.run_id = str(started["dag_run_id"])
        run.run_link = airflow_http.run_path(DAG_ID, run.run_id)
    return runs


def _airflow_refusal(err: Exception, api_root: str) -> HTTPException:
    """The page's answer when Airflow refused a run (its status where it is the caller's)."""
    if isinstance(err, airflow_http.AirflowRefusedError):
        if err.status in (HTTPStatus.UNAUTHORIZED, HTTPStatus.FORBIDDEN):
            return HTTPException(err.status, f"Airflow refused to trigger the run: {err.detail}")
        if err.status in (HTTPStatus.BAD_REQUEST, HTTPStatus.UNPROCESSABLE_ENTITY):
            return HTTPException(
                HTTPStatus.BAD_REQUEST, f"Airflow rejected the run's conf: {err.detail}"
            )
        return HTTPException(HTTPStatus.BAD_GATEWAY, f"Airflow answered {err.status}: {err.detail}")
    log.warning("replayable UI cannot reach Airflow's REST API at %s: %s", api_root, err)
    return HTTPException(
        HTTPStatus.BAD_GATEWAY,
        "Airflow's REST API could not be reached; set [replayable] airflow_api_url to the URL "
        "this API server can reach Airflow at.",
    )


def _with_history(conn: db.Connection, rows: list[dict[str, Any]]) -> list[DeadLetter]:
    """Letters from ``rows``, each with its changes, read in one query for all of them."""
    changes: dict[int, list[LetterChange]] = {}
    if rows:
        ids = [row["id"] for row in rows]
        for change in db.fetch_all(conn, "views/dead_letter_history", {"ids": ids}):
            changes.setdefault(change.pop("letter_id"), []).append(LetterChange(**change))
    return [DeadLetter(**row, history=changes.get(row["id"], [])) for row in rows]


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


def _matched(rows: list[dict[str, Any]]) -> int:
    """Take the window count off every row; it is the same on each."""
    counts = [int(row.pop("matched")) for row in rows]
    return counts[0] if counts else 0


# ---- dependencies ------------------------------------------------------------------------


@contextlib.contextmanager
def _pooled(pool: ConnectionPool, *, readonly: bool) -> Iterator[db.Connection]:
    """A connection of ``pool``; 503 if there is none to have, at once if all are busy."""
    try:
        with pool.connection(readonly=readonly) as conn:
            yield conn
    # A missing Airflow connection or an unreachable server both mean the same to the
    # person looking at the page; the details go to the API server's log.
    except psycopg2.OperationalError as err:
        if isinstance(err, psycopg2.errors.QueryCanceled):
            raise
        log.warning("replayable UI cannot reach its database: %s", err)
        raise _unavailable() from err
    except psycopg2.InterfaceError as err:
        log.warning("replayable UI has no database connection: %s", err)
        raise _unavailable() from err
    except PoolBusyError as err:
        log.warning("replayable UI refused a request: %s", err)
        raise HTTPException(
            HTTPStatus.SERVICE_UNAVAILABLE,
            f"All {pool.size} of the UI's database connections are busy; try again in a moment.",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        ) from err


def _connection(request: Request, *, readonly: bool) -> Iterator[db.Connection]:
    # No request waits for a connection in a worker thread: see replayable.web.pool.
    with _pooled(request.app.state.pool, readonly=readonly) as conn:
        yield conn


def _unavailable() -> HTTPException:
    return HTTPException(
        HTTPStatus.SERVICE_UNAVAILABLE,
        f"The replayable database is unavailable; check the Airflow connection {DSN_CONN_ID!r}.",
    )


def _read_connection(request: Request) -> Iterator[db.Connection]:
    """A connection in a read-only transaction: a read route cannot write."""
    yield from _connection(request, readonly=True)


def _write_connection(request: Request) -> Iterator[db.Connection]:
    """A connection in a read-write transaction, rolled back unless the route commits."""
    yield from _connection(request, readonly=False)


ReadConn = Annotated[db.Connection, Depends(_read_connection)]
WriteConn = Annotated[db.Connection, Depends(_write_connection)]


def _origin(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an absolute http(s) URL, default ports filled in; else None."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        return None
    return scheme, parts.hostname.lower(), port or (443 if scheme == "https" else 80)


def _allowed_origins(request: Request) -> set[tuple[str, str, int]]:
    own = _origin(f"{request.url.scheme}://{request.headers.get('host', '')}")
    allowed = {own} if own else set()
    if (base_url := conf.get("api", "base_url", fallback=None)) and (
        configured := _origin(base_url)
    ):
        allowed.add(configured)
    return allowed


def require_same_origin(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> None:
    """Refuse a cookie-authenticated POST that a page on another origin made (CSRF).

    Airflow's ``get_user`` reads this same ``bearer_scheme``: only when it yields a token
    (scheme ``Bearer`` and a non-blank value) is the cookie unused, and a browser never adds
    such a header by itself. A blank ``Authorization: Bearer`` falls back to the cookie, so
    it is checked like any other cookie request.
    """
    if bearer is not None and bearer.scheme.lower() == "bearer" and bearer.credentials.strip():
        return
    source = request.headers.get("origin") or request.headers.get("referer") or ""
    # "null" (a sandboxed or privacy-stripped origin) is no origin and is refused too.
    if _origin(source) not in _allowed_origins(request):
        raise HTTPException(
            HTTPStatus.FORBIDDEN, "cross-origin request refused (Origin/Referer scheme and host)"
        )


def _dag_details() -> DagDetails:
    team = None
    if conf.getboolean("core", "multi_team", fallback=False):
        # Only multi-team deployments tie a DAG to a team; the lookup needs the metadata DB.
        from airflow.models.dag import DagModel

        team = DagModel.get_team_name(DAG_ID)
    return DagDetails(id=DAG_ID, team_name=team)


def _require_dag(
    method: Literal["GET", "PUT", "POST"], entity: DagAccessEntity | None = None
) -> Callable[[GetUserDep], None]:
    def check(user: GetUserDep) -> None:
        if not get_auth_manager().is_authorized_dag(
            method=method, access_entity=entity, details=_dag_details(), user=user
        ):
            raise HTTPException(HTTPStatus.FORBIDDEN, "Forbidden")

    return check


# Reading the ledger of document_pipeline is reading the DAG; changing its work list is
# editing it; a redrive triggers a run of it, as Airflow's own trigger route asks.
require_read_access = _require_dag("GET")
require_edit_access = _require_dag("PUT")
require_trigger_access = _require_dag("POST", DagAccessEntity.RUN)


def callers_token(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> str:
    """The JWT this request was authenticated with, chosen as Airflow's ``get_user`` chooses.

    A redrive forwards it to Airflow's REST API, so that the run is the caller's own: never a
    service account's (ADR 0062).
    """
    if bearer is not None and bearer.scheme.lower() == "bearer":
        return bearer.credentials
    token = request.cookies.get(COOKIE_NAME_JWT_TOKEN)
    if not token:
        raise HTTPException(HTTPStatus.UNAUTHORIZED, "Not authenticated")
    return token


def airflow_api_root(request: Request) -> str:
    """Where this API server reaches Airflow's REST API (ADR 0062).

    ``create_app(airflow_api_url=...)``, else ``[replayable] airflow_api_url``, else
    ``[api] base_url``; with none of them, the address this request arrived at (the API
    server's own socket, not the Host header a client sent).
    """
    configured = (
        request.app.state.airflow_api_url
        or conf.get("replayable", "airflow_api_url", fallback=None)
        or conf.get("api", "base_url", fallback=None)
    )
    if configured:
        return str(configured).rstrip("/")
    server = request.scope.get("server")
    if not server or server[1] is None:
        raise HTTPException(
            HTTPStatus.SERVICE_UNAVAILABLE,
            "This API server's own address is unknown; set [replayable] airflow_api_url.",
        )
    host = f"[{server[0]}]" if ":" in server[0] else server[0]
    scheme = "https" if conf.get("api", "ssl_cert", fallback="") else "http"
    return f"{scheme}://{host}:{server[1]}"


# ---- pages and API -----------------------------------------------------------------------


def _when(moment: datetime | None) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if moment else ""


def _filter_time(moment: datetime | None) -> str:
    """A time as the date filters show and take it: UTC, to the second, without a zone."""
    if moment is None:
        return ""
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="seconds")


def _hour_label(moment: datetime) -> str:
    """An axis label: the hour in UTC, or the date at midnight."""
    utc = moment.astimezone(UTC)
    return utc.strftime("%b %d") if utc.hour == 0 else utc.strftime("%H:00")


def _file_name(uri: str | None) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1] if uri else "?"


_templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(pathlib.Path(__file__).with_name("templates")),
    autoescape=True,  # every template, whatever its name: all output here is HTML
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_templates.filters.update(
    when=_when,
    file_name=_file_name,
    filter_time=_filter_time,
    hour_label=_hour_label,
    # Plain text: autoescaping escapes it like every other value.
    pretty_json=lambda value: json.dumps(value, indent=2, ensure_ascii=False),
)
_templates.globals.update(
    stages=STAGES,
    letter_statuses=get_args(LetterStatus),
    chart_w=CHART_HOURS * _CHART_BAR_W,
    chart_h=_CHART_H,
    chart_bar_w=_CHART_BAR_W,
)


def _page(
    name: str, *, root: str = "", status: int = HTTPStatus.OK, **context: Any
) -> HTMLResponse:
    """Render a page; ``root`` leads from the page's URL back to the app's (for nested pages).

    ``airflow`` leads from the page to Airflow's base URL, for links into Airflow's UI: the
    app is mounted one level below it (at ``/replayable``), so it is ``root`` and ``../``.
    """
    html = _templates.get_template(name).render(
        page=name, root=root, airflow=f"{root}../", **context
    )
    return HTMLResponse(html, status_code=status)


def _error_classes(values: list[str] | None) -> list[str] | None:
    """The distinct classes asked for (repeated or comma-separated), or None for any."""
    parts = (part.strip() for value in values or [] for part in value.split(","))
    # The filter form's empty text box submits "": that means any class, not class "".
    return list(dict.fromkeys(p for p in parts if p)) or None


ErrorClasses = Annotated[list[ErrorClass] | None, Query(max_length=50)]


def _blank_is_none(value: object) -> object:
    # The filter forms' "any" choice submits an empty value.
    return None if value == "" else value


def _utc(moment: datetime | None) -> datetime | None:
    """A time without a zone is UTC, as the pages show every time."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    try:
        return moment.astimezone(UTC)
    except OverflowError:
        raise ValueError("out of the range of dates") from None


def _at_least_three(text: str) -> str:
    text = text.strip()
    if len(text) < 3:
        raise ValueError("say why in at least 3 characters")
    return text


StageFilter = Annotated[Stage | None, BeforeValidator(_blank_is_none), Query()]
MomentFilter = Annotated[
    datetime | None, BeforeValidator(_blank_is_none), AfterValidator(_utc), Query()
]
StageField = Annotated[Stage | None, BeforeValidator(_blank_is_none), Form()]
MomentField = Annotated[
    datetime | None, BeforeValidator(_blank_is_none), AfterValidator(_utc), Form()
]
ErrorClassField = Annotated[ErrorClass, Form(max_length=2000)]
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
StatusField = Annotated[LetterStatus, Form()]
LimitField = Annotated[int, Form(ge=1, le=500)]
ReturnField = Annotated[ReturnTo, Form()]


def _problem(description: str) -> dict[str, Any]:
    # Inline and always JSON: with `model`, FastAPI would document a page's refusals as HTML.
    schema = {**Problem.model_json_schema(), "additionalProperties": False}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


# Documented so that clients (and the schema fuzzer) know every answer a route can give.
Responses = dict[int | str, dict[str, Any]]
_ANY_ROUTE: Responses = {
    401: _problem("Not logged in to Airflow"),
    403: _problem("Not allowed (role), or a cross-origin post"),
    503: _problem("The database is unavailable, busy, or the query took too long"),
}
_PAGED: Responses = {400: _problem("`after` is not a page cursor")}
_ONE: Responses = {404: _problem("No such dead letter")}
_CHANGE: Responses = {**_ONE, 409: _problem("The letter is no longer open")}
_REDRIVE: Responses = {
    400: _problem("No letter ticked, or Airflow rejected the run's conf"),
    409: _problem("No open dead letter matches"),
    502: _problem("Airflow's REST API could not be reached, or failed"),
}

router = APIRouter(responses=_ANY_ROUTE)


@router.get("/", response_class=HTMLResponse)
def overview_page(conn: ReadConn) -> HTMLResponse:
    """Per stage, items by current status; open dead letters; letters created per hour."""
    chart = letters_per_hour(conn)
    return _page("overview.html", summary=summary(conn), chart=chart, bars=_chart_bars(chart))


@router.get("/failed", response_class=HTMLResponse, responses=_PAGED)
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


def _letter_filters(
    stage: str | None,
    status: str,
    classes: list[str] | None,
    since: datetime | None,
    until: datetime | None,
    limit: int,
) -> dict[str, Any]:
    """The dead-letter list's filters as its form shows them and its links carry them."""
    return {
        "stage": stage,
        "status": status,
        "error_class": ", ".join(classes or []),
        "since": _filter_time(since),
        "until": _filter_time(until),
        "limit": limit,
    }


@router.get("/dead-letters", response_class=HTMLResponse, responses=_PAGED)
def dead_letters_page(
    conn: ReadConn,
    stage: StageFilter = None,
    status: LetterStatus = "open",
    error_class: ErrorClasses = None,
    since: MomentFilter = None,
    until: MomentFilter = None,
    limit: Limit = 100,
    after: After = None,
) -> HTMLResponse:
    """The dead-letter queue (open letters unless asked otherwise), each row expandable.

    Filters: stage, status, error class and when the letter was created (``since``
    inclusive, ``until`` exclusive; a time without a zone is UTC). Open letters can be ticked
    and redriven, or every open letter the filters match.
    """
    classes = _error_classes(error_class)
    data = dead_letters(
        conn, stage, status, limit, after, error_classes=classes, since=since, until=until
    )
    filters = _letter_filters(stage, status, classes, since, until, limit)
    return _page("dead_letters.html", data=data, filters=filters, next_query=_next(filters, data))


@router.get("/dead-letters/{letter_id}", response_class=HTMLResponse, responses=_ONE)
def dead_letter_page(conn: ReadConn, letter_id: LetterId) -> HTMLResponse:
    """One dead letter: its full error, its resolution and every change made to it."""
    letter = dead_letter(conn, letter_id)
    filters = _letter_filters(None, "open", None, None, None, 100)
    return _page("dead_letter.html", root="../", dl=letter, filters=filters)


def _next(filters: dict[str, Any], data: FailedList | DeadLetterList) -> str | None:
    """The query string of the next page: the same filters and the cursor."""
    if data.next_after is None:
        return None
    return urlencode({**_kept(filters), "after": data.next_after})


def _kept(filters: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in filters.items() if v not in (None, "")}


def _back(letter_id: int, return_to: str, filters: dict[str, Any]) -> RedirectResponse:
    # Relative, so that it works under any mount point and [api] base_url:
    # .../dead-letters/<id>/<action> → .../dead-letters/<id> or .../dead-letters
    if return_to == "letter":
        return RedirectResponse(f"../{letter_id}", HTTPStatus.SEE_OTHER)
    return RedirectResponse(f"../../dead-letters?{urlencode(_kept(filters))}", HTTPStatus.SEE_OTHER)


_EDIT = [Depends(require_same_origin), Depends(require_edit_access)]


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
    stage: StageField = None,
    status: StatusField = "open",
    error_class: ErrorClassField = "",
    since: MomentField = None,
    until: MomentField = None,
    limit: LimitField = 100,
    return_to: ReturnField = "list",
) -> RedirectResponse:
    """Resolve an open letter as ignored, recording who, when and why; its note stays."""
    params = {"id": letter_id, "by": user.get_name(), "reason": reason.strip()}
    change_open_letter(conn, "dead_letters/ignore", params)
    classes = _error_classes([error_class])
    filters = _letter_filters(stage, status, classes, since, until, limit)
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
    owner: OwnerField = "",
    note: NoteField = "",
    stage: StageField = None,
    status: StatusField = "open",
    error_class: ErrorClassField = "",
    since: MomentField = None,
    until: MomentField = None,
    limit: LimitField = 100,
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
    classes = _error_classes([error_class])
    filters = _letter_filters(stage, status, classes, since, until, limit)
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
    ids: LetterIds = None,
    stage: StageField = None,
    error_class: ErrorClassField = "",
    since: MomentField = None,
    until: MomentField = None,
    limit: LimitField = 100,
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
    classes = _error_classes([error_class])
    selected = scope == "selected"
    by = user.get_name()

    def plan() -> list[RedriveRun]:
        with _pooled(request.app.state.pool, readonly=True) as conn:
            return plan_redrive(
                conn,
                by=by,
                reason=reason,
                ids=list(dict.fromkeys(ids or [])) if selected else None,
                stage=None if selected else stage,
                error_classes=None if selected else classes,
                since=None if selected else since,
                until=None if selected else until,
            )

    runs = await run_in_threadpool(plan)
    runs = await ask_airflow(
        runs, api_root=airflow_api_root(request), token=token, by=by, reason=reason
    )
    filters = _letter_filters(stage, "open", classes, since, until, limit)
    back = urlencode(_kept(filters))
    return _page("redrive.html", root="../", runs=runs, reason=reason, back=back)


@router.get("/api/summary")
def summary_api(conn: ReadConn) -> Summary:
    """The overview as JSON."""
    return summary(conn)


@router.get("/api/dead-letters/per-hour")
def letters_per_hour_api(conn: ReadConn) -> LettersPerHour:
    """The overview's chart as JSON: letters created per hour over the last 48 hours (UTC)."""
    return letters_per_hour(conn)


@router.get("/api/failed", responses=_PAGED)
def failed_api(
    conn: ReadConn,
    stage: StageFilter = None,
    error_class: ErrorClasses = None,
    limit: Limit = 100,
    after: After = None,
) -> FailedList:
    """The failed list as JSON; ``next_after`` is the cursor of the next page."""
    return failed_items(conn, stage, _error_classes(error_class), limit, after)


@router.get("/api/dead-letters", responses=_PAGED)
def dead_letters_api(
    conn: ReadConn,
    stage: StageFilter = None,
    status: LetterStatus = "open",
    error_class: ErrorClasses = None,
    since: MomentFilter = None,
    until: MomentFilter = None,
    limit: Limit = 100,
    after: After = None,
) -> DeadLetterList:
    """The dead-letter list as JSON, with full errors, tracebacks and histories."""
    return dead_letters(
        conn,
        stage,
        status,
        limit,
        after,
        error_classes=_error_classes(error_class),
        since=since,
        until=until,
    )


@router.get("/api/dead-letters/{letter_id}", responses=_ONE)
def dead_letter_api(conn: ReadConn, letter_id: LetterId) -> DeadLetter:
    """One dead letter as JSON, with its history."""
    return dead_letter(conn, letter_id)


def _refusal(status: HTTPStatus, detail: str) -> Response:
    return JSONResponse({"detail": detail}, status)


async def _schema_missing(request: Request, exc: Exception) -> Response:
    return _refusal(
        HTTPStatus.SERVICE_UNAVAILABLE,
        "The replayable database has no replayable schema yet; run the pipeline once (or "
        "`make start`) to create it.",
    )


async def _too_slow(request: Request, exc: Exception) -> Response:
    seconds = request.app.state.pool.statement_timeout_s
    return _refusal(
        HTTPStatus.SERVICE_UNAVAILABLE,
        f"The query took longer than {seconds:g} s and was cancelled; try a smaller page.",
    )


def _default_dsn() -> str:
    """The DSN of ``replayable_ui_db`` (a least-privilege role, see the README), else ours."""
    # Imported here: replayable.hooks loads the task SDK, which only this path needs.
    from airflow.sdk.exceptions import AirflowNotFoundException

    from replayable.hooks import connection_dsn

    try:
        return connection_dsn(UI_DSN_CONN_ID)
    except AirflowNotFoundException:
        return connection_dsn(DSN_CONN_ID)


def create_app(
    dsn_provider: Callable[[], str] | None = None,
    *,
    pool_size: int | None = None,
    statement_timeout_s: float | None = None,
    openapi_url: str | None = None,
    airflow_api_url: str | None = None,
) -> FastAPI:
    """Build the UI app; ``dsn_provider`` returns the replayable database's DSN.

    By default the DSN comes from the Airflow connection ``replayable_ui_db``, else
    ``replayable_db``; the pool holds
    ``[replayable] ui_pool_size`` connections (4) and statements are cancelled after
    ``[replayable] ui_statement_timeout_s`` (5 s); both are Airflow config options, e.g.
    ``AIRFLOW__REPLAYABLE__UI_STATEMENT_TIMEOUT_S``. ``openapi_url`` serves the schema: for
    tests only, since Airflow's auth does not cover the docs routes. ``airflow_api_url`` is
    where a redrive reaches Airflow's REST API (see :func:`airflow_api_root` for the
    default). Building the app touches neither Airflow's auth manager nor any database, so
    the plugin loads cheaply in every Airflow process.
    """
    app = FastAPI(
        title="Replayable",
        # Plugin mounts get none of Airflow's auth: every route requires it here.
        dependencies=[
            Depends(requires_access_view(AccessView.PLUGINS)),
            Depends(require_read_access),
        ],
        docs_url=None,
        redoc_url=None,
        openapi_url=openapi_url,
    )
    app.state.pool = ConnectionPool(
        dsn_provider or _default_dsn,
        size=pool_size or conf.getint("replayable", "ui_pool_size", fallback=4),
        statement_timeout_s=statement_timeout_s
        or conf.getfloat("replayable", "ui_statement_timeout_s", fallback=5.0),
    )
    app.state.airflow_api_url = airflow_api_url
    app.include_router(router)
    app.include_router(metrics_router)  # its own auth: Airflow's or the scrape token
    app.add_exception_handler(psycopg2.errors.UndefinedTable, _schema_missing)
    app.add_exception_handler(psycopg2.errors.QueryCanceled, _too_slow)

    @app.middleware("http")
    async def security_headers(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        return response

    return app
