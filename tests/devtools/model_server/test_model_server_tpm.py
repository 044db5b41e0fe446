"""The tokens-per-minute limit (``max_tpm``): the token bucket, its 429s and what they cost.

A limit of 6000 refills 100 tokens a second: requests of a thousand tokens each need ten
seconds of refill to pass once the bucket is spent, far longer than any of these tests
takes, so which requests pass does not depend on how fast the machine runs them.
"""

from __future__ import annotations

import math
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from model_server_calls import embed, words

from devtools.model_server import LocalModelServer
from devtools.model_server.faults import FaultConfig
from devtools.model_server.ratelimit import TokenBucket

LIMIT = 6000


def assert_over_tpm(response: httpx.Response) -> dict[str, Any]:
    """Check a 429 from the token limit in OpenAI's shape; return its error object."""
    assert response.status_code == 429, response.text
    error: dict[str, Any] = response.json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
    assert "tokens per minute" in error["message"]
    return error


# The bucket itself, on a clock the test moves


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_bucket_starts_full_refills_at_a_sixtieth_a_second_and_never_overflows() -> None:
    clock = FakeClock()
    bucket = TokenBucket(LIMIT, clock=clock)
    assert bucket.take(LIMIT) is None
    assert bucket.take(50) == pytest.approx(0.5)
    clock.now += 0.25
    assert bucket.level() == pytest.approx(25)
    clock.now += 0.25
    assert bucket.take(50) is None
    clock.now += 3600
    assert bucket.level() == LIMIT


def test_bucket_refuses_more_than_its_capacity_for_good_and_takes_back_up_to_it() -> None:
    clock = FakeClock()
    bucket = TokenBucket(100, clock=clock)
    assert bucket.take(101) == math.inf
    assert bucket.level() == 100
    assert bucket.take(60) is None
    bucket.give_back(60)
    bucket.give_back(60)
    assert bucket.level() == 100


# The limit on the server


def test_requests_past_the_bucket_get_429_with_retry_after_and_are_not_charged(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(max_tpm=LIMIT)
    responses = [embed(client, words(1000, f"doc{i}-")) for i in range(10)]
    assert [r.status_code for r in responses] == [200] * 6 + [429] * 4
    for refused in responses[6:]:
        assert_over_tpm(refused)
        assert float(refused.headers["Retry-After"]) > 0
    answered = sum(r.json()["usage"]["total_tokens"] for r in responses[:6])
    stats = server.stats()
    assert stats["tokens_charged"] == answered == LIMIT
    assert stats["rejected_tpm"] == 4
    assert stats["by_status"] == {"200": 6, "429": 4}
    assert (stats["charged"], stats["failed"], stats["in_flight"]) == (6, 4, 0)
    assert stats["rejected_concurrency"] == 0


def test_concurrent_requests_take_no_more_than_the_bucket_holds(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(max_tpm=LIMIT)
    with ThreadPoolExecutor(10) as pool:
        responses = list(pool.map(lambda i: embed(client, words(1000, f"doc{i}-")), range(20)))
    statuses = [r.status_code for r in responses]
    assert (statuses.count(200), statuses.count(429)) == (6, 14)
    stats = server.stats()
    assert (stats["tokens_charged"], stats["rejected_tpm"]) == (LIMIT, 14)


def test_a_refused_request_passes_once_it_has_waited_its_retry_after(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(max_tpm=LIMIT)
    assert embed(client, words(LIMIT)).status_code == 200
    refused = embed(client, words(50))
    assert_over_tpm(refused)
    retry_after = refused.headers["Retry-After"]
    # Seconds to the millisecond: 50 tokens at 100 a second, less what came back meanwhile.
    assert re.fullmatch(r"\d+(\.\d{1,3})?", retry_after), retry_after
    assert 0 < float(retry_after) <= 0.5
    time.sleep(float(retry_after))
    assert embed(client, words(50)).status_code == 200
    stats = server.stats()
    assert (stats["tokens_charged"], stats["rejected_tpm"]) == (LIMIT + 50, 1)


def test_a_replayed_idempotency_key_is_neither_refused_nor_charged(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(max_tpm=LIMIT)
    first = embed(client, words(3000, "a"), key="k1")
    assert first.status_code == 200
    assert embed(client, words(3000, "a"), key="k1").content == first.content
    # The replay took nothing, so the other half of the bucket is still there.
    assert embed(client, words(3000, "b")).status_code == 200
    assert_over_tpm(embed(client, words(3000, "c")))
    # The bucket is empty, and the replay passes all the same.
    assert embed(client, words(3000, "a"), key="k1").content == first.content
    stats = server.stats()
    assert (stats["charged"], stats["deduplicated"], stats["rejected_tpm"]) == (2, 2, 1)
    assert stats["tokens_charged"] == LIMIT


def test_repeats_in_flight_together_pay_once(
    client: httpx.Client, server: LocalModelServer
) -> None:
    # The latency keeps the first request in flight while the repeats arrive, so they pay
    # like new requests; each gets its tokens back when it is answered from memory.
    server.set_faults(max_tpm=LIMIT, latency_ms=300)
    with ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(lambda _: embed(client, words(1500), key="k1"), range(4)))
    assert {r.status_code for r in responses} == {200}
    assert embed(client, words(4500, "b")).status_code == 200
    assert_over_tpm(embed(client, words(1000, "c")))
    stats = server.stats()
    assert (stats["charged"], stats["deduplicated"], stats["rejected_tpm"]) == (2, 3, 1)
    assert stats["tokens_charged"] == LIMIT


def test_a_request_larger_than_the_limit_is_refused_without_retry_after(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(max_tpm=100)
    refused = embed(client, words(101))
    error = assert_over_tpm(refused)
    assert "too large" in error["message"]
    assert "Retry-After" not in refused.headers
    # It took nothing: a request of the whole limit passes after it.
    assert embed(client, words(100)).status_code == 200
    stats = server.stats()
    assert (stats["tokens_charged"], stats["rejected_tpm"]) == (100, 1)


def test_the_limit_comes_after_the_body_is_checked_and_before_injected_failures(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(max_tpm=100, status_always=503)
    # Accepted, it pays for its tokens even though the injected failure follows.
    assert embed(client, words(100)).status_code == 503
    assert_over_tpm(embed(client, "one more"))
    # A malformed body is still a 400 with the bucket empty.
    assert client.post("/embeddings", json={"model": "m", "input": []}).status_code == 400
    stats = server.stats()
    assert stats["by_status"] == {"503": 1, "429": 1, "400": 1}
    assert (stats["rejected_tpm"], stats["tokens_charged"]) == (1, 0)


def test_setting_the_faults_fills_the_bucket_and_clearing_them_lifts_the_limit(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(max_tpm=100)
    assert embed(client, words(100)).status_code == 200
    assert_over_tpm(embed(client, "one more"))
    server.set_faults(max_tpm=100)
    assert embed(client, words(100)).status_code == 200
    server.clear_faults()
    assert embed(client, words(1000)).status_code == 200
    assert server.stats()["rejected_tpm"] == 1


def test_max_tpm_reads_back_and_null_means_no_limit(server: LocalModelServer) -> None:
    assert server.faults()["max_tpm"] is None
    assert server.set_faults(max_tpm=LIMIT)["max_tpm"] == LIMIT
    assert server.set_faults(max_tpm=2.5)["max_tpm"] == 2.5
    assert server.set_faults(max_tpm=None)["max_tpm"] is None


@pytest.mark.parametrize("value", [0, -1, -0.5, "6000", True, [6000], {"tpm": 1}])
def test_invalid_max_tpm_is_a_400_naming_the_key(server: LocalModelServer, value: object) -> None:
    response = httpx.put(f"{server.root_url}/faults", json={"max_tpm": value}, trust_env=False)
    assert response.status_code == 400
    assert "max_tpm" in response.json()["error"]["message"]
    with pytest.raises(ValueError, match="max_tpm"):
        server.set_faults(max_tpm=value)
    assert server.faults()["max_tpm"] is None


def test_a_window_holds_only_its_seconds_of_the_limit():
    """tpm_window_s=2 at 6,000 a minute: a bucket of 200 tokens, refilled at 100 a second."""
    now = [0.0]
    bucket = TokenBucket(6000, clock=lambda: now[0], window_s=2)
    assert bucket.capacity == 200 and bucket.rate == 100
    assert bucket.take(201) == math.inf
    assert bucket.take(150) is None
    assert bucket.take(100) == 0.5
    now[0] = 0.5
    assert bucket.take(100) is None


@pytest.mark.parametrize("window", [0, -1, 61, "5", True])
def test_a_bad_window_is_refused_naming_it(window):
    with pytest.raises(ValueError, match="tpm_window_s"):
        FaultConfig.from_json({"max_tpm": 6000, "tpm_window_s": window})
