"""What GET /stats counts, and the idempotency memory that decides what is charged."""

from __future__ import annotations

import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
from model_server_calls import embed, sha

from devtools.model_server import LocalModelServer
from devtools.model_server.server import EmbeddingServer


def test_stats_count_successes_per_idempotency_key_and_input(
    client: httpx.Client, server: LocalModelServer
) -> None:
    """With de-duplication off, every success is charged to its key and to each input."""
    server.set_faults(dedupe=False)
    client.post(
        "/embeddings", json={"model": "m", "input": ["a", "b"]}, headers={"Idempotency-Key": "k1"}
    )
    client.post("/embeddings", json={"model": "m", "input": "a"}, headers={"Idempotency-Key": "k1"})
    server.set_faults(status_always=503)
    client.post("/embeddings", json={"model": "m", "input": "a"}, headers={"Idempotency-Key": "k2"})
    stats = server.stats()
    assert stats["idempotency_keys"] == {"k1": 2, "k2": 0}
    sha = {text: hashlib.sha256(text.encode()).hexdigest() for text in "ab"}
    assert stats["input_success_counts"] == {sha["a"]: 2, sha["b"]: 1}
    assert stats["inputs_embedded"] == 3


def test_reset_stats_zeroes_counters(client: httpx.Client, server: LocalModelServer) -> None:
    embed(client, "x")
    server.reset_stats()
    stats = server.stats()
    assert stats["requests"] == 0
    assert stats["by_status"] == {}
    assert stats["input_success_counts"] == {}


# Idempotency keys


def test_repeated_key_returns_the_first_body_and_is_charged_once(
    client: httpx.Client, server: LocalModelServer
) -> None:
    first = embed(client, ["alpha", "beta"], key="k1")
    again = embed(client, ["alpha", "beta"], key="k1")
    assert first.status_code == again.status_code == 200
    assert again.content == first.content
    stats = server.stats()
    assert stats["charged"] == 1
    assert stats["deduplicated"] == 1
    assert stats["succeeded"] == 2
    assert stats["inputs_embedded"] == 2
    assert stats["input_success_counts"] == {sha("alpha"): 1, sha("beta"): 1}
    assert stats["idempotency_keys"] == {"k1": 1}
    assert stats["by_status"] == {"200": 2}


def test_repeat_is_recognised_by_what_it_asks_not_its_bytes(
    client: httpx.Client, server: LocalModelServer
) -> None:
    embed(client, "alpha", key="k1")
    reordered = b'{"dimensions": 64, "input": "alpha", "model": "local-hash"}'
    response = client.post("/embeddings", content=reordered, headers={"Idempotency-Key": "k1"})
    assert response.status_code == 200
    assert server.stats()["deduplicated"] == 1


def test_key_reused_for_a_different_request_gets_422_and_is_not_charged(
    client: httpx.Client, server: LocalModelServer
) -> None:
    assert embed(client, "alpha", key="k1").status_code == 200
    reused = embed(client, "something else", key="k1")
    assert reused.status_code == 422
    assert reused.json()["error"]["code"] == "idempotency_key_reused"
    assert "k1" in reused.json()["error"]["message"]
    stats = server.stats()
    assert (stats["charged"], stats["deduplicated"], stats["failed"]) == (1, 0, 1)
    assert stats["input_success_counts"] == {sha("alpha"): 1}
    assert stats["by_status"] == {"200": 1, "422": 1}


def test_failed_request_is_not_remembered_so_its_retry_is_charged(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(status_always=503)
    assert embed(client, "alpha", key="k1").status_code == 503
    server.clear_faults()
    assert embed(client, "alpha", key="k1").status_code == 200
    stats = server.stats()
    assert (stats["charged"], stats["deduplicated"]) == (1, 0)
    assert stats["idempotency_keys"] == {"k1": 1}


def test_with_dedupe_off_every_repeat_is_charged_and_counted_as_would_deduplicate(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(dedupe=False)
    bodies = [embed(client, "alpha", key="k1").content for _ in range(3)]
    embed(client, "beta", key="k2")
    assert bodies[0] == bodies[1] == bodies[2]
    stats = server.stats()
    assert stats["charged"] == 4
    assert stats["deduplicated"] == 0
    assert stats["would_deduplicate"] == 2
    assert stats["input_success_counts"] == {sha("alpha"): 3, sha("beta"): 1}
    assert stats["idempotency_keys"] == {"k1": 3, "k2": 1}


def test_concurrent_requests_with_one_key_are_charged_once(
    client: httpx.Client, server: LocalModelServer
) -> None:
    # The latency keeps all of them in flight at once.
    server.set_faults(latency_ms=300)
    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda _: embed(client, "alpha", key="k1"), range(8)))
    assert {r.status_code for r in responses} == {200}
    assert len({r.content for r in responses}) == 1
    stats = server.stats()
    assert (stats["charged"], stats["deduplicated"]) == (1, 7)
    assert stats["input_success_counts"] == {sha("alpha"): 1}


def test_reset_forgets_idempotency_keys(client: httpx.Client, server: LocalModelServer) -> None:
    embed(client, "alpha", key="k1")
    server.reset_stats()
    embed(client, "alpha", key="k1")
    assert server.stats()["charged"] == 1


def test_least_recently_used_key_is_forgotten_beyond_the_memory_bound() -> None:
    running = EmbeddingServer(idempotency_max_keys=2)
    thread = threading.Thread(target=running.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        with httpx.Client(base_url=f"{running.url}/v1", trust_env=False, timeout=10) as http:
            # k1 is used again before k3 arrives, so k2 is the one evicted.
            for key in ("k1", "k2", "k1", "k3", "k1", "k2"):
                assert embed(http, "alpha", key=key).status_code == 200
    finally:
        running.shutdown()
        running.server_close()
        thread.join()
    stats = running.stats.snapshot()
    assert stats["idempotency_keys"] == {"k1": 1, "k2": 2, "k3": 1}
    assert stats["deduplicated"] == 2
