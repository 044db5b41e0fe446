"""The Files and Batch API calls draw on the shared budget like every model request (ADR
0149): a batch-mode run's uploads, batch reads, result reads and deletes each wait for the
connection's rate, run in this process against Postgres and the local model server."""

from __future__ import annotations

import json
import os

import pytest

import in_process
from checks import subset
from replayable.budget import RequestBudget
from replayable.models.batch_api import BatchApi


@pytest.fixture(autouse=True)
def _deferrals():
    in_process.DEFERRALS.clear()
    yield
    in_process.DEFERRALS.clear()


def test_every_files_and_batch_api_call_waits_for_the_shared_rate(
    run_in_process, monkeypatch, model, tmp_path
):
    connection = json.loads(os.environ["AIRFLOW_CONN_REPLAYABLE_MODEL"])
    connection["extra"] = {**connection.get("extra", {}), "max_rps": 50}
    monkeypatch.setenv("AIRFLOW_CONN_REPLAYABLE_MODEL", json.dumps(connection))
    calls: list[str] = []
    paced: list[int] = []
    sent = BatchApi._call

    def spied(self, send, *, gate, describe):  # type: ignore[no-untyped-def]
        calls.append(describe)
        assert gate is not None, f"{describe} was sent outside the budget"
        return sent(self, send, gate=gate, describe=describe)

    reserve = RequestBudget.reserve

    def counted(self, tokens: int = 0) -> float:
        paced.append(tokens)
        return reserve(self, tokens)

    monkeypatch.setattr(BatchApi, "_call", spied)
    monkeypatch.setattr(RequestBudget, "reserve", counted)
    model.set_faults(batch_delay_s=0.2)
    report = run_in_process(
        {"source": str(subset(tmp_path, 3)), "embed_mode": "batch", "batch_poll_s": 0.1}
    )
    assert not report["_failed"], report["_tasks"]
    assert report["stages"]["embed"]["done"] == 3
    assert any(d.startswith("upload") for d in calls) and any("batch" in d for d in calls)
    # Each call took a rate token (a batch-mode pass sends no embeddings request of its own).
    assert len(paced) >= len(calls)
