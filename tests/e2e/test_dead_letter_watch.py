"""dead_letter_watch through Airflow itself (`airflow dags test`), against the real Postgres."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from airflow.models import DagBag
from airflow.sdk.exceptions import ParamValidationError

from checks import rows
from helpers import ROOT
from replayable import db

pytestmark = pytest.mark.e2e

DAG_ID = "dead_letter_watch"


def add_letters(conn: Any, n: int, *, error_class: str) -> None:
    """Insert ``n`` open dead letters of the embed stage, created just now."""
    with conn.cursor() as cur:
        for i in range(n):
            cur.execute(
                "INSERT INTO replayable.dead_letters (stage, item_key, doc_id, error_class,"
                " error_kind, error, attempts, code_version)"
                " VALUES ('embed', %s, 'doc', %s, 'terminal', 'boom', 3, '1.0')",
                (f"item-{i}", error_class),
            )
    conn.commit()


def watch(env: dict[str, str], log_path: Path, conf: dict[str, Any]) -> tuple[int, dict[str, str]]:
    """Run the DAG once; return the exit code and the run's task states by task id."""
    airflow = str(Path(sys.executable).with_name("airflow"))
    started = datetime.now(UTC)
    with open(log_path, "w") as log:
        done = subprocess.run(
            [airflow, "dags", "test", DAG_ID, "--conf", json.dumps(conf)],
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            check=False,
            timeout=300,
        )
    # Airflow's metadata database is the same Postgres server, so its task states are read
    # directly rather than through another `airflow` process.
    metadata = db.connect(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].replace("+psycopg2", ""))
    try:
        states = rows(
            metadata,
            "SELECT ti.task_id, ti.state FROM task_instance ti"
            " JOIN dag_run dr ON dr.dag_id = ti.dag_id AND dr.run_id = ti.run_id"
            " WHERE dr.dag_id = %s AND dr.start_date >= %s",
            DAG_ID,
            started,
        )
    finally:
        metadata.close()
    return done.returncode, dict(states)


def test_a_spike_fails_the_alert_task_with_the_numbers(airflow_env, conn, tmp_path):
    add_letters(conn, 4, error_class="http_500")
    log_path = tmp_path / "spike.log"
    code, states = watch(airflow_env, log_path, {"max_new": 3, "stage": "embed"})
    assert code != 0, log_path.read_text()[-3000:]
    assert states == {"wait_for_growth": "success", "alert": "failed"}, log_path
    assert (
        "Dead-letter spike: 4 new dead letters in the last 60 min (stage embed), above the"
        " threshold of 3; 4 open in total; top error classes: http_500 (4)"
    ) in log_path.read_text()


def test_a_quiet_interval_skips_the_sensor_and_raises_no_alert(airflow_env, conn, tmp_path):
    add_letters(conn, 2, error_class="timeout")
    log_path = tmp_path / "quiet.log"
    conf = {"max_new": 2, "poke_interval_s": 1, "timeout_s": 3}
    code, states = watch(airflow_env, log_path, conf)
    assert code == 0, log_path.read_text()[-3000:]
    assert states == {"wait_for_growth": "skipped", "alert": "skipped"}, log_path
    assert "Dead-letter spike" not in log_path.read_text()


@pytest.mark.parametrize(
    ("conf", "field"),
    [
        ({"window_minutes": 0}, "window_minutes"),
        ({"max_new": -1}, "max_new"),
        ({"stage": "OCR pages"}, "stage"),  # any stage name is watched; this is none
        ({"timeout_s": 3600}, "timeout_s"),
    ],
)
def test_bad_conf_is_rejected_naming_the_field(conf, field):
    params = DagBag(dag_folder=str(ROOT / "dags")).dags[DAG_ID].params
    with pytest.raises(ParamValidationError, match=field):
        params.update(conf)  # a ParamsDict checks each value as it is set
        params.validate()


def test_a_spike_is_posted_to_the_alerts_webhook(airflow_env, conn, model, tmp_path):
    """The alert task's failure callback delivers the numbers to a loopback receiver."""
    add_letters(conn, 4, error_class="http_500")
    model.set_faults(webhook_statuses=[503, 200])  # the first delivery is retried
    alerts = {"conn_type": "http", "host": model.webhook_url("replayable-alerts")}
    env = {**airflow_env, "AIRFLOW_CONN_REPLAYABLE_ALERTS": json.dumps(alerts)}
    log_path = tmp_path / "notify.log"
    code, states = watch(env, log_path, {"max_new": 3, "stage": "embed"})
    assert code != 0
    assert states == {"wait_for_growth": "success", "alert": "failed"}, log_path
    (event,) = model.webhook_events("replayable-alerts")
    body = event["body"]
    assert body["title"] == "Dead-letter spike"
    assert body["message"].startswith("Dead-letter spike: 4 new dead letters in the last 60 min")
    assert (body["dag_id"], body["task_id"]) == (DAG_ID, "alert")
    assert "alert delivered to http://127.0.0.1" in log_path.read_text()
