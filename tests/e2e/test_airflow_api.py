"""Against the session's running Airflow: trigger with conf, clear a failed map index."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

import corpus
from checks import assert_nothing_lost, rows, subset
from replayable.vocabulary import PIPELINE_DAG_ID
from shared_airflow import SharedAirflow, delete_queued_runs

pytestmark = pytest.mark.e2e
DAG = PIPELINE_DAG_ID


class Airflow:
    """A REST client for the running Airflow, logged in as its admin."""

    def __init__(self, url: str, token: str) -> None:
        self.http = httpx.Client(
            base_url=f"{url}/api/v2", headers={"Authorization": f"Bearer {token}"}, timeout=30
        )

    def trigger(self, conf: dict[str, Any], logical_date: str | None = None) -> httpx.Response:
        body = {"logical_date": logical_date, "conf": conf}
        return self.http.post(f"/dags/{DAG}/dagRuns", json=body)

    def wait(self, run_id: str, states: tuple[str, ...], timeout_s: float = 300) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.http.get(f"/dags/{DAG}/dagRuns/{run_id}").json()["state"]
            if state in states:
                return str(state)
            time.sleep(1)
        raise AssertionError(f"run {run_id} did not reach {states} in {timeout_s}s")

    def task_instances(self, run_id: str) -> list[dict[str, Any]]:
        found = self.http.get(f"/dags/{DAG}/dagRuns/{run_id}/taskInstances")
        return list(found.json()["task_instances"])


@pytest.fixture
def airflow(scheduling: SharedAirflow) -> Airflow:
    """The session's Airflow (tests/shared_airflow.py), scheduling for this test."""
    client = Airflow(scheduling.url, scheduling.token())
    client.env = scheduling.env  # type: ignore[attr-defined]
    return client


def test_the_api_refuses_anonymous_requests(airflow):
    anonymous = httpx.get(str(airflow.http.base_url).rstrip("/") + f"/dags/{DAG}")
    assert anonymous.status_code == 401


@pytest.mark.parametrize(
    ("conf", "field"),
    [
        ({"stages": ["extract", "summarise"]}, "stages"),
        ({"batch_size": 0}, "batch_size"),
        ({"rerun": {"stage": "extract", "statuss": ["failed"]}}, "statuss"),
        ({"source": "/etc"}, "source"),
        ({"item_timeout_s": 1_000_000}, "item_timeout_s"),
    ],
)
def test_invalid_conf_is_rejected_at_trigger_time_naming_the_field(airflow, conf, field):
    response = airflow.trigger(conf)
    assert response.status_code == 400
    assert field in response.json()["detail"]


def test_the_cli_rejects_invalid_conf_naming_the_field(airflow):
    airflow_bin = str(Path(sys.executable).with_name("airflow"))
    done = subprocess.run(
        [airflow_bin, "dags", "trigger", DAG, "--conf", json.dumps({"batch_size": 0})],
        env={**os.environ, **airflow.env},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode != 0
    assert "batch_size" in done.stdout + done.stderr


def _clear_with_cli(airflow: Airflow, logical_date: str) -> None:
    """`airflow tasks clear` has no run id or map index: a logical-date window picks the run."""
    airflow_bin = str(Path(sys.executable).with_name("airflow"))
    done = subprocess.run(
        [
            airflow_bin,
            "tasks",
            "clear",
            DAG,
            "-t",
            "batch.embed",
            "--only-failed",
            "--downstream",
            "--yes",
            "-s",
            logical_date,
            "-e",
            logical_date,
        ],
        env={**os.environ, **airflow.env},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("how", ["rest", "cli"])
def test_clearing_a_failed_map_index_redoes_only_its_unfinished_items(
    airflow, conn, model, tmp_path, how
):
    folder = subset(tmp_path, 6)
    corpus.write_pdf(folder / "marked.pdf", ["A report the provider refuses: AUTH-MARKER."])
    model.set_faults(fail_inputs_containing={"AUTH-MARKER": 401})
    # A logical date lets the CLI's date window select exactly this run.
    logical_date = datetime.now(UTC).replace(microsecond=0).isoformat() if how == "cli" else None
    created = airflow.trigger({"source": str(folder), "batch_size": 4}, logical_date)
    assert created.status_code == 200, created.text
    run_id = created.json()["dag_run_id"]
    assert airflow.wait(run_id, ("success", "failed")) == "failed"

    failed = [t for t in airflow.task_instances(run_id) if t["state"] == "failed"]
    embeds = [t for t in failed if t["task_id"] == "batch.embed"]
    assert len(embeds) == 1 and embeds[0]["try_number"] == 1  # auth errors are not retried
    index = embeds[0]["map_index"]
    unfinished = {
        key
        for (key,) in rows(
            conn,
            "SELECT item_key FROM replayable.stage_runs WHERE stage = 'embed'"
            " AND status = 'failed'",
        )
    }
    assert unfinished
    assert rows(conn, "SELECT count(*) FROM replayable.dead_letters") == [(0,)]

    model.clear_faults()
    if how == "cli":
        _clear_with_cli(airflow, logical_date)
    else:
        cleared = airflow.http.post(
            f"/dags/{DAG}/clearTaskInstances",
            json={
                "dag_run_id": run_id,
                "task_ids": [["batch.embed", index], "report"],
                "only_failed": False,
                "dry_run": False,
            },
        )
        assert cleared.status_code == 200, cleared.text
        assert {(t["task_id"], t["map_index"]) for t in cleared.json()["task_instances"]} == {
            ("batch.embed", index),
            ("report", -1),
        }
    assert airflow.wait(run_id, ("success", "failed")) == "success"

    redone = {
        key
        for (key,) in rows(
            conn,
            "SELECT DISTINCT i.item_key FROM replayable.model_calls m"
            " JOIN replayable.model_call_items i ON i.call_id = m.id"
            " WHERE m.run_id = %s AND m.status = 'ok'",
            run_id,
        )
    }
    done_first_time = {
        key
        for (key,) in rows(
            conn,
            "SELECT item_key FROM replayable.stage_runs WHERE stage = 'embed' AND status = 'done'",
        )
    } - unfinished
    assert unfinished <= redone
    assert rows(
        conn,
        "SELECT count(*) FROM replayable.stage_runs WHERE stage = 'embed' AND status <> 'done'",
    ) == [(0,)]
    # The other batch was not touched by the clear: still on its first try.
    tries = {
        (t["task_id"], t["map_index"]): t["try_number"] for t in airflow.task_instances(run_id)
    }
    assert all(n == 1 for (task, i), n in tries.items() if task.startswith("batch.") and i != index)
    assert done_first_time and not (done_first_time & unfinished)
    assert_nothing_lost(conn)


def test_the_ui_plugin_is_mounted_behind_airflow_auth(airflow):
    root = str(airflow.http.base_url).removesuffix("/").removesuffix("/api/v2")
    assert httpx.get(f"{root}/replayable/").status_code == 401
    page = httpx.get(f"{root}/replayable/", headers=airflow.http.headers)
    assert page.status_code == 200
    assert "Dead letters" in page.text or "dead letters" in page.text
    listed = airflow.http.get("/plugins").json()["plugins"]
    views = [v for p in listed if p["name"] == "replayable" for v in p["external_views"]]
    assert views and views[0]["url_route"] == "replayable"


def test_a_stage_of_your_own_runs_under_the_scheduler_and_a_ui_redrive_reruns_its_letter(
    airflow, scheduling, conn, tmp_path
):
    """keyword_pipeline (Keywords is defined in dags/custom_stages/, not in the package),
    triggered through the REST API and run by the scheduler: its poisoned document ends dead
    with the stage's own class, and the UI's redrive of that letter starts a run of the
    pipeline that made it, which takes the letter back to work (the text still has no
    words, so the item ends dead again, with a new letter)."""
    from shared_airflow import KEYWORD_PIPELINE

    scheduling.pause(KEYWORD_PIPELINE, False)
    try:
        folder = subset(tmp_path, 3)
        corpus.write_pdf(folder / "numbers.pdf", ["123 456 789 0 42"])
        _run(scheduling, KEYWORD_PIPELINE, {"source": str(folder)})
        assert rows(
            conn, "SELECT stage, count(*) FROM replayable.stage_runs GROUP BY 1 ORDER BY 1"
        ) == [("extract", 4), ("keywords", 4)]
        ((letter, made_by),) = rows(
            conn,
            "SELECT id, dag_id FROM replayable.dead_letters"
            " WHERE stage = 'keywords' AND error_class = 'no_words' AND status = 'open'",
        )
        assert made_by == KEYWORD_PIPELINE

        second = _redrive_from_ui(scheduling, KEYWORD_PIPELINE, letter, "try again")
        assert rows(conn, "SELECT status FROM replayable.dead_letters WHERE id = %s", letter) == [
            ("redriven",)
        ]
        assert rows(
            conn,
            "SELECT count(*) FROM replayable.dead_letters WHERE stage = 'keywords'"
            " AND status = 'open' AND run_id = %s",
            second,
        ) == [(1,)]
    finally:
        scheduling.pause(KEYWORD_PIPELINE, True)
        delete_queued_runs(scheduling, KEYWORD_PIPELINE)


def _run(shared, dag_id: str, conf: dict[str, Any]) -> str:
    """Trigger a run of ``dag_id`` through the REST API; wait for it to succeed."""
    with shared.api() as api:
        started = api.post(f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf})
    assert started.status_code == 200, started.text
    run_id = str(started.json()["dag_run_id"])
    assert _wait(shared, dag_id, run_id) == "success"
    return run_id


def _redrive_from_ui(shared, dag_id: str, letter: int, reason: str) -> str:
    """Redrive one letter from the UI as ``op``; the run it starts must be of ``dag_id``
    and succeed. Returns the run's id."""
    with httpx.Client(
        base_url=shared.url,
        headers={"Authorization": f"Bearer {shared.token('op')}"},
        timeout=30,
    ) as ui:
        answer = ui.post(
            "/replayable/dead-letters/redrive",
            data={"scope": "selected", "ids": [str(letter)], "reason": reason},
        )
    assert answer.status_code == 200, answer.text
    link = answer.text.split('class="run" href="', 1)[1].split('"', 1)[0]
    assert f"/dags/{dag_id}/runs/" in link
    run_id = link.rsplit("/", 1)[1]
    assert _wait(shared, dag_id, run_id) == "success"
    return run_id


def _wait(shared, dag_id: str, run_id: str, timeout_s: float = 300) -> str:
    deadline = time.monotonic() + timeout_s
    with shared.api() as api:
        while time.monotonic() < deadline:
            state = api.get(f"/dags/{dag_id}/dagRuns/{run_id}").json()["state"]
            if state in ("success", "failed"):
                return str(state)
            time.sleep(1)
    raise AssertionError(f"{dag_id} run {run_id} did not end in {timeout_s}s")


def test_a_stage_defined_only_in_tests_keeps_every_promise_under_the_scheduler(
    airflow, scheduling, conn, tmp_path
):
    """wordcount_pipeline (tests/airflow_dags/: the stage is defined in tests/, the DAG made
    by pipeline_dag) through the scheduler: the first run does the work, an identical one
    maps nothing, the poisoned documents end dead with their classes, a re-run of one class
    redoes only that document once the fix ships, and the UI's redrive finishes the other."""
    from shared_airflow import WORDCOUNT_PIPELINE

    def run(conf: dict[str, Any]) -> str:
        return _run(scheduling, WORDCOUNT_PIPELINE, conf)

    def processed(run_id: str) -> list[tuple[str, str]]:
        return rows(
            conn,
            "SELECT stage, status FROM replayable.stage_runs WHERE run_id = %s"
            " AND stage = 'wordcount' ORDER BY 1, 2",
            run_id,
        )

    fixed = Path(scheduling.env["WORDCOUNT_FIXED_FLAG"])
    fixed.unlink(missing_ok=True)
    scheduling.pause(WORDCOUNT_PIPELINE, False)
    try:
        folder = subset(tmp_path, 3)
        corpus.write_pdf(folder / "a.pdf", ["This one carries POISON-A inside."])
        corpus.write_pdf(folder / "b.pdf", ["And this one carries POISON-B."])
        first = run({"source": str(folder)})
        assert processed(first) == [("wordcount", "dead")] * 2 + [("wordcount", "done")] * 3
        letters = dict(
            rows(conn, "SELECT error_class, id FROM replayable.dead_letters WHERE status = 'open'")
        )
        assert set(letters) == {"poisoned_a", "poisoned_b"}

        again = run({"source": str(folder)})
        assert rows(
            conn, "SELECT to_do, batches FROM replayable.runs WHERE run_id = %s", again
        ) == [(0, 0)]

        fixed.touch()
        rerun = run(
            {"rerun": {"stage": "wordcount", "error_class": ["poisoned_a"], "status": ["dead"]}}
        )
        assert processed(rerun) == [("wordcount", "done")]
        assert rows(
            conn, "SELECT status FROM replayable.dead_letters WHERE id = %s", letters["poisoned_a"]
        ) == [("redriven",)]

        redrive = _redrive_from_ui(
            scheduling, WORDCOUNT_PIPELINE, letters["poisoned_b"], "fix shipped"
        )
        assert processed(redrive) == [("wordcount", "done")]
        assert rows(conn, "SELECT count(*) FROM replayable.dead_letters WHERE status = 'open'") == [
            (0,)
        ]
    finally:
        fixed.unlink(missing_ok=True)
        scheduling.pause(WORDCOUNT_PIPELINE, True)
        delete_queued_runs(scheduling, WORDCOUNT_PIPELINE)


def test_a_pipeline_of_your_own_is_swept_by_its_own_sweeper(airflow, scheduling, conn, tmp_path):
    """wordcount_pipeline's outage leaves its items failed under their cap; once the fix
    ships, its own sweeper (wordcount_pipeline_sweeper, made by pipeline_dag) re-runs them in
    wordcount_pipeline and they finish (ADR 0109)."""
    from shared_airflow import WORDCOUNT_PIPELINE

    sweeper = f"{WORDCOUNT_PIPELINE}_sweeper"
    fixed = Path(scheduling.env["WORDCOUNT_FIXED_FLAG"])
    fixed.unlink(missing_ok=True)
    for dag_id in (WORDCOUNT_PIPELINE, sweeper):
        scheduling.pause(dag_id, False)
    try:
        folder = subset(tmp_path, 2)
        corpus.write_pdf(folder / "outage.pdf", ["The service this one needs is down: OUTAGE."])
        with scheduling.api() as api:
            started = api.post(
                f"/dags/{WORDCOUNT_PIPELINE}/dagRuns",
                json={"logical_date": None, "conf": {"source": str(folder)}},
            )
        assert started.status_code == 200, started.text
        first = str(started.json()["dag_run_id"])
        assert _wait(scheduling, WORDCOUNT_PIPELINE, first) == "failed"
        left = rows(
            conn,
            "SELECT status, attempts FROM replayable.stage_runs"
            " WHERE stage = 'wordcount' AND status <> 'done'",
        )
        assert left and all(status == "failed" for status, _ in left), left

        fixed.touch()
        sweep = _run(scheduling, sweeper, {"min_age_minutes": 0})
        assert _wait(scheduling, WORDCOUNT_PIPELINE, f"sweep__wordcount__{sweep}") == "success"
        assert rows(
            conn,
            "SELECT status, count(*) FROM replayable.stage_runs WHERE stage = 'wordcount'"
            " GROUP BY 1",
        ) == [("done", 3)]
    finally:
        fixed.unlink(missing_ok=True)
        for dag_id in (WORDCOUNT_PIPELINE, sweeper):
            scheduling.pause(dag_id, True)
            delete_queued_runs(scheduling, dag_id)
