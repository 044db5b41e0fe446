"""Fixtures of the package's tests: the ledger's handles and documents, a fresh database."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg2.extensions
import pytest

from helpers.ledger import register_documents
from replayable import db


@pytest.fixture
def database(dsn: str) -> Iterator[db.Database]:
    """A ``db.Database`` on the tests' emptied ledger, as a stage's ledger holds it."""
    handle = db.Database(dsn)
    yield handle
    handle.close()


@pytest.fixture
def docs(conn: Any, request: pytest.FixtureRequest) -> list[str]:
    """The test module's ``DOCS`` (document ids), registered as discover leaves them."""
    return register_documents(conn, request.module.DOCS)


@pytest.fixture
def fresh_dsn(dsn: str) -> Iterator[str]:
    """The libpq string of a new, empty database, dropped again afterwards."""
    name = f"fresh_{uuid.uuid4().hex[:12]}"
    admin = db.connect(dsn, autocommit=True)
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')  # a generated identifier, not input
    yield psycopg2.extensions.make_dsn(dsn, dbname=name)
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    admin.close()
