"""The UI's security: Airflow login, DAG roles, CSRF and the response headers (ADR 0008, 0015)."""

from __future__ import annotations

from typing import Any

import pytest
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from fastapi import FastAPI
from fastapi.testclient import TestClient
from ui_fixtures import (  # noqa: F401 - fixtures
    ORIGIN,
    _as,
    _history,
    _letter,
    _mounted,
    _routes,
    anonymous_fixture,
    app_fixture,
    auth_manager_fixture,
    client_fixture,
    editor_fixture,
    ledger_fixture,
    make_app_fixture,
)

from devtools import devenv
from helpers import ROOT
from replayable.vocabulary import PIPELINE_DAG_ID
from replayable.web.security import SECURITY_HEADERS, _dag_details


def test_the_dag_it_authorizes_against_is_the_pipeline() -> None:
    assert _dag_details().id == PIPELINE_DAG_ID == devenv.DAG_ID
    dag_file = (ROOT / "dags" / f"{PIPELINE_DAG_ID}.py").read_text()
    assert "pipeline_dag(\n    PIPELINE_DAG_ID," in dag_file


def test_every_route_refuses_anonymous_requests(app: FastAPI, anonymous: TestClient) -> None:
    routes = _routes(app)
    assert len(routes) == 16
    for method, path in routes:
        response = anonymous.request(method, "/replayable" + path, headers={"Origin": ORIGIN})
        assert response.status_code == 401, (method, path)


def test_an_invalid_token_is_refused(anonymous: TestClient) -> None:
    anonymous.cookies.set("_token", "not-a-jwt")
    response = anonymous.get("/replayable/")
    assert response.status_code == 403  # Airflow's own verdict on a malformed JWT


def test_a_user_without_a_role_is_forbidden(app: FastAPI, ledger: dict[str, int]) -> None:
    nobody = _as(app, SimpleAuthManagerUser(username="nobody", role=None))
    assert nobody.get("/replayable/").status_code == 403
    letter = ledger["encrypted"]
    posted = nobody.post(f"/replayable/dead-letters/{letter}/assign", data={"owner": "x"})
    assert posted.status_code == 403


@pytest.mark.parametrize("role", ["VIEWER", "USER", "OP", "ADMIN"])
def test_every_role_can_read_every_page(app: FastAPI, ledger: dict[str, int], role: str) -> None:
    reader = _as(app, SimpleAuthManagerUser(username="r", role=role))
    pages = [path for method, path in _routes(app) if method == "GET"]
    assert len(pages) == 13
    # Asked no question, the search page shows its box; its JSON twin names what is missing.
    refused = {"/api/search": 400}
    for path in pages:
        path = path.replace("/1", f"/{ledger['encrypted']}")
        answer = reader.get("/replayable" + path, params={"q": ""} if "search" in path else None)
        assert answer.status_code == refused.get(path, 200), (role, path)


@pytest.mark.parametrize("action", ["assign", "ignore"])
def test_a_viewer_cannot_change_the_work_list(
    client: TestClient, conn: Any, ledger: dict[str, int], action: str
) -> None:
    letter = ledger["encrypted"]
    before = _letter(conn, letter)
    response = client.post(
        f"/replayable/dead-letters/{letter}/{action}", data={"owner": "x", "reason": "why"}
    )
    assert response.status_code == 403
    assert _letter(conn, letter) == before and _history(conn, letter) == []


@pytest.mark.parametrize("role", ["USER", "OP", "ADMIN"])
@pytest.mark.parametrize("action", ["assign", "ignore"])
def test_users_ops_and_admins_can_change_the_work_list(
    app: FastAPI, conn: Any, ledger: dict[str, int], role: str, action: str
) -> None:
    changer = _as(app, SimpleAuthManagerUser(username=f"{role.lower()}1", role=role))
    letter = ledger["encrypted"]
    response = changer.post(
        f"/replayable/dead-letters/{letter}/{action}",
        data={"owner": "dan", "reason": "known sample"},
        follow_redirects=True,
    )
    assert response.status_code == 200
    assert [(actor, action_done) for actor, action_done, *_ in _history(conn, letter)] == [
        (f"{role.lower()}1", "assigned" if action == "assign" else "ignored")
    ]


def test_every_route_sends_the_security_headers(
    app: FastAPI, make_app: Any, dsn: str, client: TestClient, editor: TestClient, ledger: Any
) -> None:
    """Pages, JSON, redirects and refusals alike; new routes are covered as they are added."""
    policy = SECURITY_HEADERS["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "frame-ancestors 'self'" in policy
    assert "script-src" not in policy  # no script from anywhere, not even 'self'
    letter = ledger["bad_input"]
    anonymous = TestClient(_mounted(make_app(lambda: dsn)))  # an app without the overrides
    responses = []
    for method, path in _routes(app):
        url = "/replayable" + path.replace("/1", f"/{letter}")
        form = {"owner": "o", "reason": "r"}
        responses.append(anonymous.request(method, url))  # 401
        responses.append(client.request(method, url, data=form if method == "POST" else None))
        responses.append(editor.request(method, url, data=form if method == "POST" else None))
    responses.append(editor.post(f"/replayable/dead-letters/{letter}/ignore", data=form))  # 409
    responses.append(client.get("/replayable/no-such-page"))  # 404
    responses.append(client.get("/replayable/failed?limit=0"))  # 422
    statuses = {response.status_code for response in responses}
    assert {200, 303, 401, 403, 404, 409, 422} <= statuses
    for response in responses:
        for name, value in SECURITY_HEADERS.items():
            assert response.headers.get(name) == value, (response.request.url, name)


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example"},
        {"Origin": "http://testserver.evil.example"},
        {"Origin": "null"},
        {"Origin": "", "Referer": "http://evil.example/page"},
        {"Origin": ""},  # neither header: a client that hides where it posts from
        {"Origin": "https://testserver"},  # same host, other scheme
        {"Origin": "http://testserver:8081"},  # same host, other port
        {"Origin": "", "Referer": "https://testserver/replayable/dead-letters"},
        {"Origin": "testserver"},  # no scheme at all
        # A blank bearer token is no token: Airflow falls back to the cookie.
        {"Origin": "http://evil.example", "Authorization": "Bearer "},
        {"Origin": "http://evil.example", "Authorization": "Bearer    "},
        {"Origin": "http://evil.example", "Authorization": "Bearer"},
        {"Origin": "http://evil.example", "Authorization": "Basic dXNlcjpwdw=="},
    ],
)
def test_a_cross_origin_post_is_refused(
    editor: TestClient, conn: Any, ledger: dict[str, int], headers: dict[str, str]
) -> None:
    letter = ledger["encrypted"]
    for action in ("ignore", "assign"):
        response = editor.post(
            f"/replayable/dead-letters/{letter}/{action}",
            data={"reason": "csrf", "owner": "csrf"},
            headers=headers,
        )
        assert response.status_code == 403, action
        assert "cross-origin" in response.json()["detail"]
    assert _letter(conn, letter)["status"] == "open"
    assert _letter(conn, letter)["owner"] is None


@pytest.mark.parametrize("origin", ["http://testserver", "http://TestServer:80"])
def test_the_pages_own_origin_may_post(
    editor: TestClient, conn: Any, ledger: dict[str, int], origin: str
) -> None:
    letter = ledger["encrypted"]
    url = f"/replayable/dead-letters/{letter}/assign"
    response = editor.post(url, data={"owner": "dan"}, headers={"Origin": origin})
    assert response.status_code == 303
    assert _letter(conn, letter)["owner"] == "dan"


def test_the_configured_base_url_is_an_allowed_origin(
    editor: TestClient, conn: Any, ledger: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind a proxy the browser's origin is [api] base_url, not the Host the app sees."""
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.com/")
    url = f"/replayable/dead-letters/{ledger['encrypted']}/assign"
    proxied = {"Origin": "https://airflow.example.com"}
    assert editor.post(url, data={"owner": "pat"}, headers=proxied).status_code == 303
    other_scheme = {"Origin": "http://airflow.example.com"}
    assert editor.post(url, data={"owner": "eve"}, headers=other_scheme).status_code == 403
    assert _letter(conn, ledger["encrypted"])["owner"] == "pat"


def test_a_same_origin_referer_is_enough_without_origin(
    editor: TestClient, conn: Any, ledger: dict[str, int]
) -> None:
    letter = ledger["encrypted"]
    response = editor.post(
        f"/replayable/dead-letters/{letter}/assign",
        data={"owner": "dan"},
        headers={"Origin": "", "Referer": f"{ORIGIN}/replayable/dead-letters"},
    )
    assert response.status_code == 303
    assert _letter(conn, letter)["owner"] == "dan"


def test_a_bearer_token_post_needs_no_origin(
    editor: TestClient, conn: Any, ledger: dict[str, int]
) -> None:
    """Browsers never attach a bearer token by themselves, so it cannot be forged cross-site."""
    letter = ledger["encrypted"]
    # get_user is overridden here, so the token is not checked; only its presence matters.
    response = editor.post(
        f"/replayable/dead-letters/{letter}/assign",
        data={"owner": "script"},
        headers={"Origin": "", "Authorization": "Bearer token"},
    )
    assert response.status_code == 303
    assert _letter(conn, letter)["owner"] == "script"
