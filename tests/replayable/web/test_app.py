"""The UI app through FastAPI's TestClient: real Airflow auth dependencies, real Postgres.

Authentication is Airflow's own ``get_user`` dependency, exercised for real by the anonymous
tests. The authenticated tests override exactly that one dependency with a
SimpleAuthManagerUser (a real JWT would need Airflow's metadata database for the revocation
check); authorisation still asks Airflow's configured auth manager (SimpleAuthManager), and
the database is the real test Postgres. tests/e2e/test_ui_in_airflow.py repeats the role
checks against a running Airflow with real tokens.
"""

from __future__ import annotations

import contextlib
import html
import importlib.util
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, get_args

import anyio.to_thread
import psycopg2
import psycopg2.errors
import psycopg2.extensions
import pytest
from airflow.api_fastapi.app import RESERVED_URL_PREFIXES, create_auth_manager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from airflow.api_fastapi.core_api.datamodels.plugins import ExternalViewResponse
from airflow.api_fastapi.core_api.security import get_user
from fastapi import FastAPI, HTTPException, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from conftest import ROOT
from devtools import devenv
from fake_airflow import FakeAirflow
from replayable import db
from replayable.settings import STAGES
from replayable.web import create_app
from replayable.web.app import (
    DAG_ID,
    SECURITY_HEADERS,
    ReadConn,
    Stage,
    _read_connection,
    _write_connection,
)
from replayable.web.pool import RETRY_AFTER_S, ConnectionPool, PoolBusyError

HOSTILE = "<script>alert(1)</script>"
ORIGIN = "http://testserver"  # TestClient's host: what a browser sends for this page's forms
A, B, C, D = "a" * 64, "b" * 64, "c" * 64, "d" * 64


def _insert(conn: Any, sql: str, rows: list[tuple[Any, ...]]) -> None:
    with conn.cursor() as cur:
        for row in rows:
            cur.execute(sql, row)
    conn.commit()


def _letter(conn: Any, letter_id: int) -> dict[str, Any]:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT status, owner, note, resolved_by, resolved_at, resolution"
            " FROM replayable.dead_letters WHERE id = %s",
            (letter_id,),
        )
        status, owner, note, resolved_by, resolved_at, resolution = cur.fetchone()
    conn.commit()
    return {
        "status": status,
        "owner": owner,
        "note": note,
        "resolved_by": resolved_by,
        "resolved_at": resolved_at,
        "resolution": resolution,
    }


def _history(conn: Any, letter_id: int) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT actor, action, status, owner, note, resolution, at IS NOT NULL"
            " FROM replayable.dead_letter_history WHERE letter_id = %s ORDER BY id",
            (letter_id,),
        )
        found = cur.fetchall()
    conn.commit()
    return found


@pytest.fixture
def ledger(conn: Any) -> dict[str, int]:
    """Four documents over three stages; three dead letters (two open); hostile text in places.

    Returns the dead-letter ids by name.
    """
    _insert(
        conn,
        "INSERT INTO replayable.documents (doc_id, uri, size_bytes) VALUES (%s, %s, 10)",
        [(A, "/data/a.pdf"), (B, "/data/b.pdf"), (C, "/data/c.pdf"), (D, "/data/d.pdf")],
    )
    _insert(
        conn,
        "INSERT INTO replayable.stage_runs (stage, item_key, doc_id, status, attempts,"
        " error_class, last_error, code_version, config_hash, run_id, map_index, is_current,"
        " updated_at)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, 'cfg', %s, %s, %s,"
        " now() - make_interval(mins => %s))",
        [
            # A's older extract row failed; its newer one is done and is the current one.
            (
                "extract",
                "ea-old",
                A,
                "failed",
                1,
                "http_503",
                "superseded",
                "1.0",
                "r1",
                0,
                False,
                120,
            ),
            ("extract", "ea", A, "done", 1, None, None, "1.1", "r1", 0, True, 60),
            ("extract", "eb", B, "failed", 1, "http_503", HOSTILE, "1.1", "r1", 1, True, 30),
            ("extract", "ec", C, "dead", 3, "encrypted", "locked", "1.1", "r2", 0, True, 10),
            ("extract", "ed", D, "pending", 0, None, None, "1.1", "r2", 1, True, 10),
            ("chunk", "ca", A, "running", 1, None, None, "1.1", "r1", 0, True, 5),
            ("embed", "ma", A, "failed", 2, "http_429", "429 slow down", "2.0", "r1", 3, True, 1),
        ],
    )
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO replayable.dead_letters (stage, item_key, doc_id, error_class,"
            " error_kind, error, traceback, attempts, code_version, run_id, map_index, status,"
            " owner, note, created_at)"
            " VALUES"
            " ('extract', 'ec', %(c)s, 'encrypted', 'terminal', %(h)s, %(h)s, 3, '1.1', 'r2',"
            "  0, 'open', NULL, %(h)s, now() - interval '3 minutes'),"
            " ('embed', 'mb', %(b)s, 'http_400', 'terminal', 'bad input', NULL, 1, '2.0', 'r1',"
            "  1, 'open', 'alice', 'looking', now() - interval '2 minutes'),"
            " ('embed', 'm-old', %(a)s, 'http_500', 'retryable', 'boom', 'Traceback...', 3,"
            "  '1.0', 'r1', 2, 'redriven', NULL, 'redriven by r3', now() - interval '1 minute')"
            " RETURNING id",
            {"a": A, "b": B, "c": C, "h": HOSTILE},
        )
        ids = [row[0] for row in cur.fetchall()]
        # Written by document_pipeline's tasks: these rows link into Airflow.
        cur.execute(
            "UPDATE replayable.stage_runs SET dag_id = 'document_pipeline', try_number = 1"
            " WHERE item_key IN ('eb', 'ma')"
        )
        cur.execute(
            "UPDATE replayable.dead_letters SET dag_id = 'document_pipeline', try_number = 2"
            " WHERE item_key = 'ec'"
        )
    conn.commit()
    return dict(zip(("encrypted", "bad_input", "redriven"), ids, strict=True))


@pytest.fixture(scope="module")
def auth_manager() -> Any:
    """Airflow's configured auth manager, created as the API server creates it."""
    return create_auth_manager()


@pytest.fixture
def app(dsn: str, auth_manager: Any) -> Iterator[FastAPI]:
    built = create_app(dsn_provider=lambda: dsn)
    yield built
    built.state.pool.close()


@pytest.fixture
def make_app(auth_manager: Any) -> Iterator[Any]:
    """create_app for a test that needs other settings; its pool is closed afterwards."""
    made: list[FastAPI] = []

    def make(*args: Any, **kwargs: Any) -> FastAPI:
        made.append(create_app(*args, **kwargs))
        return made[-1]

    yield make
    for built in made:
        built.state.pool.close()


def _mounted(app: FastAPI) -> FastAPI:
    """A root app with ours at /replayable, as Airflow's init_plugins mounts it."""
    root = FastAPI()
    root.mount("/replayable", app)
    return root


@pytest.fixture
def anonymous(app: FastAPI) -> TestClient:
    return TestClient(_mounted(app))


_USERS: dict[str, SimpleAuthManagerUser] = {}


def _test_identity(request: Request) -> SimpleAuthManagerUser:
    """Stands in for Airflow's get_user: the user whom the test client says it acts as."""
    user = _USERS.get(request.headers.get("x-test-user", ""))
    if user is None:
        raise HTTPException(401, "Not authenticated")
    return user


def _as(app: FastAPI, user: SimpleAuthManagerUser) -> TestClient:
    """A client acting as ``user``; several clients of one app can act as different users."""
    # Only Airflow's identity dependency is replaced (see the module docstring).
    app.dependency_overrides[get_user] = _test_identity
    key = f"{user.username}:{user.role}"
    _USERS[key] = user
    headers = {"Origin": ORIGIN, "X-Test-User": key}
    return TestClient(_mounted(app), headers=headers, follow_redirects=False)


@pytest.fixture
def client(app: FastAPI) -> TestClient:
    """Logged in as the viewer "carol", posting from the page's own origin."""
    return _as(app, SimpleAuthManagerUser(username="carol", role="VIEWER"))


@pytest.fixture
def editor(app: FastAPI) -> TestClient:
    """Logged in as "erin", whose role (USER) may edit DAGs, posting from the page's origin."""
    return _as(app, SimpleAuthManagerUser(username="erin", role="USER"))


def _routes(app: FastAPI) -> list[tuple[str, str]]:
    """(method, path) of every route of the app, with a letter id filled in."""
    return sorted(
        (method, route.path.replace("{letter_id}", "1"))
        for route in app.routes
        if isinstance(route, APIRoute)
        for method in route.methods
    )


def test_the_stage_literal_lists_the_pipeline_stages() -> None:
    assert get_args(Stage) == STAGES


def test_the_dag_it_authorizes_against_is_the_pipeline() -> None:
    assert DAG_ID == devenv.DAG_ID
    assert f"def {DAG_ID}()" in (ROOT / "dags" / f"{DAG_ID}.py").read_text()


def test_every_route_refuses_anonymous_requests(app: FastAPI, anonymous: TestClient) -> None:
    routes = _routes(app)
    assert len(routes) == 12
    for method, path in routes:
        response = anonymous.request(method, "/replayable" + path, headers={"Origin": ORIGIN})
        assert response.status_code == 401, (method, path)


def test_there_are_no_anonymous_docs_routes(anonymous: TestClient) -> None:
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert anonymous.get("/replayable" + path).status_code == 404


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
    assert len(pages) == 9
    for path in pages:
        path = path.replace("/1", f"/{ledger['encrypted']}")
        assert reader.get("/replayable" + path).status_code == 200, (role, path)


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


def test_overview_counts_items_by_current_status_per_stage(
    client: TestClient, ledger: dict[str, int]
) -> None:
    data = client.get("/replayable/api/summary").json()
    stages = {s["stage"]: s for s in data["stages"]}
    assert [s["stage"] for s in data["stages"]] == list(STAGES)
    assert stages["extract"] == {
        "stage": "extract",
        "pending": 1,
        "running": 0,
        "done": 1,
        "failed": 1,
        "dead": 1,
        "total": 4,
        "open_dead_letters": 1,
    }
    assert stages["chunk"]["running"] == 1 and stages["chunk"]["total"] == 1
    assert stages["embed"]["failed"] == 1 and stages["embed"]["open_dead_letters"] == 1
    assert data["open_dead_letters"] == 2

    page = client.get("/replayable/")
    assert page.status_code == 200
    assert "failed?stage=extract" in page.text and "dead-letters?stage=embed" in page.text


def test_failed_list_shows_only_items_whose_current_status_is_failed(
    client: TestClient, ledger: dict[str, int]
) -> None:
    data = client.get("/replayable/api/failed").json()
    assert data["matched"] == 2
    assert [(i["stage"], i["item_key"]) for i in data["items"]] == [
        ("embed", "ma"),
        ("extract", "eb"),
    ]
    embed = data["items"][0]
    assert (embed["run_id"], embed["map_index"], embed["attempts"]) == ("r1", 3, 2)

    page = client.get("/replayable/failed").text
    assert "b.pdf" in page and "a.pdf" in page and "superseded" not in page


@pytest.mark.parametrize(
    ("query", "keys"),
    [
        ("stage=extract", ["eb"]),
        ("error_class=http_429", ["ma"]),
        ("error_class=http_429&error_class=http_503", ["ma", "eb"]),
        ("error_class=http_429,+http_503", ["ma", "eb"]),  # as the page shows a filter
        ("stage=embed&error_class=http_503", []),
        ("stage=&error_class=", ["ma", "eb"]),  # what the filter form sends for "any"
        ("limit=1", ["ma"]),
    ],
)
def test_failed_list_filters_by_stage_error_class_and_limit(
    client: TestClient, ledger: dict[str, int], query: str, keys: list[str]
) -> None:
    data = client.get(f"/replayable/api/failed?{query}").json()
    assert [i["item_key"] for i in data["items"]] == keys
    assert client.get(f"/replayable/failed?{query}").status_code == 200


def test_dead_letter_list_defaults_to_open_letters(
    client: TestClient, ledger: dict[str, int]
) -> None:
    data = client.get("/replayable/api/dead-letters").json()
    assert [d["id"] for d in data["dead_letters"]] == [ledger["bad_input"], ledger["encrypted"]]
    assert {d["status"] for d in data["dead_letters"]} == {"open"}

    page = client.get("/replayable/dead-letters").text
    assert "m-old" not in page and "<details>" in page


def test_dead_letter_list_filters_by_status_and_stage(
    client: TestClient, ledger: dict[str, int]
) -> None:
    every = client.get("/replayable/api/dead-letters?status=all").json()
    assert every["matched"] == 3
    redriven = client.get("/replayable/api/dead-letters?status=redriven&stage=embed").json()
    assert [d["id"] for d in redriven["dead_letters"]] == [ledger["redriven"]]
    none = client.get("/replayable/api/dead-letters?status=ignored").json()
    assert none == {"matched": 0, "dead_letters": [], "next_after": None}


def test_hostile_values_are_escaped_in_every_page(
    client: TestClient, editor: TestClient, ledger: dict[str, int]
) -> None:
    letter = ledger["encrypted"]
    pages = ("/replayable/failed", "/replayable/dead-letters", f"/replayable/dead-letters/{letter}")
    for path in pages:
        page = client.get(path).text
        assert "<script" not in page, path
        assert html.escape(HOSTILE) in page, path  # shown, as text
    # The owner also sits in an input's value attribute: the quote must not close it.
    editor.post(
        f"/replayable/dead-letters/{ledger['bad_input']}/assign",
        data={"owner": '"><script>x</script>', "note": "n"},
    )
    for path in ("/replayable/dead-letters", f"/replayable/dead-letters/{ledger['bad_input']}"):
        page = client.get(path).text
        assert "<script" not in page
        assert 'value="&#34;&gt;&lt;script&gt;x&lt;/script&gt;"' in page


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


def test_pages_use_only_relative_urls(client: TestClient, ledger: dict[str, int]) -> None:
    """The page is served under /replayable/ and framed at /plugin/replayable."""
    letter = f"/replayable/dead-letters/{ledger['encrypted']}"
    for path in ("/replayable/", "/replayable/failed", "/replayable/dead-letters", letter):
        urls = re.findall(r'(?:href|action)="([^"]*)"', client.get(path).text)
        assert urls, path
        assert not [u for u in urls if u.startswith(("/", "http:", "https:"))], path


def test_the_letter_page_links_resolve_to_the_app_routes(
    client: TestClient, ledger: dict[str, int]
) -> None:
    letter = ledger["encrypted"]
    page = client.get(f"/replayable/dead-letters/{letter}")
    base = page.url
    urls = {str(base.join(u).path) for u in re.findall(r'(?:href|action)="([^"]*)"', page.text)}
    assert {
        "/replayable/",
        "/replayable/failed",
        "/replayable/dead-letters",
        f"/replayable/dead-letters/{letter}/assign",
        f"/replayable/dead-letters/{letter}/ignore",
    } <= urls


def test_ignore_resolves_an_open_letter_as_the_user_with_the_reason(
    editor: TestClient, conn: Any, ledger: dict[str, int]
) -> None:
    letter = ledger["encrypted"]
    response = editor.post(
        f"/replayable/dead-letters/{letter}/ignore",
        data={"reason": "  known encrypted sample  ", "stage": "extract", "status": "open"},
    )
    assert response.status_code == 303
    target = response.url.join(response.headers["location"])
    assert target.path == "/replayable/dead-letters"
    assert dict(target.params) == {"stage": "extract", "status": "open", "limit": "100"}
    state = _letter(conn, letter)
    assert state["status"] == "ignored"
    assert state["resolved_by"] == "erin"
    assert state["resolution"] == "known encrypted sample"
    assert state["resolved_at"] is not None
    assert editor.get(str(target)).status_code == 200


def test_ignoring_keeps_the_owners_note(
    editor: TestClient, conn: Any, ledger: dict[str, int]
) -> None:
    letter = ledger["bad_input"]  # alice's, noted "looking"
    response = editor.post(f"/replayable/dead-letters/{letter}/ignore", data={"reason": "dup"})
    assert response.status_code == 303
    state = _letter(conn, letter)
    assert (state["owner"], state["note"], state["resolution"]) == ("alice", "looking", "dup")


def test_ignore_without_a_reason_is_422(
    editor: TestClient, conn: Any, ledger: dict[str, int]
) -> None:
    letter = ledger["encrypted"]
    for data in ({}, {"reason": "   "}, {"reason": "\x00why"}, {"reason": "\x1b[2Jwhy"}):
        assert (
            editor.post(f"/replayable/dead-letters/{letter}/ignore", data=data).status_code == 422
        )
    assert _letter(conn, letter)["status"] == "open"


def test_assign_sets_owner_and_note_and_blanks_clear_them(
    editor: TestClient, conn: Any, ledger: dict[str, int]
) -> None:
    letter = ledger["bad_input"]
    url = f"/replayable/dead-letters/{letter}/assign"
    assert editor.post(url, data={"owner": "bob", "note": "mine now"}).status_code == 303
    state = _letter(conn, letter)
    assert (state["status"], state["owner"], state["note"]) == ("open", "bob", "mine now")
    assert state["resolved_by"] is None
    assert editor.post(url, data={"owner": " ", "note": ""}).status_code == 303
    state = _letter(conn, letter)
    assert (state["owner"], state["note"]) == (None, None)


def test_every_change_is_kept_in_the_letters_history_with_who_and_when(
    app: FastAPI, editor: TestClient, conn: Any, ledger: dict[str, int]
) -> None:
    letter = ledger["bad_input"]  # alice's, noted "looking"
    url = f"/replayable/dead-letters/{letter}"
    editor.post(f"{url}/assign", data={"owner": "bob", "note": "mine now"})
    operator = _as(app, SimpleAuthManagerUser(username="olga", role="OP"))
    operator.post(f"{url}/assign", data={"owner": "bob", "note": "provider bug"})
    operator.post(f"{url}/ignore", data={"reason": "fixed upstream"})
    assert _history(conn, letter) == [
        ("erin", "assigned", "open", "bob", "mine now", None, True),
        ("olga", "noted", "open", "bob", "provider bug", None, True),
        ("olga", "ignored", "ignored", "bob", "provider bug", "fixed upstream", True),
    ]
    shown = operator.get(f"/replayable/api/dead-letters/{letter}").json()
    assert [(c["actor"], c["action"], c["note"]) for c in shown["history"]] == [
        ("erin", "assigned", "mine now"),
        ("olga", "noted", "provider bug"),
        ("olga", "ignored", "provider bug"),
    ]
    page = operator.get(url).text
    assert "mine now" in page and "erin" in page and "fixed upstream" in page


def test_the_history_is_append_only(editor: TestClient, conn: Any, ledger: dict[str, int]) -> None:
    letter = ledger["bad_input"]
    editor.post(f"/replayable/dead-letters/{letter}/assign", data={"owner": "bob"})
    for statement in (
        "UPDATE replayable.dead_letter_history SET actor = 'mallory'",
        "DELETE FROM replayable.dead_letter_history",
    ):
        with conn.cursor() as cur, pytest.raises(psycopg2.errors.RaiseException):
            cur.execute(statement)
        conn.rollback()
    assert [row[0] for row in _history(conn, letter)] == ["erin"]


def test_pipeline_resolutions_enter_the_history_under_their_resolver(
    conn: Any, ledger: dict[str, int]
) -> None:
    letter = ledger["encrypted"]
    with conn.cursor() as cur:
        cur.execute(
            "UPDATE replayable.dead_letters SET status = 'redriven', resolved_at = now(),"
            " resolved_by = 'run r9', resolution = 'provider fixed' WHERE id = %s",
            (letter,),
        )
    conn.commit()
    assert _history(conn, letter) == [
        ("run r9", "redriven", "redriven", None, HOSTILE, "provider fixed", True)
    ]


@pytest.mark.parametrize("action", ["ignore", "assign"])
def test_changing_a_letter_that_is_not_open_is_409(
    editor: TestClient, conn: Any, ledger: dict[str, int], action: str
) -> None:
    letter = ledger["redriven"]
    response = editor.post(
        f"/replayable/dead-letters/{letter}/{action}", data={"owner": "x", "reason": "why"}
    )
    assert response.status_code == 409
    assert "redriven" in response.json()["detail"]
    assert _letter(conn, letter)["note"] == "redriven by r3"


@pytest.mark.parametrize("action", ["ignore", "assign"])
def test_changing_a_missing_letter_is_404(
    editor: TestClient, ledger: dict[str, int], action: str
) -> None:
    missing = max(ledger.values()) + 1000
    response = editor.post(f"/replayable/dead-letters/{missing}/{action}", data={"reason": "n"})
    assert response.status_code == 404
    assert editor.get(f"/replayable/dead-letters/{missing}").status_code == 404


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


@pytest.mark.parametrize(
    "query",
    [
        "/api/failed?stage=summarise",
        "/failed?stage=EXTRACT",
        "/failed?limit=0",
        "/api/failed?limit=501",
        "/api/dead-letters?limit=x",
        "/dead-letters?status=closed",
        "/api/dead-letters?stage=chunk;drop",
    ],
)
def test_invalid_stage_status_or_limit_is_422(
    client: TestClient, ledger: dict[str, int], query: str
) -> None:
    assert client.get("/replayable" + query).status_code == 422


def test_json_api_shapes(client: TestClient, ledger: dict[str, int]) -> None:
    summary = client.get("/replayable/api/summary").json()
    assert set(summary) == {"stages", "open_dead_letters", "outbox"}
    failed = client.get("/replayable/api/failed").json()
    assert set(failed) == {"matched", "items", "next_after"}
    assert set(failed["items"][0]) == {
        "stage",
        "item_key",
        "doc_id",
        "uri",
        "attempts",
        "error_class",
        "last_error",
        "code_version",
        "dag_id",
        "run_id",
        "map_index",
        "try_number",
        "updated_at",
        "links",
    }
    letters = client.get("/replayable/api/dead-letters").json()
    assert set(letters) == {"matched", "dead_letters", "next_after"}
    letter = letters["dead_letters"][-1]
    assert letter["error"] == HOSTILE and letter["traceback"] == HOSTILE  # JSON is not HTML
    assert {"id", "owner", "note", "status", "run_id", "map_index", "resolved_by"} <= set(letter)
    assert {"try_number", "links"} <= set(letter)
    chart = client.get("/replayable/api/dead-letters/per-hour").json()
    assert set(chart) == {"hours", "per_hour", "total", "peak"}


def test_an_unreachable_database_is_503_without_the_dsn(make_app: Any) -> None:
    unreachable = "postgresql://u:hunter2@127.0.0.1:1/replayable?connect_timeout=2"
    client = _as(make_app(lambda: unreachable), SimpleAuthManagerUser(username="c", role="ADMIN"))
    response = client.get("/replayable/api/summary")
    assert response.status_code == 503
    assert "hunter2" not in response.text and "replayable_db" in response.text


def test_a_database_without_the_schema_is_503(dsn: str, make_app: Any) -> None:
    other = psycopg2.extensions.make_dsn(dsn, dbname="postgres")
    client = _as(make_app(lambda: other), SimpleAuthManagerUser(username="c", role="ADMIN"))
    response = client.get("/replayable/api/summary")
    assert response.status_code == 503
    assert "schema" in response.json()["detail"]


def test_the_default_dsn_comes_from_the_airflow_connection(
    services: devenv.Services,
    state_dir: Path,
    ledger: dict[str, int],
    make_app: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conn_json = devenv.airflow_env(services, state_dir)["AIRFLOW_CONN_REPLAYABLE_DB"]
    monkeypatch.setenv("AIRFLOW_CONN_REPLAYABLE_DB", conn_json)
    client = _as(make_app(), SimpleAuthManagerUser(username="c", role="VIEWER"))
    assert client.get("/replayable/api/summary").json()["open_dead_letters"] == 2


# ---- the database: a pool, a statement timeout, read-only reads ---------------------------


def _dependencies(dependant: Dependant) -> set[Any]:
    found = {dependant.call}
    for sub in dependant.dependencies:
        found |= _dependencies(sub)
    return found


def test_every_read_route_gets_a_read_only_connection(app: FastAPI) -> None:
    for route in app.routes:
        if isinstance(route, APIRoute) and "GET" in route.methods:
            calls = _dependencies(route.dependant)
            assert _read_connection in calls and _write_connection not in calls, route.path


def test_a_read_route_cannot_write(
    make_app: Any, dsn: str, conn: Any, ledger: dict[str, int]
) -> None:
    """Even a read route with a bug that writes is stopped by its read-only transaction."""
    app = make_app(lambda: dsn)

    @app.get("/careless")
    def careless(conn: ReadConn) -> None:
        with conn.cursor() as cur:
            cur.execute("UPDATE replayable.dead_letters SET owner = 'mallory'")

    client = _as(app, SimpleAuthManagerUser(username="c", role="ADMIN"))
    with pytest.raises(psycopg2.errors.ReadOnlySqlTransaction):
        client.get("/replayable/careless")
    assert _letter(conn, ledger["bad_input"])["owner"] == "alice"


def test_a_slow_query_is_cut_off_by_the_statement_timeout(
    make_app: Any, dsn: str, conn: Any, ledger: dict[str, int]
) -> None:
    """A page whose query waits (here on a lock) answers 503 at the timeout, not later."""
    app = make_app(lambda: dsn, statement_timeout_s=0.5)
    client = _as(app, SimpleAuthManagerUser(username="c", role="VIEWER"))
    with conn.cursor() as cur:
        cur.execute("LOCK TABLE replayable.dead_letters IN ACCESS EXCLUSIVE MODE")
    try:
        started = time.monotonic()
        response = client.get("/replayable/api/dead-letters")
        elapsed = time.monotonic() - started
    finally:
        conn.rollback()
    assert response.status_code == 503 and "0.5 s" in response.json()["detail"]
    assert elapsed < 3
    assert client.get("/replayable/api/dead-letters").status_code == 200  # the pool recovers


def test_the_pool_never_opens_more_connections_than_its_size(dsn: str) -> None:
    pool = ConnectionPool(lambda: dsn, size=2, statement_timeout_s=5)
    seen: set[int] = set()
    refused: list[int] = []
    lock = threading.Lock()

    def use() -> None:
        try:
            with pool.connection(readonly=True) as conn:
                rows = db.fetch_all(conn, "views/dead_letter_status", {"id": 0})
                assert rows == []
                with conn.cursor() as cur:
                    cur.execute("SELECT pg_backend_pid(), pg_sleep(0.05)")
                    pid = cur.fetchone()[0]
                with lock:
                    seen.add(pid)
        except PoolBusyError:
            with lock:
                refused.append(1)

    try:
        threads = [threading.Thread(target=use) for _ in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert 1 <= len(seen) <= 2
        assert pool.in_use == 0
    finally:
        pool.close()


def test_the_pool_sets_the_statement_timeout_and_read_only_transactions(dsn: str) -> None:
    pool = ConnectionPool(lambda: dsn, size=1, statement_timeout_s=0.2)
    try:
        with pool.connection(readonly=True) as conn, conn.cursor() as cur:
            cur.execute("SHOW statement_timeout")
            assert cur.fetchone() == ("200ms",)
            cur.execute("SHOW transaction_read_only")
            assert cur.fetchone() == ("on",)
            with pytest.raises(psycopg2.errors.QueryCanceled):
                cur.execute("SELECT pg_sleep(2)")
        with pool.connection(readonly=False) as conn, conn.cursor() as cur:
            cur.execute("SHOW transaction_read_only")
            assert cur.fetchone() == ("off",)
    finally:
        pool.close()


def test_a_busy_pool_answers_503(make_app: Any, dsn: str, ledger: dict[str, int]) -> None:
    app = make_app(lambda: dsn, pool_size=1)
    client = _as(app, SimpleAuthManagerUser(username="c", role="VIEWER"))
    with app.state.pool.connection(readonly=True):
        assert client.get("/replayable/api/summary").status_code == 503
    assert client.get("/replayable/api/summary").status_code == 200


def test_a_request_that_finds_every_connection_taken_is_refused_before_one_comes_free(
    make_app: Any, dsn: str, ledger: dict[str, int]
) -> None:
    """No request waits in a worker thread for a connection (ADR 0073): it is answered 503,
    with Retry-After, while the only connection is still taken."""
    app = make_app(lambda: dsn, pool_size=1)
    client = _as(app, SimpleAuthManagerUser(username="c", role="VIEWER"))
    answers: list[Any] = []
    asker = threading.Thread(target=lambda: answers.append(client.get("/replayable/api/summary")))
    with app.state.pool.connection(readonly=True):
        asker.start()
        # A request that waited for the connection would get it once this block gives it back.
        asker.join(timeout=5)
    asker.join(timeout=60)
    (answer,) = answers
    assert answer.status_code == 503, answer.text
    assert answer.headers["retry-after"] == str(RETRY_AFTER_S)
    assert "busy" in answer.json()["detail"]
    assert client.get("/replayable/api/summary").status_code == 200


def test_the_pool_refuses_at_once_when_every_connection_is_taken(dsn: str) -> None:
    pool = ConnectionPool(lambda: dsn, size=1)
    outcome: list[str] = []

    def take() -> None:
        try:
            with pool.connection(readonly=True):
                outcome.append("connection")
        except PoolBusyError:
            outcome.append("busy")

    contender = threading.Thread(target=take)
    try:
        with pool.connection(readonly=True):
            contender.start()
            contender.join(timeout=5)  # a waiting contender would take the freed connection
        contender.join(timeout=60)
        assert outcome == ["busy"]
        assert pool.in_use == 0
    finally:
        pool.close()


def test_the_plugin_mounts_the_app_at_replayable_with_a_browse_view() -> None:
    spec = importlib.util.spec_from_file_location(
        "replayable_plugin", ROOT / "plugins" / "replayable_plugin.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    plugin = module.ReplayablePlugin

    [entry] = plugin.fastapi_apps
    assert isinstance(entry["app"], FastAPI)
    assert (entry["url_prefix"], entry["name"]) == ("/replayable", "Replayable")
    assert not entry["url_prefix"].startswith(tuple(RESERVED_URL_PREFIXES))

    [view] = plugin.external_views
    # Validated with the model that GET /api/v2/plugins answers with.
    parsed = ExternalViewResponse.model_validate(view)
    assert (parsed.name, parsed.href, parsed.url_route) == (
        "Replayable",
        "/replayable/",
        "replayable",
    )
    assert (parsed.destination, parsed.category) == ("nav", "browse")
    # The plugin's app is as protected as the one the tests build.
    assert TestClient(_mounted(entry["app"])).get("/replayable/").status_code == 401


def test_pages_follow_a_keyset_cursor_to_the_end(
    client: TestClient, ledger: dict[str, int]
) -> None:
    """Each page's next_after leads to the next rows; no row repeats and none is skipped."""
    seen: list[int] = []
    after = None
    while True:
        query = "status=all&limit=1" + (f"&after={after}" if after else "")
        page = client.get(f"/replayable/api/dead-letters?{query}").json()
        seen += [d["id"] for d in page["dead_letters"]]
        after = page["next_after"]
        if after is None:
            break
    assert sorted(seen) == sorted(ledger.values()) and len(seen) == 3
    failed_ids = []
    after = None
    while True:
        page = client.get(
            "/replayable/api/failed?limit=1" + (f"&after={after}" if after else "")
        ).json()
        failed_ids += [(i["stage"], i["doc_id"]) for i in page["items"]]
        after = page["next_after"]
        if after is None:
            break
    assert sorted(failed_ids) == [("embed", A), ("extract", B)]
    html_page = client.get("/replayable/dead-letters?status=all&limit=1").text
    assert "Next page" in html_page


@pytest.mark.parametrize(
    "cursor",
    [
        "bm90LWEtY3Vyc29y",  # "not-a-cursor"
        # A well-formed cursor whose id is past bigint: refused, not a database error.
        "MjAyNi0wMS0wMVQwMDowMDowMCswMDowMAA5OTk5OTk5OTk5OTk5OTk5OTk5OTk5",
    ],
)
def test_a_bad_cursor_is_refused_naming_it(
    client: TestClient, ledger: dict[str, int], cursor: str
) -> None:
    response = client.get(f"/replayable/api/dead-letters?after={cursor}")
    assert response.status_code == 400 and "after" in response.text


# ---- links into Airflow's UI (ADR 0060) ----------------------------------------------------


def _hrefs(page: Any) -> set[str]:
    """Every link of a page, resolved against the page's URL (path and query)."""
    found = set()
    for href in re.findall(r'href="([^"]*)"', page.text):
        url = page.url.join(html.unescape(href))
        found.add(url.path + (f"?{url.query.decode()}" if url.query else ""))
    return found


def test_failed_items_and_letters_link_to_their_task_instance_run_and_log(
    client: TestClient, ledger: dict[str, int]
) -> None:
    run = "dags/document_pipeline/runs/r1"
    item = client.get("/replayable/api/failed?stage=extract").json()["items"][0]
    assert item["links"] == {
        "run": run,
        "task_instance": f"{run}/tasks/batch.extract/mapped/1/details",
        "log": f"{run}/tasks/batch.extract/mapped/1?try_number=1",
    }
    letter = client.get(f"/replayable/api/dead-letters/{ledger['encrypted']}").json()
    run = "dags/document_pipeline/runs/r2"
    assert letter["links"] == {
        "run": run,
        "task_instance": f"{run}/tasks/batch.extract/mapped/0/details",
        "log": f"{run}/tasks/batch.extract/mapped/0?try_number=2",
    }
    # A letter whose row names no DAG run has nowhere to link to.
    other = client.get(f"/replayable/api/dead-letters/{ledger['bad_input']}").json()
    assert other["links"] is None


def test_pages_link_into_airflow_relative_to_its_base_path(
    app: FastAPI, ledger: dict[str, int]
) -> None:
    """Served at <base>/replayable/..., a page's Airflow links resolve to <base>/dags/...."""
    letter = ledger["encrypted"]
    for base in ("", "/airflow"):
        root = FastAPI()
        root.mount(f"{base}/replayable", app)
        app.dependency_overrides[get_user] = _test_identity
        _USERS["v:VIEWER"] = SimpleAuthManagerUser(username="v", role="VIEWER")
        viewer = TestClient(root, headers={"X-Test-User": "v:VIEWER"})
        log = f"{base}/dags/document_pipeline/runs/r2/tasks/batch.extract/mapped/0?try_number=2"
        for path in ("/dead-letters", f"/dead-letters/{letter}"):
            hrefs = _hrefs(viewer.get(f"{base}/replayable{path}"))
            assert log in hrefs, (base, path)
            assert f"{base}/dags/document_pipeline/runs/r2" in hrefs
        failed = _hrefs(viewer.get(f"{base}/replayable/failed"))
        assert f"{base}/dags/document_pipeline/runs/r1/tasks/batch.extract/mapped/1/details" in (
            failed
        )


# ---- the chart of letters created per hour ---------------------------------------------------


def test_the_chart_counts_the_letters_created_in_each_of_the_last_48_hours(
    client: TestClient, conn: Any, ledger: dict[str, int]
) -> None:
    with conn.cursor() as cur:
        # Two hours ago (twice), 47.5 hours ago (the window's first hour, or just before it),
        # and three days ago (outside the window): the test buckets them itself below.
        cur.execute(
            "INSERT INTO replayable.dead_letters (stage, item_key, doc_id, error_class,"
            " error_kind, error, attempts, code_version, status, created_at)"
            " SELECT 'chunk', 'h' || n, %s, 'timeout', 'retryable', 'slow', 3, '1', 'ignored',"
            " now() - make_interval(mins => m)"
            " FROM unnest(ARRAY[1, 2, 3, 4], ARRAY[120, 121, 2850, 4320]) AS t (n, m)",
            (A,),
        )
        cur.execute("SELECT created_at, now() FROM replayable.dead_letters")
        found = cur.fetchall()
    conn.commit()
    now = found[0][1].astimezone(UTC)
    first = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=47)
    expected = [0] * 48
    for created, _ in found:
        index = int((created.astimezone(UTC) - first).total_seconds() // 3600)
        if 0 <= index < 48:
            expected[index] += 1

    chart = client.get("/replayable/api/dead-letters/per-hour").json()
    assert [h["created"] for h in chart["per_hour"]] == expected
    assert chart["total"] == sum(expected) and chart["peak"] == max(expected)
    hours = [datetime.fromisoformat(h["hour"]) for h in chart["per_hour"]]
    assert hours[0] == first and hours[-1] == first + timedelta(hours=47)

    page = client.get("/replayable/").text
    assert "<script" not in page
    assert page.count('class="bar"') == sum(1 for n in expected if n)
    assert page.count('class="zero"') == sum(1 for n in expected if not n)
    table = re.search(r'<table class="per-hour">(.*?)</table>', page, re.S)
    assert table is not None
    cells = re.findall(r'<td class="num">(\d+)</td>', table.group(1))
    assert [int(c) for c in cells] == expected


def test_a_bar_lists_the_letters_of_its_hour(client: TestClient, ledger: dict[str, int]) -> None:
    page = client.get("/replayable/")
    bars = [h for h in _hrefs(page) if h.startswith("/replayable/dead-letters?status=all")]
    assert bars
    for bar in bars:
        listed = client.get(bar.replace("/dead-letters", "/api/dead-letters")).json()
        assert listed["matched"] >= 1


# ---- filters and keyset paging of the dead-letter list ---------------------------------------


def _iso(conn: Any, sql: str) -> str:
    with conn.cursor() as cur:
        cur.execute(sql)
        (moment,) = cur.fetchone()
    conn.commit()
    return str(moment.astimezone(UTC).replace(tzinfo=None).isoformat())


def test_dead_letters_filter_by_error_class_and_creation_time(
    client: TestClient, conn: Any, ledger: dict[str, int]
) -> None:
    def ids(query: str) -> list[int]:
        return [
            d["id"]
            for d in client.get(f"/replayable/api/dead-letters?{query}").json()["dead_letters"]
        ]

    assert ids("status=all&error_class=http_400") == [ledger["bad_input"]]
    assert ids("status=all&error_class=http_400,encrypted") == [
        ledger["bad_input"],
        ledger["encrypted"],
    ]
    # The letters are 3, 2 and 1 minutes old; a time without a zone is UTC.
    middle = _iso(conn, "SELECT now() - interval '150 seconds'")
    assert ids(f"status=all&since={middle}") == [ledger["redriven"], ledger["bad_input"]]
    assert ids(f"status=all&until={middle}") == [ledger["encrypted"]]
    assert ids(f"status=all&since={middle}Z&error_class=http_500") == [ledger["redriven"]]
    assert ids("since=&until=&error_class=") == [ledger["bad_input"], ledger["encrypted"]]
    page = client.get(f"/replayable/dead-letters?status=all&since={middle}").text
    assert f'name="since" type="datetime-local" step="1" value="{middle[:19]}"' in page


def test_keyset_paging_keeps_the_filters(
    client: TestClient, conn: Any, ledger: dict[str, int]
) -> None:
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO replayable.dead_letters (stage, item_key, doc_id, error_class,"
            " error_kind, error, attempts, code_version, created_at)"
            " SELECT 'embed', 'p' || n, %s, CASE WHEN n %% 2 = 0 THEN 'http_400' ELSE 'x' END,"
            " 'terminal', 'e', 1, '1', now() - make_interval(mins => 10 + n)"
            " FROM generate_series(1, 9) AS n RETURNING id, error_class",
            (B,),
        )
        wanted = {row[0] for row in cur.fetchall() if row[1] == "http_400"}
    conn.commit()
    wanted.add(ledger["bad_input"])
    since = _iso(conn, "SELECT now() - interval '1 hour'")
    query: str | None = f"error_class=http_400&since={since}&limit=2"
    seen: list[int] = []
    while query is not None:
        page = client.get(f"/replayable/dead-letters?{query}")
        seen += [int(i) for i in re.findall(r'<tbody class="letter" id="dl-(\d+)">', page.text)]
        nxt = re.search(r'<a href="\?([^"]*)">Next page', page.text)
        query = html.unescape(nxt.group(1)) if nxt else None
        if query is not None:
            assert "error_class=http_400" in query and "since=" in query
    assert len(seen) == len(set(seen)) and set(seen) == wanted


# ---- redrive (ADR 0062) ----------------------------------------------------------------------


@pytest.fixture
def fake_airflow() -> Iterator[FakeAirflow]:
    with FakeAirflow() as airflow:
        yield airflow


def _redriver(make_app: Any, dsn: str, url: str, role: str = "USER") -> TestClient:
    """A client of an app that reaches Airflow at ``url``, logged in with the UI cookie."""
    app = make_app(lambda: dsn, airflow_api_url=url)
    client = _as(app, SimpleAuthManagerUser(username="erin", role=role))
    client.cookies.set("_token", f"cookie-jwt-{role}")
    return client


def test_redriving_ticked_letters_triggers_a_run_per_stage_as_the_user(
    make_app: Any, dsn: str, conn: Any, ledger: dict[str, int], fake_airflow: FakeAirflow
) -> None:
    client = _redriver(make_app, dsn, fake_airflow.url)
    ticked = [ledger["encrypted"], ledger["bad_input"], ledger["redriven"], ledger["bad_input"]]
    page = client.post(
        "/replayable/dead-letters/redrive",
        data={"scope": "selected", "ids": ticked, "reason": " provider fixed ", "stage": "embed"},
    )
    assert page.status_code == 200, page.text
    assert [s.path for s in fake_airflow.triggers] == ["/api/v2/dags/document_pipeline/dagRuns"] * 2
    assert {s.authorization for s in fake_airflow.triggers} == {"Bearer cookie-jwt-USER"}
    confs = {s.body["conf"]["redrive"]["stage"]: s.body for s in fake_airflow.triggers}
    assert confs["embed"]["conf"] == {
        "redrive": {
            "stage": "embed",
            "ids": [ledger["bad_input"]],  # the redriven letter is not open: left out
            "reason": "provider fixed",
            "by": "erin",
        }
    }
    assert confs["extract"]["conf"]["redrive"]["ids"] == [ledger["encrypted"]]
    assert all(body["logical_date"] is None for body in confs.values())
    assert "erin" in confs["embed"]["note"] and "provider fixed" in confs["embed"]["note"]
    hrefs = _hrefs(page)
    assert {
        "/dags/document_pipeline/runs/manual__fake-1",
        "/dags/document_pipeline/runs/manual__fake-2",
        "/replayable/dead-letters?stage=embed&status=open&limit=100",
    } <= hrefs
    # The page only asked Airflow: the run closes the letters when it takes them.
    assert _letter(conn, ledger["encrypted"])["status"] == "open"
    assert _history(conn, ledger["encrypted"]) == []


def test_redriving_the_matching_letters_ends_at_the_moment_they_were_counted(
    make_app: Any, dsn: str, conn: Any, ledger: dict[str, int], fake_airflow: FakeAirflow
) -> None:
    client = _redriver(make_app, dsn, fake_airflow.url)
    since = _iso(conn, "SELECT now() - interval '1 hour'")
    before = datetime.now(UTC)
    page = client.post(
        "/replayable/dead-letters/redrive",
        data={
            "scope": "matching",
            "stage": "embed",
            "error_class": "http_400",
            "since": since,
            "until": "",
            "reason": "provider fixed",
            "ids": [ledger["encrypted"]],  # ticked, but this asks for every match
        },
    )
    assert page.status_code == 200, page.text
    (sent,) = fake_airflow.triggers
    redrive = sent.body["conf"]["redrive"]
    assert {k: v for k, v in redrive.items() if k != "until"} == {
        "stage": "embed",
        "error_class": ["http_400"],
        "since": f"{since}+00:00",
        "reason": "provider fixed",
        "by": "erin",
    }
    until = datetime.fromisoformat(redrive["until"])
    assert before - timedelta(seconds=5) < until <= datetime.now(UTC)
    assert "1</td>" in page.text  # one letter, one document


def test_a_viewer_may_not_redrive_and_airflow_is_never_asked(
    make_app: Any, dsn: str, ledger: dict[str, int], fake_airflow: FakeAirflow
) -> None:
    viewer = _redriver(make_app, dsn, fake_airflow.url, role="VIEWER")
    refused = viewer.post(
        "/replayable/dead-letters/redrive",
        data={"scope": "selected", "ids": [ledger["encrypted"]], "reason": "try it"},
    )
    assert refused.status_code == 403
    assert fake_airflow.sent == []


def test_a_cross_origin_redrive_is_refused(
    make_app: Any, dsn: str, ledger: dict[str, int], fake_airflow: FakeAirflow
) -> None:
    client = _redriver(make_app, dsn, fake_airflow.url)
    refused = client.post(
        "/replayable/dead-letters/redrive",
        data={"scope": "selected", "ids": [ledger["encrypted"]], "reason": "try it"},
        headers={"Origin": "http://evil.example"},
    )
    assert refused.status_code == 403 and fake_airflow.sent == []


def test_a_bearer_token_is_forwarded_as_it_came(
    make_app: Any, dsn: str, ledger: dict[str, int], fake_airflow: FakeAirflow
) -> None:
    client = _redriver(make_app, dsn, fake_airflow.url)
    response = client.post(
        "/replayable/dead-letters/redrive",
        data={"scope": "selected", "ids": [ledger["encrypted"]], "reason": "try it"},
        headers={"Authorization": "Bearer api-client-jwt", "Origin": ""},
    )
    assert response.status_code == 200
    assert [s.authorization for s in fake_airflow.triggers] == ["Bearer api-client-jwt"]


@pytest.mark.parametrize(
    ("answer", "status", "words"),
    [
        ((403, {"detail": "Forbidden"}), 403, "Airflow refused"),
        ((401, {"detail": "Token expired"}), 401, "Token expired"),
        ((400, {"detail": "Invalid input for param redrive"}), 400, "Invalid input"),
        ((500, {"detail": "boom"}), 502, "500"),
    ],
)
def test_airflows_refusal_is_passed_on(
    make_app: Any,
    dsn: str,
    ledger: dict[str, int],
    answer: tuple[int, dict[str, Any]],
    status: int,
    words: str,
) -> None:
    with FakeAirflow(answer=answer) as airflow:
        client = _redriver(make_app, dsn, airflow.url)
        response = client.post(
            "/replayable/dead-letters/redrive",
            data={"scope": "selected", "ids": [ledger["encrypted"]], "reason": "try it"},
        )
    assert response.status_code == status
    assert words in response.json()["detail"]


def test_an_unreachable_airflow_is_502(make_app: Any, dsn: str, ledger: dict[str, int]) -> None:
    client = _redriver(make_app, dsn, "http://127.0.0.1:1")
    response = client.post(
        "/replayable/dead-letters/redrive",
        data={"scope": "selected", "ids": [ledger["encrypted"]], "reason": "try it"},
    )
    assert response.status_code == 502 and "airflow_api_url" in response.json()["detail"]


class _WatchedAirflow(FakeAirflow):
    """Airflow's stand-in that, while a trigger call is in, runs ``during`` and keeps its result."""

    def __init__(self, during: Callable[[], Any]) -> None:
        super().__init__()
        self.during = during
        self.seen: list[Any] = []

    def respond(self, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        if path.endswith("/dagRuns"):
            self.seen.append(self.during())
        return super().respond(path, body)


def _ui_connections_in_a_transaction(dsn: str) -> int:
    """The UI pool's connections that the server sees inside a transaction: checked out."""
    with contextlib.closing(psycopg2.connect(dsn)) as watcher, watcher.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = 'replayable-ui' AND xact_start IS NOT NULL"
        )
        return int(cur.fetchone()[0])


def test_a_redrive_holds_no_database_connection_while_it_calls_airflow(
    make_app: Any, dsn: str, ledger: dict[str, int]
) -> None:
    """The letters are read and the connection given back before Airflow is asked (ADR 0073):
    a slow Airflow cannot keep the UI's few connections."""
    with _WatchedAirflow(lambda: _ui_connections_in_a_transaction(dsn)) as airflow:
        client = _redriver(make_app, dsn, airflow.url)
        page = client.post(
            "/replayable/dead-letters/redrive",
            data={
                "scope": "selected",
                "ids": [ledger["encrypted"], ledger["bad_input"]],
                "reason": "provider fixed",
            },
        )
    assert page.status_code == 200, page.text
    assert len(airflow.triggers) == 2  # one run per stage, each asked with no connection held
    assert airflow.seen == [0, 0]


def test_a_redrive_waits_for_airflow_without_holding_a_worker_thread(
    make_app: Any, dsn: str, ledger: dict[str, int]
) -> None:
    """With a single worker thread left, a sync route of the same server still answers while a
    redrive waits for Airflow: Airflow's own routes (its trigger route, task heartbeats) are
    sync routes of the API server the redrive calls back (ADR 0073)."""
    app = make_app(lambda: dsn, airflow_api_url="http://unset")
    user = SimpleAuthManagerUser(username="erin", role="USER")
    with _as(app, user) as client:

        def one_worker_thread() -> None:
            anyio.to_thread.current_default_thread_limiter().total_tokens = 1

        client.portal.call(one_worker_thread)  # type: ignore[union-attr]  # set in __enter__

        def sync_route_answers() -> int | None:
            answered: list[int] = []
            asker = threading.Thread(
                target=lambda: answered.append(client.get("/replayable/api/summary").status_code)
            )
            asker.start()
            asker.join(timeout=5)  # a starved route answers only after the redrive gave up
            return answered[0] if answered else None

        with _WatchedAirflow(sync_route_answers) as airflow:
            app.state.airflow_api_url = airflow.url
            client.cookies.set("_token", "cookie-jwt")
            page = client.post(
                "/replayable/dead-letters/redrive",
                data={"scope": "selected", "ids": [ledger["encrypted"]], "reason": "try it"},
            )
    assert page.status_code == 200, page.text
    assert airflow.seen == [200]


@pytest.mark.parametrize(
    ("form", "status"),
    [
        ({"scope": "selected", "reason": "why not"}, 400),  # nothing ticked
        ({"scope": "matching", "stage": "chunk", "reason": "why not"}, 409),  # nothing open
        ({"scope": "matching", "reason": " ab "}, 422),  # too short a reason
        ({"scope": "matching", "reason": "two\nlines"}, 422),
        ({"scope": "all", "reason": "why not"}, 422),
    ],
)
def test_a_redrive_needs_a_reason_and_letters_to_take(
    make_app: Any,
    dsn: str,
    ledger: dict[str, int],
    fake_airflow: FakeAirflow,
    form: dict[str, str],
    status: int,
) -> None:
    client = _redriver(make_app, dsn, fake_airflow.url)
    assert client.post("/replayable/dead-letters/redrive", data=form).status_code == status
    assert fake_airflow.sent == []


def test_the_dead_letter_page_offers_redrive_of_ticked_or_matching_open_letters(
    client: TestClient, ledger: dict[str, int]
) -> None:
    page = client.get("/replayable/dead-letters?error_class=encrypted").text
    form = re.search(r'<form id="redrive".*?</form>', page, re.S)
    assert form is not None and 'action="dead-letters/redrive"' in form.group(0)
    assert 'name="error_class" value="encrypted"' in form.group(0)
    assert f'name="ids" value="{ledger["encrypted"]}" form="redrive"' in page
    # Only open letters can be redriven: no form on other statuses, no box on closed rows.
    closed = client.get("/replayable/dead-letters?status=redriven").text
    assert 'id="redrive"' not in closed and 'name="ids"' not in closed


def test_without_configuration_the_api_server_calls_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from replayable.web.app import airflow_api_root

    state = type("State", (), {"airflow_api_url": None})()
    scope = {
        "type": "http",
        "app": type("App", (), {"state": state})(),
        "server": ("127.0.0.1", 8793),
        "headers": [(b"host", b"evil.example")],
    }
    monkeypatch.delenv("AIRFLOW__API__BASE_URL", raising=False)
    assert airflow_api_root(Request(scope)) == "http://127.0.0.1:8793"
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example/team/")
    assert airflow_api_root(Request(scope)) == "https://airflow.example/team"
    monkeypatch.setenv("AIRFLOW__REPLAYABLE__AIRFLOW_API_URL", "http://airflow-api:8080")
    assert airflow_api_root(Request(scope)) == "http://airflow-api:8080"
