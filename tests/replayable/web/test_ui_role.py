"""The README's least-privilege role for the UI: the UI works with it, and it can do no more.

The GRANT block is read from README.md (between the ``<!-- ui-role -->`` marker and the end of
its code block) and run as it is, so the documentation cannot drift from what was tested.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import pytest
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from ui_fixtures import (  # noqa: F401 - fixtures
    _as,
    _letter,
    auth_manager_fixture,
    ledger_fixture,
    make_app_fixture,
)

from conftest import ROOT

ROLE = "replayable_ui"


def readme_block() -> str:
    text = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- ui-role -->\s*```sql\n(?P<sql>.*?)```", text, re.S)
    assert found, "README.md has no ui-role block"
    return "\n".join(line.strip() for line in found["sql"].splitlines())


@pytest.fixture
def ui_dsn(dsn: str, conn: Any) -> Iterator[str]:
    """The README's role, created in the test database; dropped afterwards."""
    with conn.cursor() as cur:
        try:
            cur.execute(readme_block())
        except psycopg2.errors.InsufficientPrivilege:
            pytest.skip("the test database's role may not create roles")
    conn.commit()
    try:
        yield psycopg2.extensions.make_dsn(dsn, user=ROLE)
    finally:
        conn.rollback()
        with conn.cursor() as cur:
            cur.execute(f"DROP OWNED BY {ROLE}; DROP ROLE {ROLE}")
        conn.commit()


def test_the_ui_works_with_the_least_privilege_role(
    make_app: Any,
    ui_dsn: str,
    conn: Any,
    ledger: dict[str, int],
) -> None:
    app = make_app(lambda: ui_dsn)
    client = _as(app, SimpleAuthManagerUser(username="olga", role="OP"))
    letter = ledger["encrypted"]
    for path in ("/", "/failed", "/dead-letters", f"/dead-letters/{letter}", "/api/summary"):
        assert client.get("/replayable" + path).status_code == 200, path
    url = f"/replayable/dead-letters/{letter}"
    assert client.post(f"{url}/assign", data={"owner": "olga", "note": "n"}).status_code == 303
    assert client.post(f"{url}/ignore", data={"reason": "known"}).status_code == 303
    assert _letter(conn, letter)["resolution"] == "known"
    history = client.get(f"/replayable/api/dead-letters/{letter}").json()["history"]
    assert [(c["actor"], c["action"]) for c in history] == [
        ("olga", "assigned"),
        ("olga", "ignored"),
    ]


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE replayable.stage_runs SET status = 'done'",
        "DELETE FROM replayable.dead_letters",
        "UPDATE replayable.dead_letters SET error = 'rewritten'",
        "INSERT INTO replayable.dead_letter_history (letter_id, actor, action, status)"
        " VALUES (1, 'mallory', 'ignored', 'ignored')",
        "SELECT text FROM replayable.extractions",
        "SELECT embedding FROM replayable.embeddings",
        "CREATE TABLE replayable.mine (x int)",
    ],
)
def test_the_role_can_do_nothing_else(ui_dsn: str, statement: str) -> None:
    conn = psycopg2.connect(ui_dsn)
    try:
        with conn.cursor() as cur, pytest.raises(psycopg2.errors.InsufficientPrivilege):
            cur.execute(statement)
    finally:
        conn.close()


def test_the_role_has_its_own_statement_timeout(ui_dsn: str) -> None:
    conn = psycopg2.connect(ui_dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW statement_timeout")
            assert cur.fetchone() == ("5s",)
    finally:
        conn.close()
