"""The UI app's test fixtures: a small ledger, the app, and clients acting as Airflow users.

Authentication is Airflow's own ``get_user`` dependency, exercised for real by the anonymous
tests. The authenticated tests override exactly that one dependency with a
SimpleAuthManagerUser (a real JWT would need Airflow's metadata database for the revocation
check); authorisation still asks Airflow's configured auth manager (SimpleAuthManager), and
the database is the real test Postgres. tests/e2e/test_ui_in_airflow.py repeats the role
checks against a running Airflow with real tokens. A test module imports the fixtures it
uses (and those they use) from here.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
from airflow.api_fastapi.app import create_auth_manager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from airflow.api_fastapi.core_api.security import get_user
from fastapi import FastAPI, HTTPException, Request
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from devtools import devenv
from replayable.web import create_app

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


@pytest.fixture(name="ledger")
def ledger_fixture(conn: Any) -> dict[str, int]:
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


@pytest.fixture(name="connections")
def connections_fixture(
    services: devenv.Services, state_dir: Path, model: Any, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """The ledger's and the model's Airflow connections, as the real Airflow gets them."""
    found = {
        key: value
        for key, value in devenv.airflow_env(services, state_dir).items()
        if key.startswith("AIRFLOW_CONN_")
    }
    for key, value in found.items():
        monkeypatch.setenv(key, value)
    return found


@pytest.fixture(name="auth_manager", scope="module")
def auth_manager_fixture() -> Any:
    """Airflow's configured auth manager, created as the API server creates it."""
    return create_auth_manager()


@pytest.fixture(name="app")
def app_fixture(dsn: str, auth_manager: Any) -> Iterator[FastAPI]:
    built = create_app(dsn_provider=lambda: dsn)
    yield built
    built.state.pool.close()


@pytest.fixture(name="make_app")
def make_app_fixture(auth_manager: Any) -> Iterator[Any]:
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


@pytest.fixture(name="anonymous")
def anonymous_fixture(app: FastAPI) -> TestClient:
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


@pytest.fixture(name="client")
def client_fixture(app: FastAPI) -> TestClient:
    """Logged in as the viewer "carol", posting from the page's own origin."""
    return _as(app, SimpleAuthManagerUser(username="carol", role="VIEWER"))


@pytest.fixture(name="editor")
def editor_fixture(app: FastAPI) -> TestClient:
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


def _hrefs(page: Any) -> set[str]:
    """Every link of a page, resolved against the page's URL (path and query)."""
    found = set()
    for href in re.findall(r'href="([^"]*)"', page.text):
        url = page.url.join(html.unescape(href))
        found.add(url.path + (f"?{url.query.decode()}" if url.query else ""))
    return found


def _iso(conn: Any, sql: str) -> str:
    with conn.cursor() as cur:
        cur.execute(sql)
        (moment,) = cur.fetchone()
    conn.commit()
    return str(moment.astimezone(UTC).replace(tzinfo=None).isoformat())
