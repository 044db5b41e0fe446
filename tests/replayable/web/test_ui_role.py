"""The README's least-privilege role for the UI: the UI works with it, and it can do no more.

The GRANT block is read from README.md (between the ``<!-- ui-role -->`` marker and the end of
its code block) and run as it is, so the documentation cannot drift from what was tested.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
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

import corpus
from helpers import ROOT

ROLE = "replayable_ui"
SEARCH_MODEL = "local-wordllama-256"  # the local server's real model
TOPICS = {
    "bees.pdf": "Honey bees live in colonies around a single queen. Beekeepers inspect the "
    "hives in spring and harvest the honey in late summer.",
    "bread.pdf": "Sourdough bread rises with the wild yeast of a starter. Knead the dough, "
    "let it proof overnight, then bake it in a very hot oven.",
}


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
    pages = ("/", "/failed", "/dead-letters", f"/dead-letters/{letter}", "/api/summary")
    for path in (*pages, "/api/check"):
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


def test_the_ui_searches_with_the_least_privilege_role(
    make_app: Any,
    ui_dsn: str,
    dsn: str,
    run_in_process: Any,
    model: Any,
    tmp_path: Path,
) -> None:
    """The role reads what a search reads; what a search writes goes through the ledger's
    own connection."""
    folder = tmp_path / "topics"
    for name, text in TOPICS.items():
        corpus.write_pdf(folder / name, [text])
    assert not run_in_process({"source": str(folder), "model": SEARCH_MODEL})["_failed"]
    app = make_app(lambda: ui_dsn, ledger_dsn_provider=lambda: dsn)
    client = _as(app, SimpleAuthManagerUser(username="vera", role="VIEWER"))
    for path in ("/api/search", "/search"):
        found = client.get(
            "/replayable" + path,
            params={"q": "when do you collect honey from a hive", "model": SEARCH_MODEL},
        )
        assert found.status_code == 200, (path, found.text)
    assert found.text.index("bees.pdf") < found.text.index("bread.pdf")
    hits = client.get(
        "/replayable/api/search", params={"q": "a loaf of sourdough", "model": SEARCH_MODEL}
    ).json()["hits"]
    assert hits[0]["uri"].endswith("bread.pdf")


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE replayable.stage_runs SET status = 'done'",
        "DELETE FROM replayable.dead_letters",
        "UPDATE replayable.dead_letters SET error = 'rewritten'",
        "INSERT INTO replayable.dead_letter_history (letter_id, actor, action, status)"
        " VALUES (1, 'mallory', 'ignored', 'ignored')",
        "SELECT text FROM replayable.extractions",
        # The search reads chunks and their vectors; the pipeline alone writes them.
        "UPDATE replayable.chunks SET text = 'rewritten'",
        "DELETE FROM replayable.embeddings",
        "INSERT INTO replayable.doc_chunks SELECT * FROM replayable.doc_chunks",
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
