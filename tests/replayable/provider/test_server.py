"""Tests for the local OpenAI-compatible embeddings server, run as a real subprocess."""

from __future__ import annotations

import base64
import hashlib
import math
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from replayable.provider.server import LocalModelServer, embed_text, serve

API_KEY = "test-key-123"


@pytest.fixture(scope="module")
def server() -> Iterator[LocalModelServer]:
    with LocalModelServer(dim=64) as running:
        yield running


@pytest.fixture(scope="module")
def auth_server() -> Iterator[LocalModelServer]:
    with LocalModelServer(dim=16, api_key=API_KEY) as running:
        yield running


@pytest.fixture(autouse=True)
def _clean_server(request: pytest.FixtureRequest) -> Iterator[None]:
    """Give every test that uses the shared server no faults and zeroed stats."""
    running: LocalModelServer | None = None
    if "server" in request.fixturenames:
        running = request.getfixturevalue("server")
        running.clear_faults()
        running.reset_stats()
    yield
    if running is not None:
        # Clearing also releases any request a hang test left waiting; let it finish so the
        # next test starts with nothing in flight.
        running.clear_faults()
        deadline = time.monotonic() + 5
        while running.stats()["in_flight"] and time.monotonic() < deadline:
            time.sleep(0.01)
        running.reset_stats()


@pytest.fixture
def client(server: LocalModelServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, trust_env=False, timeout=10.0) as http:
        yield http


def embed(client: httpx.Client, inputs: str | list[str], **extra: Any) -> httpx.Response:
    return client.post("/embeddings", json={"model": "local-hash", "input": inputs, **extra})


def vectors(response: httpx.Response) -> list[list[float]]:
    assert response.status_code == 200, response.text
    return [item["embedding"] for item in response.json()["data"]]


def test_same_text_gives_same_unit_vector_of_default_dim(client: httpx.Client) -> None:
    first = vectors(embed(client, "The quick brown fox"))[0]
    second = vectors(embed(client, "the QUICK brown fox!"))[0]
    assert first == second
    assert len(first) == 64
    assert math.isclose(math.fsum(x * x for x in first), 1.0)
    assert first == pytest.approx(embed_text("The quick brown fox", 64))


def test_dimensions_in_request_overrides_default_dim(client: httpx.Client) -> None:
    (vector,) = vectors(embed(client, "hello world", dimensions=128))
    assert len(vector) == 128
    assert math.isclose(math.fsum(x * x for x in vector), 1.0)


def test_text_without_words_embeds_as_unit_vector_e0(client: httpx.Client) -> None:
    (vector,) = vectors(embed(client, "!!! ???", dimensions=8))
    assert vector == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_different_texts_give_different_vectors(client: httpx.Client) -> None:
    first, second = vectors(embed(client, ["invoice total due", "weather forecast rain"]))
    assert first != second


def test_batch_keeps_input_order_and_indices(client: httpx.Client) -> None:
    texts = ["alpha", "beta gamma", "delta", "alpha"]
    response = embed(client, texts)
    body = response.json()
    assert body["object"] == "list"
    assert body["model"] == "local-hash"
    assert [item["index"] for item in body["data"]] == [0, 1, 2, 3]
    assert all(item["object"] == "embedding" for item in body["data"])
    assert vectors(response) == [pytest.approx(embed_text(text, 64)) for text in texts]


def test_usage_counts_whitespace_tokens_with_at_least_one_per_input(
    client: httpx.Client,
) -> None:
    usage = embed(client, ["one two three", "four", "!!!"]).json()["usage"]
    assert usage == {"prompt_tokens": 5, "total_tokens": 5}


def test_base64_encoding_decodes_to_the_float_vector(client: httpx.Client) -> None:
    (floats,) = vectors(embed(client, "pack me"))
    response = embed(client, "pack me", encoding_format="base64")
    raw = base64.b64decode(response.json()["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == pytest.approx(floats, abs=1e-6)


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"[1, 2]",
        b'{"model": "m"}',
        b'{"model": "m", "input": ""}',
        b'{"model": "m", "input": []}',
        b'{"model": "m", "input": ["ok", 3]}',
        b'{"input": "no model"}',
        b'{"model": "m", "input": "x", "dimensions": 0}',
        b'{"model": "m", "input": "x", "encoding_format": "int8"}',
    ],
)
def test_bad_request_body_gets_400_openai_error(
    client: httpx.Client, server: LocalModelServer, content: bytes
) -> None:
    response = client.post("/embeddings", content=content)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert server.stats()["by_status"] == {"400": 1}


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
    assert len(response.json()["data"][0]["embedding"]) == 16


def test_control_endpoints_need_no_api_key(auth_server: LocalModelServer) -> None:
    assert httpx.get(f"{auth_server.root_url}/healthz", trust_env=False).json() == {"ok": True}
    assert httpx.get(f"{auth_server.root_url}/stats", trust_env=False).status_code == 200
    assert httpx.get(f"{auth_server.root_url}/faults", trust_env=False).status_code == 200


def test_seeded_status_rate_fails_about_that_share_and_stats_count_it(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(status_rates={"503": 0.3}, seed=1234)
    statuses = [embed(client, f"doc {i}").status_code for i in range(200)]
    failures = statuses.count(503)
    assert set(statuses) <= {200, 503}
    assert 0.2 * 200 <= failures <= 0.4 * 200
    stats = server.stats()
    assert stats["requests"] == 200
    assert stats["failed"] == failures
    assert stats["succeeded"] == 200 - failures
    assert stats["by_status"] == {"200": 200 - failures, "503": failures}
    assert stats["inputs_embedded"] == 200 - failures


def test_same_seed_gives_same_failure_sequence(
    client: httpx.Client, server: LocalModelServer
) -> None:
    runs = []
    for _ in range(2):
        server.set_faults(status_rates={"503": 0.3, "429": 0.2}, seed=7)
        runs.append([embed(client, "x").status_code for _ in range(30)])
    assert runs[0] == runs[1]


def test_injected_429_carries_retry_after_header(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(status_rates={"429": 1.0}, retry_after="2")
    response = embed(client, "x")
    assert response.status_code == 429
    assert response.headers["Retry-After"] == "2"
    assert response.json()["error"]["type"] == "rate_limit_error"


def test_retry_after_may_be_an_http_date(client: httpx.Client, server: LocalModelServer) -> None:
    date = "Wed, 21 Oct 2015 07:28:00 GMT"
    server.set_faults({"status_rates": {"503": 1.0}, "retry_after": date})
    assert embed(client, "x").headers["Retry-After"] == date


def test_input_containing_poison_substring_gets_its_status(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(fail_inputs_containing={"POISON-400": 400}, status_rates={"503": 1.0})
    assert embed(client, ["fine", "has POISON-400 inside"]).status_code == 400
    assert embed(client, "fine").status_code == 503


def test_status_always_fails_every_request(client: httpx.Client, server: LocalModelServer) -> None:
    server.set_faults(status_always=401)
    assert [embed(client, "x").status_code for _ in range(3)] == [401, 401, 401]
    assert server.stats()["failed"] == 3


def test_latency_delays_responses(client: httpx.Client, server: LocalModelServer) -> None:
    server.set_faults(latency_ms=300)
    started = time.monotonic()
    assert embed(client, "x").status_code == 200
    assert time.monotonic() - started >= 0.29


def test_hung_request_does_not_block_a_concurrent_one(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(hang_rate=1.0, hang_s=3)
    with pytest.raises(httpx.ReadTimeout):
        client.post("/embeddings", json={"model": "m", "input": "hangs"}, timeout=0.5)
    server.set_faults(hang_rate=0.0)
    assert embed(client, "answers").status_code == 200
    # The first request is still hanging on the server while the second one succeeded.
    assert server.stats()["in_flight"] == 1


def test_clearing_faults_releases_hung_requests(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(hang_rate=1.0, hang_s=60)
    with pytest.raises(httpx.ReadTimeout):
        client.post("/embeddings", json={"model": "m", "input": "x"}, timeout=0.3)
    server.clear_faults()
    deadline = time.monotonic() + 5
    while server.stats()["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.stats()["in_flight"] == 0


def test_stats_count_successes_per_idempotency_key_and_input(
    client: httpx.Client, server: LocalModelServer
) -> None:
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


def test_faults_can_be_read_back_and_invalid_ones_are_refused(server: LocalModelServer) -> None:
    server.set_faults(status_rates={"503": 0.25}, seed=3)
    assert server.faults()["status_rates"] == {"503": 0.25}
    with pytest.raises(ValueError, match="unknown fault config keys"):
        server.set_faults(status_rate={"503": 0.5})
    with pytest.raises(ValueError, match="at most 1"):
        server.set_faults(status_rates={"503": 0.8, "429": 0.5})


def test_unknown_v1_endpoint_gets_404(client: httpx.Client) -> None:
    assert client.get("/models").status_code == 404


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "example.com"])  # noqa: S104 - refused
def test_non_loopback_host_is_refused(host: str) -> None:
    with pytest.raises(ValueError, match=host.replace(".", r"\.")):
        serve(host=host, port=0)


def test_stop_leaves_no_process_and_is_idempotent(tmp_path: Path) -> None:
    log_path = tmp_path / "server.log"
    running = LocalModelServer(port_file=tmp_path / "port", log_path=log_path).start()
    pgid = running.pid
    assert f"listening on http://127.0.0.1:{running.port}" in log_path.read_text()
    running.stop()
    running.stop()
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    assert not (tmp_path / "port").exists()
