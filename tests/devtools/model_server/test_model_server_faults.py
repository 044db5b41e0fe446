"""The faults the server injects: statuses, waits, lost responses, limits, slow and large bodies."""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from model_server_calls import embed, sha, vectors, wait_until

from devtools.model_server import LocalModelServer
from devtools.model_server.faults import MAX_PAD_BYTES
from devtools.model_server.vectors import embed_text


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


def test_faults_can_be_read_back_and_invalid_ones_are_refused(server: LocalModelServer) -> None:
    server.set_faults(status_rates={"503": 0.25}, seed=3)
    assert server.faults()["status_rates"] == {"503": 0.25}
    with pytest.raises(ValueError, match="unknown fault config keys"):
        server.set_faults(status_rate={"503": 0.5})
    with pytest.raises(ValueError, match="at most 1"):
        server.set_faults(status_rates={"503": 0.8, "429": 0.5})


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
