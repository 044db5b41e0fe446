"""Stragglers and dead letters on the session's running Airflow (tests/shared_airflow.py).

The sweeper re-runs failed items by itself; a person redrives dead letters from the UI, and
the run that starts finishes them.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

import corpus
from checks import rows, subset
from replayable.vocabulary import PIPELINE_DAG_ID, SWEEPER_DAG_ID
from shared_airflow import SharedAirflow

pytestmark = pytest.mark.e2e

PIPELINE = PIPELINE_DAG_ID
SWEEPER = SWEEPER_DAG_ID


class Api:
    """Airflow's REST API as the admin of the running API server."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token
        self.http = httpx.Client(
            base_url=f"{url}/api/v2", headers={"Authorization": f"Bearer {token}"}, timeout=30
        )

    def trigger(self, dag_id: str, conf: dict[str, Any]) -> str:
        response = self.http.post(
            f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf}
        )
        assert response.status_code == 200, response.text
        return str(response.json()["dag_run_id"])

    def state(self, dag_id: str, run_id: str) -> str | None:
        response = self.http.get(f"/dags/{dag_id}/dagRuns/{run_id}")
        return response.json()["state"] if response.status_code == 200 else None

    def wait(self, dag_id: str, run_id: str, timeout_s: float = 300) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.state(dag_id, run_id)
            if state in ("success", "failed"):
                return state
            time.sleep(1)
        raise AssertionError(f"{dag_id} {run_id} did not finish in {timeout_s:.0f} s")

    def runs(self, dag_id: str) -> list[str]:
        found = self.http.get(f"/dags/{dag_id}/dagRuns", params={"limit": 100}).json()
        return [run["dag_run_id"] for run in found["dag_runs"]]

    def pause(self, dag_id: str, paused: bool) -> None:
        response = self.http.patch(f"/dags/{dag_id}", json={"is_paused": paused})
        assert response.status_code == 200, response.text

    def task_states(self, dag_id: str, run_id: str) -> dict[tuple[str, int], str]:
        found = self.http.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances").json()
        return {(t["task_id"], t["map_index"]): t["state"] for t in found["task_instances"]}


@pytest.fixture
def airflow(scheduling: SharedAirflow) -> Api:
    """The session's Airflow (tests/shared_airflow.py), scheduling for this test."""
    return Api(scheduling.url, scheduling.token())


def embed_status(conn: Any) -> list[tuple[str, int]]:
    return rows(
        conn,
        "SELECT status, count(*) FROM replayable.stage_runs WHERE stage = 'embed'"
        " GROUP BY status ORDER BY status",
    )


def test_a_sweep_turns_failed_items_into_a_rerun_that_finishes_them(airflow, conn, model, tmp_path):
    folder = subset(tmp_path, 3)
    corpus.write_pdf(folder / "marked.pdf", ["A report the provider refuses: AUTH-MARKER."])
    model.set_faults(fail_inputs_containing={"AUTH-MARKER": 401})
    first = airflow.trigger(PIPELINE, {"source": str(folder), "batch_size": 4})
    # The refused key stops the batch: its items stay failed, attempts unspent, the run fails.
    assert airflow.wait(PIPELINE, first) == "failed"
    assert embed_status(conn) == [("failed", 4)]
    assert rows(conn, "SELECT count(*) FROM replayable.outbox") == [(0,)]

    model.clear_faults()  # the key is fixed
    sweep = airflow.trigger(SWEEPER, {"min_age_minutes": 0})
    assert airflow.wait(SWEEPER, sweep) == "success"
    rerun = f"sweep__embed__{sweep}"
    assert airflow.task_states(SWEEPER, sweep)[("trigger_rerun", 0)] == "success"
    assert airflow.wait(PIPELINE, rerun) == "success"
    assert embed_status(conn) == [("done", 4)]
    ready = rows(
        conn,
        "SELECT status, published_by FROM replayable.outbox WHERE event_type = 'document.ready'",
    )
    assert ready == [("published", f"{PIPELINE}/{rerun}/publish")] * 4
    assert len(model.webhook_events("replayable")) == 4

    runs = set(airflow.runs(PIPELINE))
    again = airflow.trigger(SWEEPER, {"min_age_minutes": 0})
    assert airflow.wait(SWEEPER, again) == "success"
    assert airflow.task_states(SWEEPER, again)[("trigger_rerun", -1)] == "skipped"
    assert set(airflow.runs(PIPELINE)) == runs


def test_no_sweep_starts_while_an_earlier_sweeps_rerun_is_unfinished(
    airflow, conn, model, tmp_path
):
    """The items a queued re-run will take are not swept again by the next sweep (ADR 0076)."""
    folder = subset(tmp_path, 2)
    corpus.write_pdf(folder / "marked.pdf", ["A report the provider refuses: HOLD-MARKER."])
    model.set_faults(fail_inputs_containing={"HOLD-MARKER": 401})
    first = airflow.trigger(PIPELINE, {"source": str(folder), "batch_size": 4})
    assert airflow.wait(PIPELINE, first) == "failed"
    model.clear_faults()
    before = set(airflow.runs(PIPELINE))
    airflow.pause(PIPELINE, True)  # the re-run a sweep triggers stays queued
    try:
        sweep = airflow.trigger(SWEEPER, {"min_age_minutes": 0})
        deadline = time.monotonic() + 300
        while f"sweep__embed__{sweep}" not in airflow.runs(PIPELINE):
            assert time.monotonic() < deadline, "the first sweep never triggered its re-run"
            time.sleep(1)
        second = airflow.trigger(SWEEPER, {"min_age_minutes": 0})
        # Give the scheduler time to start the second sweep, were it allowed to: several of
        # its loops (a run is otherwise started within a loop or two of its trigger).
        time.sleep(10)
        assert airflow.state(SWEEPER, second) == "queued"
    finally:
        airflow.pause(PIPELINE, False)
    assert airflow.wait(SWEEPER, sweep) == "success"
    assert airflow.wait(SWEEPER, second) == "success"
    assert airflow.task_states(SWEEPER, second)[("trigger_rerun", -1)] == "skipped"
    assert set(airflow.runs(PIPELINE)) - before == {f"sweep__embed__{sweep}"}


def test_a_redrive_from_the_ui_starts_a_run_that_finishes_the_letters(
    airflow, conn, model, tmp_path
):
    """Dead letters from a refused input, redriven from the plugin page once it is fixed:
    the run Airflow starts (as the logged-in user) closes them and finishes their items."""
    folder = subset(tmp_path, 2)
    corpus.write_pdf(folder / "refused.pdf", ["A report the provider rejects: BAD-MARKER."])
    model.set_faults(fail_inputs_containing={"BAD-MARKER": 400})
    first = airflow.trigger(PIPELINE, {"source": str(folder), "batch_size": 4})
    assert airflow.wait(PIPELINE, first) in ("success", "failed")
    letters = rows(
        conn,
        "SELECT id FROM replayable.dead_letters WHERE stage = 'embed' AND status = 'open'",
    )
    assert len(letters) == 1
    (letter,) = letters[0]

    model.clear_faults()  # the input is accepted now
    with httpx.Client(
        base_url=airflow.url, headers={"Authorization": f"Bearer {airflow.token}"}, timeout=60
    ) as admin:
        page = admin.post(
            "/replayable/dead-letters/redrive",
            data={"scope": "matching", "stage": "embed", "reason": "provider accepts it now"},
        )
    assert page.status_code == 200, page.text
    run_id = page.text.split('class="run" href="', 1)[1].split('"', 1)[0].rsplit("/", 1)[1]
    assert airflow.wait(PIPELINE, run_id) == "success"

    assert rows(
        conn, "SELECT status, resolved_by FROM replayable.dead_letters WHERE id = %s", letter
    ) == [("redriven", "admin")]
    assert embed_status(conn) == [("done", 3)]
