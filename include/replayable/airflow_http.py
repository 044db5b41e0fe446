"""Airflow 3.3's HTTP surface as Replayable uses it: UI routes to link to, REST calls to make.

**UI routes** (the React app's, checked in the 3.3.2 UI bundle and in a running Airflow by
``tests/e2e/test_ui_links.py``; ADR 0060). The paths here are relative to Airflow's base
URL (``[api] base_url``, or the server's root), with no leading slash, so that a page can
reach them relatively from wherever it is mounted and a client can join them to the URL it
knows Airflow by:

- a run: ``dags/{dag_id}/runs/{run_id}``
- a task instance: ``dags/{dag_id}/runs/{run_id}/tasks/{task_id}/mapped/{map_index}``
  (without ``/mapped/{map_index}`` for an unmapped task); its ``/details`` tab shows the
  instance, and the instance's own page is its log, of the try ``?try_number=N`` names
  (the latest try without it).

The stage tasks of ``document_pipeline`` are ``batch.<stage>`` (a mapped task group
``batch``; ``tests/dags`` checks the DAG has them), so a ledger row's dag id, run id,
stage, map index and try are all a link needs.

**REST calls.** :func:`trigger_run` is ``POST /api/v2/dags/{dag_id}/dagRuns`` with
``"logical_date": null`` (required but nullable in 3.3), and :func:`trigger_run_async` the
same call for code that runs in the API server's event loop; :func:`fetch_token` is ``POST
/auth/token`` of SimpleAuthManager-style deployments. Both raise :class:`AirflowRefusedError`
with Airflow's status and detail when Airflow says no, so a caller can pass the verdict on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import httpx

STAGE_TASK_GROUP = "batch"
TIMEOUT_S = 30.0


def stage_task_id(stage: str) -> str:
    """The task id of ``stage``'s task in document_pipeline: ``batch.<stage>``."""
    return f"{STAGE_TASK_GROUP}.{stage}"


def _segment(value: str) -> str:
    # Run ids allow [A-Za-z0-9_.~:+-]; ":" and "+" stay as Airflow's own links write them.
    return quote(value, safe=":+")


def run_path(dag_id: str, run_id: str) -> str:
    """The run's page in Airflow's UI."""
    return f"dags/{_segment(dag_id)}/runs/{_segment(run_id)}"


def task_instance_path(dag_id: str, run_id: str, task_id: str, map_index: int | None) -> str:
    """The task instance's page (its log); ``map_index`` None or -1 for an unmapped task."""
    path = f"{run_path(dag_id, run_id)}/tasks/{_segment(task_id)}"
    if map_index is not None and map_index >= 0:
        path += f"/mapped/{map_index}"
    return path


@dataclass(frozen=True)
class TaskLinks:
    """Where one ledger row's work happened in Airflow's UI."""

    run: str
    task_instance: str  # the instance's details tab
    log: str  # its log, of the recorded try when there is one


def task_links(
    *,
    dag_id: str | None,
    run_id: str | None,
    stage: str,
    map_index: int | None,
    try_number: int | None,
) -> TaskLinks | None:
    """Links for a row of ``stage`` written by a task of run ``run_id``; None without a run."""
    if not dag_id or not run_id:
        return None
    instance = task_instance_path(dag_id, run_id, stage_task_id(stage), map_index)
    log = instance + (f"?{urlencode({'try_number': try_number})}" if try_number else "")
    return TaskLinks(run=run_path(dag_id, run_id), task_instance=f"{instance}/details", log=log)


class AirflowRefusedError(Exception):
    """Airflow answered a REST call with an error: ``status`` and Airflow's ``detail``."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"Airflow answered {status}: {detail}")
        self.status = status
        self.detail = detail


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or response.reason_phrase
    detail = body.get("detail", body) if isinstance(body, dict) else body
    return detail if isinstance(detail, str) else str(detail)[:2000]


def _trigger_request(
    api_root: str, token: str, dag_id: str, conf: dict[str, Any], note: str | None
) -> dict[str, Any]:
    """The URL, body and headers of ``POST /api/v2/dags/{dag_id}/dagRuns``."""
    body: dict[str, Any] = {"logical_date": None, "conf": conf}
    if note:
        body["note"] = note
    return {
        "url": f"{api_root.rstrip('/')}/api/v2/dags/{_segment(dag_id)}/dagRuns",
        "json": body,
        "headers": {"Authorization": f"Bearer {token}"},
    }


def _started_run(response: httpx.Response) -> dict[str, Any]:
    if response.status_code >= 400:
        raise AirflowRefusedError(response.status_code, _detail(response))
    return dict(response.json())


def trigger_run(
    api_root: str,
    token: str,
    dag_id: str,
    conf: dict[str, Any],
    *,
    note: str | None = None,
    transport: httpx.BaseTransport | None = None,
) -> dict[str, Any]:
    """Trigger a run of ``dag_id`` with ``conf`` as the holder of ``token``; return the run.

    :param api_root: Airflow's root URL (``http://host:8080`` or with its base path).
    :param token: the Airflow JWT of the person the run is for: Airflow applies their
        permissions and records them as the run's triggering user.
    :param note: the run's note, shown in Airflow's UI.
    :raises AirflowRefusedError: Airflow said no (401, 403, 400 for a conf the DAG's params
        reject, …).
    :raises httpx.HTTPError: Airflow could not be reached.
    """
    with httpx.Client(timeout=TIMEOUT_S, transport=transport) as http:
        response = http.post(**_trigger_request(api_root, token, dag_id, conf, note))
    return _started_run(response)


async def trigger_run_async(
    api_root: str,
    token: str,
    dag_id: str,
    conf: dict[str, Any],
    *,
    note: str | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> dict[str, Any]:
    """:func:`trigger_run` for a caller inside Airflow's API server: it waits holding no thread.

    The UI calls Airflow's REST API on the server it runs in, whose trigger route (and every
    other sync route, task heartbeats among them) needs a worker thread of that same server:
    a caller that held one while it waited would take it from them (ADR 0073).
    """
    async with httpx.AsyncClient(timeout=TIMEOUT_S, transport=transport) as http:
        response = await http.post(**_trigger_request(api_root, token, dag_id, conf, note))
    return _started_run(response)


def fetch_token(
    api_root: str, username: str, password: str, *, transport: httpx.BaseTransport | None = None
) -> str:
    """An Airflow JWT for ``username`` from ``POST /auth/token`` (SimpleAuthManager and kin)."""
    with httpx.Client(timeout=TIMEOUT_S, transport=transport) as http:
        response = http.post(
            f"{api_root.rstrip('/')}/auth/token",
            json={"username": username, "password": password},
        )
    if response.status_code >= 400:
        raise AirflowRefusedError(response.status_code, _detail(response))
    return str(response.json()["access_token"])
