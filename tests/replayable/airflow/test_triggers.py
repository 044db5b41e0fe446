"""ProviderBatchTrigger against the local provider: it fires when a batch ends, reads again
after a passing error, and ends with a classified failure on a permanent one (ADR 0117)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from devtools.model_server import LocalModelServer
from replayable.airflow.triggers import ProviderBatchTrigger

# The most a trigger here is waited for: far above the polls it needs, so that a trigger
# that never ends fails the test instead of hanging it.
GUARD_S = 10.0


def _first_event(trigger: ProviderBatchTrigger, base_url: str, headers=None):
    async def endpoint():
        return base_url, dict(headers or {})

    trigger._endpoint = endpoint  # the model connection, without an Airflow

    async def first():
        async for event in trigger.run():
            return event.payload
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(asyncio.wait_for(first(), GUARD_S))


def test_a_batch_the_provider_does_not_know_ends_the_wait_with_its_class(model):
    trigger = ProviderBatchTrigger("replayable_model", ["batch_nobody_created"], poll_s=0.05)
    event = _first_event(trigger, model.base_url)
    assert event["status"] == "failed"
    assert event["error_class"] == "http_404"
    assert "batch_nobody_created" in event["message"]


@pytest.mark.parametrize("key", [None, "a-wrong-key"])
def test_a_refused_key_ends_the_wait_as_systemic(key):
    with LocalModelServer(dim=8, api_key="the-right-key") as server:
        created = httpx.post(f"{server.base_url}/batches", json={}, timeout=10)
        assert created.status_code == 401
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        trigger = ProviderBatchTrigger("replayable_model", ["batch_1"], poll_s=0.05)
        event = _first_event(trigger, server.base_url, headers)
    assert (event["status"], event["error_class"]) == ("failed", "http_401")


def test_a_batch_that_ends_fires_with_its_status(model):
    model.set_faults(batch_delay_s=0.2)
    data = b'{"custom_id":"a","method":"POST","url":"/v1/embeddings","body":{"input":["x"]}}\n'
    file_id = httpx.post(
        f"{model.base_url}/files",
        data={"purpose": "batch"},
        files={"file": ("f.jsonl", data, "application/jsonl")},
    ).json()["id"]
    batch = httpx.post(
        f"{model.base_url}/batches",
        json={"input_file_id": file_id, "endpoint": "/v1/embeddings", "completion_window": "24h"},
    ).json()
    trigger = ProviderBatchTrigger("replayable_model", [batch["id"]], poll_s=0.05)
    event = _first_event(trigger, model.base_url)
    assert event == {"status": "ended", "ended": {batch["id"]: "completed"}}
