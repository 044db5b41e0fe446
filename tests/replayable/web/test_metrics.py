"""/replayable/metrics through FastAPI's TestClient: real auth checks, real Postgres counters.

Values are parsed back with prometheus_client's own parser and compared with counts taken
from the ledger's tables directly (never from the counters the endpoint reads).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from airflow.api_fastapi.app import create_auth_manager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from checks import ledger_metrics, rows
from helpers import ROOT
from replayable import db
from replayable.vocabulary import STAGES
from replayable.web import create_app
from replayable.web.metrics import LATENCY_BOUNDS_MS, METRIC_NAMES, TOKEN_VARIABLE

TOKEN = "scrape-token-for-tests"  # noqa: S105 - a test value
TOKEN_ENV = f"AIRFLOW_VAR_{TOKEN_VARIABLE.upper()}"
A, B, C = "a" * 64, "b" * 64, "c" * 64

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Every sample as {(name, sorted labels): value}, through prometheus_client's parser."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


@pytest.fixture
def app(dsn: str) -> FastAPI:
    create_auth_manager()
    return create_app(dsn_provider=lambda: dsn)


@pytest.fixture
def anonymous(app: FastAPI) -> TestClient:
    root = FastAPI()
    root.mount("/replayable", app)  # as Airflow's init_plugins mounts it
    return TestClient(root)


@pytest.fixture
def token(monkeypatch: pytest.MonkeyPatch) -> str:
    """The scrape token, configured as the Airflow Variable (here through its env var)."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    return TOKEN


def scrape(client: TestClient, **headers: str) -> Samples:
    response = client.get("/replayable/metrics", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return parse(response.text)


@pytest.fixture
def ledger(conn: Any) -> None:
    """Three documents; rows in every stage; letters; model calls with retries and errors."""
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO replayable.documents (doc_id, uri, size_bytes) VALUES (%s, %s, 10)",
            [(A, "/a.pdf"), (B, "/b.pdf"), (C, "/c.pdf")],
        )
        cur.executemany(
            "INSERT INTO replayable.stage_runs (stage, item_key, doc_id, status, error_class,"
            " code_version, config_hash, is_current) VALUES (%s, %s, %s, %s, %s, '1', 'c', %s)",
            [
                ("extract", "xa-old", A, "failed", "http_503", False),  # superseded: not counted
                ("extract", "xa", A, "done", None, True),
                ("extract", "xb", B, "done", None, True),
                ("extract", "xc", C, "dead", "encrypted", True),
                ("chunk", "ca", A, "done", None, True),
                ("chunk", "cb", B, "running", None, True),
                ("embed", "ea", A, "failed", "http_429", True),
            ],
        )
        cur.executemany(
            "INSERT INTO replayable.dead_letters (stage, item_key, doc_id, error_class,"
            " error_kind, error, attempts, code_version, status)"
            " VALUES (%s, %s, %s, %s, 'terminal', 'boom', 3, '1', %s)",
            [
                ("extract", "xc", C, "encrypted", "open"),
                ("embed", "e1", A, "http_400", "redriven"),
                ("embed", "e2", B, "http_400", "open"),
            ],
        )
        cur.executemany(
            "INSERT INTO replayable.model_calls (stage, attempt, call_try, status, latency_ms,"
            " n_inputs, tokens, idempotency_key) VALUES ('embed', 1, %s, %s, %s, 4, %s, 'k')",
            [
                (1, "http_503", 3, 0),
                (2, "ok", 40, 100),
                (1, "ok", 5000, 50),
                (3, "ok", 40000, 10),
                (2, "read_timeout", 30000, 0),
            ],
        )
    conn.commit()


# ---- who may scrape -------------------------------------------------------------------------


def test_an_anonymous_scrape_is_refused(anonymous: TestClient, token: str) -> None:
    assert anonymous.get("/replayable/metrics").status_code == 401


def test_the_scrape_token_lets_a_scraper_in_without_an_airflow_login(
    anonymous: TestClient, token: str, ledger: None
) -> None:
    samples = scrape(anonymous, Authorization=f"Bearer {token}")
    assert value(samples, "replayable_items", stage="extract", status="done") == 2


@pytest.mark.parametrize("presented", [TOKEN + "x", TOKEN[:-1], "", "not-a-jwt"])
def test_a_wrong_token_is_refused(anonymous: TestClient, token: str, presented: str) -> None:
    response = anonymous.get(
        "/replayable/metrics", headers={"Authorization": f"Bearer {presented}"}
    )
    assert response.status_code in (401, 403)  # Airflow's verdict on a bearer that is no JWT


def test_without_the_variable_a_blank_token_opens_nothing(
    anonymous: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, "  ")
    response = anonymous.get("/replayable/metrics", headers={"Authorization": "Bearer   "})
    assert response.status_code in (401, 403)


@pytest.mark.parametrize(("role", "status"), [("VIEWER", 200), (None, 403)])
def test_an_airflow_user_needs_the_plugins_view(
    anonymous: TestClient, monkeypatch: pytest.MonkeyPatch, ledger: None, role: Any, status: int
) -> None:
    # Only Airflow's identity step is replaced (a real JWT needs the metadata database for
    # its revocation check); the plugins-view decision is the configured auth manager's.
    user = SimpleAuthManagerUser(username="carol", role=role)

    async def from_token(token: str) -> SimpleAuthManagerUser:
        assert token == "jwt-of-carol"  # noqa: S105 - a test value
        return user

    monkeypatch.setattr(create_auth_manager(), "get_user_from_token", from_token)
    response = anonymous.get(
        "/replayable/metrics", headers={"Authorization": "Bearer jwt-of-carol"}
    )
    assert response.status_code == status
    anonymous.cookies.set("_token", "jwt-of-carol")  # the UI's cookie works the same
    assert anonymous.get("/replayable/metrics").status_code == status


def test_an_unreachable_database_is_a_503_that_names_nothing_secret(token: str) -> None:
    def no_dsn() -> str:
        raise RuntimeError("connection replayable_db not found (password=hunter2)")

    create_auth_manager()
    root = FastAPI()
    root.mount("/replayable", create_app(dsn_provider=no_dsn))
    response = TestClient(root).get(
        "/replayable/metrics", headers={"Authorization": f"Bearer {token}"}
    )
    assert response.status_code == 503
    assert "hunter2" not in response.text


class _Pool:
    """The shape of a connection pool an app may keep in ``app.state.pool``."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.lent = 0

    @contextlib.contextmanager
    def connection(self, *, readonly: bool) -> Iterator[Any]:
        assert readonly
        self.lent += 1
        conn = db.connect(self.dsn)
        try:
            yield conn
        finally:
            conn.close()


def test_a_scrape_borrows_from_the_apps_pool_when_it_keeps_one(
    app: FastAPI, anonymous: TestClient, token: str, ledger: None, dsn: str
) -> None:
    app.state.pool = _Pool(dsn)
    samples = scrape(anonymous, Authorization=f"Bearer {token}")
    assert value(samples, "replayable_items", stage="extract", status="done") == 2
    assert app.state.pool.lent == 1


# ---- what a scrape says ---------------------------------------------------------------------


def test_items_count_current_rows_with_every_stage_and_status(
    anonymous: TestClient, token: str, ledger: None
) -> None:
    samples = scrape(anonymous, Authorization=f"Bearer {token}")
    items = {
        dict(labels)["stage"] + "/" + dict(labels)["status"]: v
        for (name, labels), v in samples.items()
        if name == "replayable_items"
    }
    assert len(items) == len(STAGES) * 5
    assert {k: v for k, v in items.items() if v} == {
        "extract/done": 2,
        "extract/dead": 1,
        "chunk/done": 1,
        "chunk/running": 1,
        "embed/failed": 1,
    }


def test_dead_letters_open_and_created(anonymous: TestClient, token: str, ledger: None) -> None:
    samples = scrape(anonymous, Authorization=f"Bearer {token}")
    assert value(samples, "replayable_dead_letters_open", stage="embed") == 1
    assert value(samples, "replayable_dead_letters_created_total", stage="embed") == 2
    assert value(samples, "replayable_dead_letters_open", stage="extract") == 1
    assert value(samples, "replayable_dead_letters_created_total", stage="chunk") == 0


def test_resolving_a_letter_lowers_the_depth_but_never_the_created_counter(
    anonymous: TestClient, token: str, ledger: None, conn: Any
) -> None:
    with conn.cursor() as cur:
        cur.execute("UPDATE replayable.dead_letters SET status = 'ignored' WHERE stage = 'embed'")
        cur.execute("UPDATE replayable.dead_letters SET owner = 'alice'")  # moves no count
    conn.commit()
    samples = scrape(anonymous, Authorization=f"Bearer {token}")
    assert value(samples, "replayable_dead_letters_open", stage="embed") == 0
    assert value(samples, "replayable_dead_letters_created_total", stage="embed") == 2


def test_model_calls_by_outcome_retries_tokens_and_latency(
    anonymous: TestClient, token: str, ledger: None
) -> None:
    samples = scrape(anonymous, Authorization=f"Bearer {token}")
    calls = "replayable_model_calls_total"
    assert value(samples, calls, stage="embed", outcome="ok") == 3
    assert value(samples, calls, stage="embed", outcome="http_503") == 1
    assert value(samples, calls, stage="embed", outcome="read_timeout") == 1
    assert value(samples, "replayable_model_call_retries_total", stage="embed") == 3
    assert value(samples, "replayable_model_tokens_total", stage="embed") == 160
    latency = "replayable_model_call_latency_seconds"
    buckets = {
        dict(labels)["le"]: v
        for (name, labels), v in samples.items()
        if name == f"{latency}_bucket"
    }
    assert len(buckets) == len(LATENCY_BOUNDS_MS) + 1
    # 3 ms, 40 ms, 5 s, 30 s, 40 s: cumulative per upper bound, the last only in +Inf.
    assert buckets["0.005"] == 1
    assert buckets["0.025"] == 1
    assert buckets["0.05"] == 2
    assert buckets["5.0"] == 3
    assert buckets["30.0"] == 4
    assert buckets["+Inf"] == 5
    assert value(samples, f"{latency}_count", stage="embed") == 5
    assert value(samples, f"{latency}_sum", stage="embed") == pytest.approx(75.043)


def test_an_empty_ledger_still_declares_every_family(anonymous: TestClient, token: str, conn):
    response = anonymous.get("/replayable/metrics", headers={"Authorization": f"Bearer {token}"})
    families = {f.name for f in text_string_to_metric_families(response.text)}
    assert families == {
        "replayable_items",
        "replayable_dead_letters_open",
        "replayable_dead_letters_created",
        "replayable_model_calls",
        "replayable_model_call_retries",
        "replayable_model_tokens",
        "replayable_model_cost",
        "replayable_model_unpriced_calls",
        "replayable_model_call_latency_seconds",
        "replayable_outbox_events",
        "replayable_outbox_oldest_pending_age_seconds",
        "replayable_outbox_published",
        "replayable_outbox_dead_lettered",
        "replayable_invariant_violations",
        "replayable_invariant_check_timestamp_seconds",
    }
    assert {
        s.name for f in text_string_to_metric_families(response.text) for s in f.samples
    } <= METRIC_NAMES


def test_openmetrics_is_served_when_prometheus_asks_for_it(
    anonymous: TestClient, token: str, ledger: None
) -> None:
    response = anonymous.get(
        "/replayable/metrics",
        headers={
            "Authorization": f"Bearer {token}",
            "Accept": "application/openmetrics-text;version=1.0.0,text/plain;q=0.5",
        },
    )
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.rstrip().endswith("# EOF")


def test_a_scrape_reads_only_the_counter_tables(dsn: str, conn: Any) -> None:
    """The plan of every metrics query names no history table (cost follows no corpus)."""
    history = {"stage_runs", "dead_letters", "model_calls", "model_call_items", "documents"}
    reader = db.connect(dsn)
    try:
        for query in (
            "metrics/items",
            "metrics/dead_letters",
            "metrics/model_calls",
            "metrics/outbox",
        ):
            with reader.cursor() as cur:
                cur.execute("EXPLAIN (FORMAT JSON) " + db.sql(query))
                plan = json.dumps(cur.fetchone()[0])
            touched = {t for t in history if f'"Relation Name": "{t}"' in plan}
            assert touched == set(), (query, touched)
    finally:
        reader.close()


def test_the_counters_agree_with_the_ledger_tables(conn: Any, ledger: None) -> None:
    """The trigger-kept retries and letter counts equal a count over the base tables."""
    assert rows(
        conn, "SELECT sum(retries) FROM replayable.model_call_counts WHERE stage = 'embed'"
    ) == rows(
        conn,
        "SELECT count(*)::numeric FROM replayable.model_calls"
        " WHERE stage = 'embed' AND call_try > 1",
    )
    assert rows(
        conn,
        "SELECT stage, sum(n) FILTER (WHERE status = 'open')::int, sum(created)::int"
        " FROM replayable.dead_letter_counts GROUP BY stage ORDER BY stage",
    ) == rows(
        conn,
        "SELECT stage, count(*) FILTER (WHERE status = 'open')::int, count(*)::int"
        " FROM replayable.dead_letters GROUP BY stage ORDER BY stage",
    )


@pytest.mark.bench
def test_a_scrape_of_the_synthetic_ledger_matches_its_tables(
    anonymous: TestClient, token: str, conn: Any
) -> None:
    """B7's synthetic ledger at a reduced size: every sample equals a count of the tables."""
    synthetic = (ROOT / "bench" / "sql" / "synthetic_ledger.sql").read_text()
    with conn.cursor() as cur:
        cur.execute(synthetic, {"documents": 20_000, "letters": 1000, "calls": 20_000})
    conn.commit()
    samples = scrape(anonymous, Authorization=f"Bearer {token}")
    assert samples == ledger_metrics(conn)
    assert value(samples, "replayable_model_call_retries_total", stage="embed") == 1000


# ---- authentication comes before any lookup (ADR 0071) ---------------------------------------


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every read of the scrape token's Variable, counted."""
    from replayable.web import scrape_auth

    seen: list[int] = []
    read = scrape_auth.scrape_token

    def counted() -> str | None:
        seen.append(1)
        return read()

    monkeypatch.setattr(scrape_auth, "scrape_token", counted)
    return seen


def test_an_airflow_user_is_let_in_without_reading_the_variable(
    anonymous: TestClient, monkeypatch: pytest.MonkeyPatch, token: str, lookups: list[int]
) -> None:
    async def from_token(presented: str) -> SimpleAuthManagerUser:
        return SimpleAuthManagerUser(username="carol", role="VIEWER")

    monkeypatch.setattr(create_auth_manager(), "get_user_from_token", from_token)
    jwt = "eyJhbGciOiJIUzUxMiJ9.eyJzdWIiOiJjYXJvbCJ9.c2lnbmF0dXJl"  # shaped as Airflow's are
    response = anonymous.get("/replayable/metrics", headers={"Authorization": f"Bearer {jwt}"})
    assert response.status_code == 200
    assert lookups == []
    anonymous.cookies.set("_token", jwt)  # the UI's cookie, no bearer
    assert anonymous.get("/replayable/metrics").status_code == 200
    assert lookups == []


def test_many_unauthenticated_bearers_read_the_variable_at_most_once(
    anonymous: TestClient, token: str, lookups: list[int]
) -> None:
    for n in range(20):
        response = anonymous.get(
            "/replayable/metrics", headers={"Authorization": f"Bearer guess-{n}"}
        )
        assert response.status_code in (401, 403)
    assert len(lookups) <= 1
    # The real token still works, from the value read once.
    scrape(anonymous, Authorization=f"Bearer {token}")
    assert len(lookups) <= 1


# ---- the outbox (ADR 0072) ------------------------------------------------------------------


def outbox_event(cur: Any, n: int, status: str, age_s: float = 0.0) -> None:
    cur.execute(
        "INSERT INTO replayable.outbox (event_id, event_key, event_type, aggregate_id, payload,"
        " status, created_at) VALUES (%s, %s, 'document.ready', 'doc', '{}', %s,"
        " now() - make_interval(secs => %s))",
        (f"evt_{n}", f"k{n}", status, age_s),
    )


def test_the_outbox_backlog_its_age_and_its_dead_events(
    anonymous: TestClient, token: str, conn: Any
) -> None:
    with conn.cursor() as cur:
        outbox_event(cur, 1, "pending", age_s=600)
        outbox_event(cur, 2, "pending", age_s=60)
        outbox_event(cur, 3, "published")
        outbox_event(cur, 4, "dead")
        outbox_event(cur, 5, "dead")
    conn.commit()
    samples = scrape(anonymous, Authorization=f"Bearer {token}")
    events = "replayable_outbox_events"
    assert value(samples, events, status="pending") == 2
    assert value(samples, events, status="published") == 1
    assert value(samples, events, status="dead") == 2
    assert 600 <= value(samples, "replayable_outbox_oldest_pending_age_seconds") < 660
    assert value(samples, "replayable_outbox_published_total") == 1
    assert value(samples, "replayable_outbox_dead_lettered_total") == 2
    # A requeued dead event is backlog again; the dead-lettered counter never goes down.
    with conn.cursor() as cur:
        cur.execute("UPDATE replayable.outbox SET status = 'pending' WHERE event_id = 'evt_4'")
        cur.execute("UPDATE replayable.outbox SET attempts = 3")  # moves no count
    conn.commit()
    samples = scrape(anonymous, Authorization=f"Bearer {token}")
    assert value(samples, events, status="pending") == 3
    assert value(samples, events, status="dead") == 1
    assert value(samples, "replayable_outbox_dead_lettered_total") == 2


def test_an_empty_outbox_has_no_backlog_age(anonymous: TestClient, token: str, conn: Any) -> None:
    samples = scrape(anonymous, Authorization=f"Bearer {token}")
    assert value(samples, "replayable_outbox_oldest_pending_age_seconds") == 0
    assert value(samples, "replayable_outbox_events", status="pending") == 0


def test_the_backlog_age_is_read_through_the_index_of_pending_events(dsn: str, conn: Any) -> None:
    reader = db.connect(dsn)
    try:
        with reader.cursor() as cur:
            cur.execute("SET enable_seqscan = off")  # a tiny table would be scanned anyway
            cur.execute("EXPLAIN (FORMAT JSON) " + db.sql("outbox/oldest_pending"))
            plan = json.dumps(cur.fetchone()[0])
        assert '"Index Name": "outbox_pending_seq_idx"' in plan
    finally:
        reader.close()


def test_the_last_recorded_check_is_a_gauge_per_invariant(
    anonymous: TestClient, token: str, conn: Any
) -> None:
    from replayable import invariants

    before = scrape(anonymous, Authorization=f"Bearer {token}")
    assert not [key for key in before if key[0].startswith("replayable_invariant")]
    invariants.record_counts(
        conn, {"dead_without_letter": 3, "one_current_item": 0}, quiescent=False
    )
    samples = scrape(anonymous, Authorization=f"Bearer {token}")
    name = "replayable_invariant_violations"
    assert value(samples, name, invariant="dead_without_letter") == 3
    assert value(samples, name, invariant="one_current_item") == 0
    checked = rows(
        conn, "SELECT extract(epoch FROM max(checked_at)) FROM replayable.invariant_checks"
    )
    assert value(samples, "replayable_invariant_check_timestamp_seconds") == float(checked[0][0])
