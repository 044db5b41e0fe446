"""Tests for the local OpenAI-compatible embeddings server, run as a real subprocess."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import math
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from devtools.model_server.server import (
    MAX_PAD_BYTES,
    PARENT_CHECK_S,
    EmbeddingServer,
    LocalModelServer,
    embed_text,
    serve,
)

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


@pytest.fixture
def root(server: LocalModelServer) -> Iterator[httpx.Client]:
    """A client for the server's root, where the webhooks and control endpoints live."""
    with httpx.Client(base_url=server.root_url, trust_env=False, timeout=10.0) as http:
        yield http


def embed(
    client: httpx.Client, inputs: str | list[str], key: str | None = None, **extra: Any
) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return client.post(
        "/embeddings", json={"model": "local-hash", "input": inputs, **extra}, headers=headers
    )


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


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


_PARENT = """
import sys, time
from devtools.model_server import LocalModelServer
server = LocalModelServer(port_file=sys.argv[1], log_path=sys.argv[2]).start()
print(server.pid, flush=True)
time.sleep(600)
"""


def _start_parent(tmp_path: Path, code: str) -> subprocess.Popen[bytes]:
    """Start a process that starts a LocalModelServer and prints its pid."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3] / "include")}
    return subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path / "port"), str(tmp_path / "server.log")],
        env=env,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )


def _kill_groups(*pids: int) -> None:
    for pid in pids:
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def test_the_server_exits_when_the_process_that_started_it_is_killed(tmp_path: Path) -> None:
    """A SIGKILLed parent runs no cleanup; the server must notice on its own and exit."""
    import psutil

    parent = _start_parent(tmp_path, _PARENT)
    server_pid = 0
    try:
        assert parent.stdout is not None
        server_pid = int(parent.stdout.readline())
        server = psutil.Process(server_pid)
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
        try:
            server.wait(timeout=15)
        except psutil.TimeoutExpired:
            pytest.fail("the model server outlived the process that started it")
        server_pid = 0
    finally:
        _kill_groups(parent.pid, server_pid)
    # It shut down the way SIGTERM does: the port file it wrote is gone.
    assert not (tmp_path / "port").exists()


def test_a_detached_server_outlives_the_process_that_started_it(tmp_path: Path) -> None:
    """`make start` returns and leaves the server to `make stop`: tie_to_parent=False."""
    import psutil

    code = _PARENT.replace("log_path=sys.argv[2])", "log_path=sys.argv[2], tie_to_parent=False)")
    parent = _start_parent(tmp_path, code)
    server_pid = 0
    try:
        assert parent.stdout is not None
        server_pid = int(parent.stdout.readline())
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
        port = int((tmp_path / "port").read_text())
        # Still answering after several of the watchdog's checks would have fired.
        for _ in range(3):
            time.sleep(PARENT_CHECK_S)
            with httpx.Client(trust_env=False) as client:
                assert client.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
    finally:
        _kill_groups(parent.pid, server_pid)
        with contextlib.suppress(psutil.Error):
            psutil.Process(server_pid).wait(timeout=10)


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


# Lost responses


def test_lost_response_is_charged_then_replayed_uncharged_on_retry_with_same_key(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(lose_response_rate=1.0)
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        embed(client, "alpha", key="k1")
    stats = server.stats()
    assert (stats["charged"], stats["lost_responses"], stats["in_flight"]) == (1, 1, 0)
    server.clear_faults()
    retry = embed(client, "alpha", key="k1")
    assert vectors(retry) == [pytest.approx(embed_text("alpha", 64))]
    stats = server.stats()
    assert (stats["charged"], stats["deduplicated"], stats["lost_responses"]) == (1, 1, 1)
    assert stats["input_success_counts"] == {sha("alpha"): 1}


# Concurrency limit


def test_beyond_max_concurrency_the_server_answers_429_with_retry_after(
    client: httpx.Client, server: LocalModelServer
) -> None:
    # Hung requests hold the two slots until the faults are cleared.
    server.set_faults(max_concurrency=2, concurrency_retry_after=3, hang_rate=1.0, hang_s=60)
    with ThreadPoolExecutor(2) as pool:
        held = [pool.submit(embed, client, f"held {i}") for i in range(2)]
        wait_until(lambda: server.stats()["in_flight"] == 2)
        refused = embed(client, "one too many")
        server.clear_faults()
        assert [future.result().status_code for future in held] == [200, 200]
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "3"
    assert refused.json()["error"]["type"] == "rate_limit_error"
    stats = server.stats()
    assert stats["rejected_concurrency"] == 1
    assert stats["peak_in_flight"] == 2
    assert stats["by_status"] == {"200": 2, "429": 1}
    assert (stats["charged"], stats["failed"]) == (2, 1)


def test_peak_in_flight_never_exceeds_the_limit_under_load(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(max_concurrency=3, latency_ms=200)
    with ThreadPoolExecutor(12) as pool:
        statuses = list(pool.map(lambda i: embed(client, f"doc {i}").status_code, range(12)))
    assert set(statuses) <= {200, 429}
    stats = server.stats()
    assert stats["charged"] == statuses.count(200)
    assert stats["rejected_concurrency"] == statuses.count(429)
    assert 1 <= stats["peak_in_flight"] <= 3


def test_peak_in_flight_is_measured_without_a_limit(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(hang_rate=1.0, hang_s=60)
    with ThreadPoolExecutor(3) as pool:
        held = [pool.submit(embed, client, f"held {i}") for i in range(3)]
        wait_until(lambda: server.stats()["in_flight"] == 3)
        server.clear_faults()
        assert [future.result().status_code for future in held] == [200, 200, 200]
    stats = server.stats()
    assert (stats["peak_in_flight"], stats["in_flight"]) == (3, 0)
    server.reset_stats()
    assert server.stats()["peak_in_flight"] == 0


# Slow and large responses


def read_within(client: httpx.Client, deadline_s: float, text: str) -> bytes:
    """Read a whole embeddings response, giving up once ``deadline_s`` has passed."""
    started = time.monotonic()
    chunks = []
    request = {"model": "local-hash", "input": text}
    with client.stream("POST", "/embeddings", json=request) as response:
        for chunk in response.iter_raw():
            if time.monotonic() - started > deadline_s:
                raise TimeoutError(f"response not read within {deadline_s} s")
            chunks.append(chunk)
    return b"".join(chunks)


def test_trickled_response_passes_a_read_timeout_but_fails_a_total_deadline(
    server: LocalModelServer,
) -> None:
    # About 2.3 kB at 2 kB/s: over a second in all, but a piece every tenth of a second.
    server.set_faults(trickle_bytes_per_s=2000, pad_response_bytes=2000)
    timeout = httpx.Timeout(10.0, read=2.0)
    with httpx.Client(base_url=server.base_url, trust_env=False, timeout=timeout) as http:
        body = read_within(http, 60.0, "alpha")
        assert json.loads(body)["data"][0]["embedding"] == pytest.approx(embed_text("alpha"))
        with pytest.raises(TimeoutError):
            read_within(http, 0.25, "alpha")


def test_pad_response_bytes_adds_a_padding_field_of_that_size(
    client: httpx.Client, server: LocalModelServer
) -> None:
    plain = embed(client, "alpha")
    server.set_faults(pad_response_bytes=100_000)
    padded = embed(client, "alpha")
    assert len(padded.content) >= len(plain.content) + 100_000
    body = padded.json()
    assert len(body.pop("padding")) == 100_000
    assert body == plain.json()


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


# Fault config


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({"dedupe": "no"}, "dedupe"),
        ({"lose_response_rate": 1.5}, "lose_response_rate"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"max_concurrency": 2.5}, "max_concurrency"),
        ({"concurrency_retry_after": -1}, "concurrency_retry_after"),
        ({"trickle_bytes_per_s": -5}, "trickle_bytes_per_s"),
        ({"pad_response_bytes": -1}, "pad_response_bytes"),
        ({"pad_response_bytes": MAX_PAD_BYTES + 1}, "pad_response_bytes"),
        ({"webhook_statuses": 503}, "webhook_statuses"),
        ({"webhook_statuses": [503, 302]}, "webhook_statuses[1]"),
        ({"webhook_status_always": 200}, "webhook_status_always"),
    ],
)
def test_invalid_new_fault_values_are_refused_naming_the_key(
    server: LocalModelServer, config: dict[str, Any], key: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(key)):
        server.set_faults(config)


def test_new_fault_keys_read_back_and_round_trip(server: LocalModelServer) -> None:
    config = {
        "dedupe": False,
        "lose_response_rate": 0.2,
        "max_concurrency": 4,
        "concurrency_retry_after": 2.5,
        "trickle_bytes_per_s": 500.0,
        "pad_response_bytes": 10,
        "webhook_statuses": [503, 200],
        "webhook_status_always": 400,
    }
    shown = server.set_faults(config)
    assert {key: shown[key] for key in config} == config
    assert server.set_faults(server.faults()) == shown
