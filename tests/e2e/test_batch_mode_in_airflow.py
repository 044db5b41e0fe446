"""embed_mode "batch" on the session's running Airflow (tests/shared_airflow.py): the embed
task waits for its provider batch on the triggerer, holding no worker slot (ADR 0117)."""

from __future__ import annotations

import time

import pytest
from test_replayable_sweeper import PIPELINE, Api, embed_status

from checks import assert_nothing_lost, subset
from shared_airflow import SharedAirflow

pytestmark = pytest.mark.e2e


@pytest.fixture
def airflow(scheduling: SharedAirflow) -> Api:
    return Api(scheduling.url, scheduling.token())


def test_a_batch_mode_run_waits_on_the_triggerer_and_pays_each_line_once(
    airflow, conn, model, tmp_path
):
    model.set_faults(batch_delay_s=8)
    conf = {
        "source": str(subset(tmp_path, 4)),
        "batch_size": 4,
        "embed_mode": "batch",
        "batch_poll_s": 0.5,
    }
    run = airflow.trigger(PIPELINE, conf)
    seen: list[str] = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        states = airflow.task_states(PIPELINE, run)
        embed = [state for (task, index), state in states.items() if task == "batch.embed"]
        seen += [state for state in embed if state not in seen[-1:]]
        if "deferred" in embed:
            break
        time.sleep(0.3)
    # While the provider works on the batch, the task is deferred: no worker slot is held,
    # and the trigger that waits for it runs in the triggerer.
    assert "deferred" in seen, seen
    assert model.stats()["batches_created"] == 1
    assert airflow.wait(PIPELINE, run) == "success"
    assert embed_status(conn) == [("done", 4)]
    stats = model.stats()
    assert stats["batches_created"] == 1 and stats["charged"] == 0
    assert {n for n in stats["batch_line_charges"].values()} == {1}
    assert_nothing_lost(conn)
