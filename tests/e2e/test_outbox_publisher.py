"""Events out of Airflow itself: outbox_publisher finishes what a killed publisher sent.

The pipeline's own publish task (each document announced once, a re-run announcing none) is
checked by the sample run in test_document_pipeline.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from checks import asset_events, metadata_rows, scalar
from publishers import KILL_AFTER, add_events, kill_a_publisher_after_sending

pytestmark = pytest.mark.e2e

HOOK = "replayable"  # the receiver the tests' events connection points at (devenv)


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
