"""Schemathesis against the UI plugin's routes: no server error, no answer outside the schema.

The app disables its docs routes in production (Airflow's auth does not cover them), so the
test builds its own instance with the OpenAPI schema served (``create_app(openapi_url=...)``).
Every operation (the JSON API, the pages and the three form posts) gets generated requests,
valid and invalid, from an operator whose changes are allowed, against the real test Postgres
holding a small ledger; each response must be no 5xx and match the documented status codes,
content types, headers and bodies. A redrive reaches a fake Airflow on loopback, which starts
every run asked of it; a search reaches the local model server through the model connection
(without one, every search would be the same 503 and its code past that would go unfuzzed).
Each of four tests takes a quarter of the operations, and prints how many requests it sent.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from airflow.api_fastapi.app import create_auth_manager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from airflow.api_fastapi.core_api.security import get_user
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from devtools import devenv
from fake_airflow import FakeAirflow
from replayable.web import create_app

pytestmark = pytest.mark.db

# Examples per operation and mode: 16 operations x 2 modes x 30 = 960 in `make test`;
# `make test-fast` asks for fewer (the inner loop), CI for all of them.
OPERATIONS = 16
PER_OPERATION = int(os.environ.get("REPLAYABLE_FUZZ_PER_OPERATION", "30"))
# Some examples are rejected before a request is sent.
MINIMUM = PER_OPERATION * OPERATIONS * 2 * 2 // 3
# The operations are fuzzed in this many tests, a share each, so that workers run them at once.
SHARDS = 4
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
# A bearer token skips the same-origin check, as for any API client; the token itself is not
# read, since get_user is overridden.
HEADERS = {"Authorization": "Bearer fuzz"}


@pytest.fixture
def app(
    dsn: str,
    conn: Any,
    services: devenv.Services,
    state_dir: Path,
    model: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[FastAPI]:
    # The ledger's and the model's connections, as the real Airflow gets them.
    for key, value in devenv.airflow_env(services, state_dir).items():
        if key.startswith("AIRFLOW_CONN_"):
            monkeypatch.setenv(key, value)
    with FakeAirflow() as airflow:
        yield from _app(dsn, conn, airflow.url)


def _app(dsn: str, conn: Any, airflow_url: str) -> Iterator[FastAPI]:
    """The UI with its schema served, an operator logged in, over a ledger with some letters."""
    create_auth_manager()
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO replayable.documents (doc_id, uri, size_bytes)"
            " VALUES (%s, '/data/<b>x</b>.pdf', 1), (%s, '/data/b.pdf', 2)",
            ("a" * 64, "b" * 64),
        )
        cur.execute(
            "INSERT INTO replayable.stage_runs (stage, item_key, doc_id, status, attempts,"
            " error_class, last_error, code_version, config_hash, is_current)"
            " VALUES ('extract', 'k1', %s, 'failed', 1, 'http_503', 'e\\x1b[2J', '1', 'c', true),"
            " ('embed', 'k2', %s, 'dead', 3, 'http_400', 'bad', '1', 'c', true)",
            ("a" * 64, "b" * 64),
        )
        cur.execute(
            "INSERT INTO replayable.dead_letters (stage, item_key, doc_id, error_class,"
            " error_kind, error, attempts, code_version)"
            " SELECT 'embed', 'k' || n, %s, 'http_400', 'terminal', 'bad', 3, '1'"
            " FROM generate_series(1, 20) n",
            ("b" * 64,),
        )
    conn.commit()
    built = create_app(lambda: dsn, openapi_url="/openapi.json", airflow_api_url=airflow_url)
    built.dependency_overrides[get_user] = lambda: SimpleAuthManagerUser(username="op", role="OP")
    yield built
    built.state.pool.close()


@pytest.mark.parametrize("shard", range(SHARDS))
def test_the_api_answers_every_generated_request_within_its_schema(
    app: FastAPI, capsys: pytest.CaptureFixture[str], shard: int
) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    every = [result.ok() for result in schema.get_all_operations()]
    assert len(every) == OPERATIONS
    operations = every[shard::SHARDS]
    sent: dict[str, int] = {}

    def fuzz(operation: Any, mode: GenerationMode) -> None:
        @settings(
            max_examples=PER_OPERATION,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(generation_mode=mode))
        def call(case: Any) -> None:
            case.call_and_validate(headers=HEADERS, checks=CHECKS)
            sent[operation.label] = sent.get(operation.label, 0) + 1

        call()

    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            fuzz(operation, mode)

    total = sum(sent.values())
    with capsys.disabled():
        print(f"\nschemathesis: {total} requests over {len(sent)} operations, 0 failures")
    assert total >= MINIMUM * len(operations) // len(every)
    assert len(sent) == len(operations)
