"""A redrive from the UI: plan the runs from the ledger, then ask Airflow for them (ADR 0062).

:func:`plan_redrive` reads which open letters go, one ``document_pipeline`` run per stage,
and only reads; :func:`ask_airflow` then triggers the runs through Airflow's REST API with
the caller's own JWT, awaited on the event loop with no database connection held (ADR 0073).
The runs themselves close the letters as redriven.
"""

from __future__ import annotations

import logging
from datetime import datetime
from http import HTTPStatus
from typing import Any

import httpx
from fastapi import HTTPException, Request

from replayable import airflow_http, config, db, views
from replayable.web.models import RedriveRun

log = logging.getLogger(__name__)


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
    """The pipeline runs that redrive open dead letters, one per stage (each of the DAG whose
    run made the stage's newest letter, document_pipeline for the shipped stages); none
    asked yet.

    The letters are ``ids`` (ticked on the page), or else every open letter matching the
    filters; a filtered redrive ends at ``until`` or, at the latest, when the letters were
    counted, so that letters arriving later are not taken along unseen. 409 if no open letter
    matches. Only reads: :func:`ask_airflow` then triggers the runs, with the connection
    given back (ADR 0073).
    """
    scopes = views.redrive_scope(
        conn, ids=ids, stage=stage, error_classes=error_classes, since=since, until=until
    )
    if not scopes:
        raise HTTPException(HTTPStatus.CONFLICT, "No open dead letter matches: nothing to redrive.")
    runs: list[RedriveRun] = []
    for scope in scopes:
        selection: dict[str, Any] = {"stage": scope.stage}
        if ids is not None:
            selection["ids"] = scope.ids
        else:
            if error_classes:
                selection["error_class"] = error_classes
            if since is not None:
                selection["since"] = since.isoformat()
            selection["until"] = (
                scope.as_of if until is None else min(until, scope.as_of)
            ).isoformat()
        selection.update(reason=reason, by=by)
        runs.append(
            RedriveRun(
                stage=scope.stage,
                letters=scope.letters,
                documents=scope.documents,
                conf={"redrive": selection},
                dag_id=scope.dag_id,
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
                api_root, token, run.dag_id, run.conf, note=note[:1000]
            )
        except (airflow_http.AirflowRefusedError, httpx.HTTPError) as err:
            refusal = _airflow_refusal(err, api_root)
            if number == 0:
                raise refusal from err
            stopped = f"the {runs[0].stage} run before it was refused"
            run.refused = str(refusal.detail)
            continue
        run.run_id = str(started["dag_run_id"])
        run.run_link = airflow_http.run_path(run.dag_id, run.run_id)
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


def airflow_api_root(request: Request) -> str:
    """Where this API server reaches Airflow's REST API (ADR 0062).

    ``create_app(airflow_api_url=...)``, else ``[replayable] airflow_api_url``, else
    ``[api] base_url``; with none of them, the address this request arrived at (the API
    server's own socket, not the Host header a client sent).
    """
    configured = request.app.state.airflow_api_url or config.airflow_api_url()
    if configured:
        return str(configured).rstrip("/")
    server = request.scope.get("server")
    if not server or server[1] is None:
        raise HTTPException(
            HTTPStatus.SERVICE_UNAVAILABLE,
            "This API server's own address is unknown; set [replayable] airflow_api_url.",
        )
    host = f"[{server[0]}]" if ":" in server[0] else server[0]
    scheme = "https" if config.api_serves_https() else "http"
    return f"{scheme}://{host}:{server[1]}"
