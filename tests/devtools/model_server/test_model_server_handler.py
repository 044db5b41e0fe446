"""The HTTP handler: the API key on /v1, the control endpoints and the webhook receivers."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
from model_server_calls import API_KEY, DIM

from devtools.model_server import LocalModelServer


@pytest.fixture
def root(server: LocalModelServer) -> Iterator[httpx.Client]:
    """A client for the server's root, where the webhooks and control endpoints live."""
    with httpx.Client(base_url=server.root_url, trust_env=False, timeout=10.0) as http:
        yield http


def test_missing_api_key_gets_401(auth_server: LocalModelServer) -> None:
    response = httpx.post(
        f"{auth_server.base_url}/embeddings",
        json={"model": "m", "input": "x"},
        trust_env=False,
    )
    assert response.status_code == 401
    assert "error" in response.json()


def test_wrong_api_key_gets_401(auth_server: LocalModelServer) -> None:
    response = httpx.post(
        f"{auth_server.base_url}/embeddings",
        json={"model": "m", "input": "x"},
        headers={"Authorization": "Bearer wrong"},
        trust_env=False,
    )
    assert response.status_code == 401


def test_correct_api_key_gets_200(auth_server: LocalModelServer) -> None:
    response = httpx.post(
        f"{auth_server.base_url}/embeddings",
        json={"model": "m", "input": "x"},
        headers={"Authorization": f"Bearer {API_KEY}"},
        trust_env=False,
    )
    assert response.status_code == 200
    assert len(response.json()["data"][0]["embedding"]) == DIM


def test_control_endpoints_need_no_api_key(auth_server: LocalModelServer) -> None:
    assert httpx.get(f"{auth_server.root_url}/healthz", trust_env=False).json() == {"ok": True}
    assert httpx.get(f"{auth_server.root_url}/stats", trust_env=False).status_code == 200
    assert httpx.get(f"{auth_server.root_url}/faults", trust_env=False).status_code == 200


# Webhooks


def post_webhook(root: httpx.Client, name: str, event: object, key: str | None) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return root.post(f"/webhooks/{name}", json=event, headers=headers)


def test_webhook_stores_each_key_once_and_replays_the_first_response(
    root: httpx.Client, server: LocalModelServer
) -> None:
    first = post_webhook(root, "ready", {"doc": "d1"}, key="e1")
    again = post_webhook(root, "ready", {"doc": "d1", "retry": True}, key="e1")
    other = post_webhook(root, "ready", {"doc": "d2"}, key="e2")
    assert first.status_code == again.status_code == other.status_code == 200
    assert first.json() == {"ok": True, "name": "ready", "key": "e1", "event": 1}
    assert again.content == first.content
    events = server.webhook_events("ready")
    assert [(e["key"], e["body"]) for e in events] == [("e1", {"doc": "d1"}), ("e2", {"doc": "d2"})]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:.]+Z", e["received_at"]) for e in events)
    webhooks = server.stats()["webhooks"]
    assert webhooks == {"received": 3, "stored": 2, "deduplicated": 1, "failed": 0}


def test_webhook_events_are_kept_per_name(root: httpx.Client, server: LocalModelServer) -> None:
    post_webhook(root, "a", {"n": 1}, key="same")
    post_webhook(root, "b", {"n": 2}, key="same")
    assert [e["body"] for e in server.webhook_events("a")] == [{"n": 1}]
    assert [e["body"] for e in server.webhook_events("b")] == [{"n": 2}]
    assert server.webhook_events("never-used") == []


@pytest.mark.parametrize(
    ("content", "headers", "message"),
    [
        (b'{"doc": "d1"}', {}, "Idempotency-Key header is required"),
        (b"{not json", {"Idempotency-Key": "e1"}, "not valid JSON"),
    ],
)
def test_webhook_without_key_or_json_body_gets_400_and_is_not_stored(
    root: httpx.Client,
    server: LocalModelServer,
    content: bytes,
    headers: dict[str, str],
    message: str,
) -> None:
    response = root.post("/webhooks/ready", content=content, headers=headers)
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]
    assert server.webhook_events("ready") == []
    assert server.stats()["webhooks"] == {
        "received": 1,
        "stored": 0,
        "deduplicated": 0,
        "failed": 1,
    }


def test_webhook_statuses_are_answered_in_order_before_success(
    root: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(webhook_statuses=[503, 429, 202], retry_after=2)
    statuses = [post_webhook(root, "ready", {"doc": "d1"}, key="e1") for _ in range(4)]
    assert [r.status_code for r in statuses] == [503, 429, 202, 202]
    assert statuses[0].headers["Retry-After"] == statuses[1].headers["Retry-After"] == "2"
    assert statuses[3].content == statuses[2].content
    assert len(server.webhook_events("ready")) == 1
    webhooks = server.stats()["webhooks"]
    assert webhooks == {"received": 4, "stored": 1, "deduplicated": 1, "failed": 2}


def test_webhook_status_always_fails_every_delivery_and_stores_nothing(
    root: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(webhook_status_always=400, webhook_statuses=[200])
    statuses = [post_webhook(root, "ready", {}, key=f"e{i}").status_code for i in range(3)]
    assert statuses == [400, 400, 400]
    assert server.webhook_events("ready") == []
    assert server.stats()["webhooks"]["failed"] == 3


def test_reset_drops_webhook_events_and_keys(root: httpx.Client, server: LocalModelServer) -> None:
    post_webhook(root, "ready", {"doc": "d1"}, key="e1")
    server.reset_stats()
    assert server.webhook_events("ready") == []
    assert server.stats()["webhooks"] == {
        "received": 0,
        "stored": 0,
        "deduplicated": 0,
        "failed": 0,
    }
    post_webhook(root, "ready", {"doc": "d1"}, key="e1")
    assert len(server.webhook_events("ready")) == 1


def test_invalid_webhook_name_is_refused(root: httpx.Client, server: LocalModelServer) -> None:
    assert server.webhook_url("ready") == f"{server.root_url}/webhooks/ready"
    with pytest.raises(ValueError, match="invalid webhook name"):
        server.webhook_url("a/b")
    assert post_webhook(root, "a/b", {}, key="e1").status_code == 404
    assert root.delete("/webhooks/ready").status_code == 405
