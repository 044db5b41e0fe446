"""Events out of Airflow itself: the pipeline's publish task, outbox_publisher, asset events."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from checks import SAMPLES, rows, scalar
from publishers import KILL_AFTER, add_events, kill_a_publisher_after_sending
from replayable import db

pytestmark = pytest.mark.e2e

HOOK = "replayable"  # the receiver the tests' events connection points at (devenv)
READY_URI = "replayable://documents/ready"


def metadata_rows(env: dict[str, str], sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Rows from Airflow's metadata database (the same Postgres server)."""
    metadata = db.connect(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].replace("+psycopg2", ""))
    try:
        return rows(metadata, sql, *params)
    finally:
        metadata.close()


def asset_events(env: dict[str, str], run_id: str) -> list[dict[str, Any]]:
    found = metadata_rows(
        env,
        "SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id"
        " WHERE a.uri = %s AND e.source_run_id = %s",
        READY_URI,
        run_id,
    )
    return [extra for (extra,) in found]


def task_states(env: dict[str, str], dag_id: str, run_id: str) -> dict[str, str]:
    return dict(
        metadata_rows(
            env,
            "SELECT task_id, state FROM task_instance WHERE dag_id = %s AND run_id = %s"
            " AND map_index = -1",
            dag_id,
            run_id,
        )
    )


def test_a_run_announces_each_document_once_and_a_rerun_announces_none(
    run_dag, airflow_env, conn, model
):
    first = run_dag({"source": str(SAMPLES), "batch_size": 8})
    assert first["_returncode"] == 0, first["_log"]
    documents = len(list(SAMPLES.glob("*.pdf")))
    ready = rows(
        conn,
        "SELECT aggregate_id, event_id, status, published_by FROM replayable.outbox"
        " WHERE event_type = 'document.ready'",
    )
    assert len(ready) == documents
    assert {doc for doc, *_ in ready} == {
        doc for (doc,) in rows(conn, "SELECT doc_id FROM replayable.documents")
    }
    publication = f"document_pipeline/{first['run_id']}/publish"
    assert {(status, by) for _, _, status, by in ready} == {("published", publication)}
    stored = model.webhook_events(HOOK)
    assert sorted(e["key"] for e in stored) == sorted(event_id for _, event_id, _, _ in ready)
    assert {e["body"]["type"] for e in stored} == {"document.ready"}
    assert model.stats()["webhooks"]["deduplicated"] == 0
    assert asset_events(airflow_env, first["run_id"]) == [
        {"publication": publication, "ready": documents}
    ]
    received = model.stats()["webhooks"]["received"]

    second = run_dag({"source": str(SAMPLES), "batch_size": 8})
    assert second["_returncode"] == 0, second["_log"]
    assert scalar(conn, "SELECT count(*) FROM replayable.outbox") == documents
    assert model.stats()["webhooks"]["received"] == received
    assert asset_events(airflow_env, second["run_id"]) == []
    assert task_states(airflow_env, "document_pipeline", second["run_id"])["publish"] == "skipped"


def run_publisher(env: dict[str, str], log_path: Path, conf: dict[str, Any]) -> tuple[int, str]:
    """Run outbox_publisher once through `airflow dags test`; return its code and run id."""
    airflow = str(Path(sys.executable).with_name("airflow"))
    started = datetime.now(UTC)
    with open(log_path, "w") as log:
        done = subprocess.run(
            [airflow, "dags", "test", "outbox_publisher", "--conf", json.dumps(conf)],
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            check=False,
            timeout=300,
        )
    (run_id,) = metadata_rows(
        env,
        "SELECT run_id FROM dag_run WHERE dag_id = 'outbox_publisher' AND start_date >= %s",
        started,
    )[0]
    return done.returncode, run_id


def test_a_publisher_killed_after_sending_is_finished_by_the_scheduled_dag(
    airflow_env, conn, dsn, model, tmp_path
):
    """Killed between the send and the mark; outbox_publisher delivers the rest, each once."""
    ids = add_events(conn, 12)
    kill_a_publisher_after_sending(dsn, model.webhook_url(HOOK), lease_s=2.0)
    sent_before = len(model.webhook_events(HOOK))
    assert sent_before == KILL_AFTER
    assert scalar(conn, "SELECT count(*) FROM replayable.outbox WHERE status = 'pending'") == 12

    # `airflow dags test` takes longer to start than the 2 s lease lasts.
    code, run_id = run_publisher(airflow_env, tmp_path / "publisher.log", {"batch_size": 5})
    assert code == 0, (tmp_path / "publisher.log").read_text()[-3000:]
    assert scalar(conn, "SELECT count(*) FROM replayable.outbox WHERE status = 'published'") == 12
    stored = model.webhook_events(HOOK)
    assert sorted(e["key"] for e in stored) == sorted(ids)  # each stored once
    assert model.stats()["webhooks"] == {
        "received": 12 + sent_before,
        "stored": 12,
        "deduplicated": sent_before,
        "failed": 0,
    }
    publication = f"outbox_publisher/{run_id}/publish"
    assert asset_events(airflow_env, run_id) == [{"publication": publication, "ready": 12}]
