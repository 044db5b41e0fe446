import contextlib

import httpx
import pytest

from replayable.provider.server import LocalModelServer
from replayable.retry import CallRetry, ItemError
from replayable.stages.embed import CallRecord, HttpEmbeddingClient

FAST = CallRetry(max_attempts=6, base_s=0.01, cap_s=0.05, max_total_s=30)


@pytest.fixture
def client(model):
    c = HttpEmbeddingClient(base_url=model.base_url, model="m", retry=FAST, timeout_s=5)
    yield c
    c.close()


def test_embeds_in_input_order_with_the_idempotency_key(client, model):
    result = client.embed(["alpha", "beta", "alpha"], idempotency_key="item-1")
    assert len(result.vectors) == 3
    assert result.vectors[0] == result.vectors[2] != result.vectors[1]
    assert model.stats()["idempotency_keys"] == {"item-1": 1}


def test_every_request_is_reported_including_failed_ones(client, model):
    model.set_faults(status_rates={"503": 0.5}, seed=3)
    calls: list[CallRecord] = []
    for n in range(10):
        client.embed([f"text {n}"], idempotency_key=f"k{n}", on_call=calls.append)
    stats = model.stats()
    assert len(calls) == stats["requests"]
    assert sum(c.status == "ok" for c in calls) == 10 == stats["succeeded"]
    assert {c.status for c in calls} <= {"ok", "http_503"}


def test_retry_after_is_honoured_between_tries(client, model):
    model.set_faults(status_rates={"429": 1.0}, retry_after="1")
    calls: list[CallRecord] = []
    with pytest.raises(httpx.HTTPStatusError):
        HttpEmbeddingClient(
            base_url=model.base_url, model="m", retry=CallRetry(max_attempts=2, base_s=0.01)
        ).embed(["x"], idempotency_key="k", on_call=calls.append)
    assert [c.http_status for c in calls] == [429, 429]


def test_a_bad_request_is_not_retried(client, model):
    model.set_faults(fail_inputs_containing={"POISON": 400})
    with pytest.raises(httpx.HTTPStatusError) as info:
        client.embed(["a POISON text"], idempotency_key="k")
    assert info.value.response.status_code == 400
    assert model.stats()["requests"] == 1


def test_the_api_key_is_sent_as_a_bearer_token_and_never_in_errors():
    with LocalModelServer(api_key="sk-secret-123") as secured:
        good = HttpEmbeddingClient(base_url=secured.base_url, model="m", api_key="sk-secret-123")
        assert len(good.embed(["x"], idempotency_key="k").vectors) == 1
        bad = HttpEmbeddingClient(base_url=secured.base_url, model="m", api_key="sk-wrong-456")
        with pytest.raises(httpx.HTTPStatusError) as info:
            bad.embed(["x"], idempotency_key="k")
        assert info.value.response.status_code == 401
        assert "sk-wrong-456" not in str(info.value)


def test_a_server_that_trickles_its_answer_is_cut_off_at_the_request_deadline(model):
    """httpx's timeouts are per phase: bytes every 0.1 s never trip them; the deadline does."""
    model.set_faults(trickle_bytes_per_s=200)
    slow = HttpEmbeddingClient(
        base_url=model.base_url, model="m", retry=CallRetry(max_attempts=1), timeout_s=1.0
    )
    calls: list[CallRecord] = []
    with pytest.raises(httpx.ReadTimeout, match="deadline"):
        slow.embed(
            ["a sentence with enough words to take a while"] * 4,
            idempotency_key="k",
            on_call=calls.append,
        )
    assert [c.status for c in calls] == ["read_timeout"]
    slow.close()


def test_an_oversized_answer_is_refused(client, model):
    model.set_faults(pad_response_bytes=5_000_000)
    with pytest.raises(ItemError, match="larger than"):
        HttpEmbeddingClient(
            base_url=model.base_url, model="m", retry=CallRetry(max_attempts=1)
        ).embed(["x"], idempotency_key="k")


def test_the_gate_is_held_around_each_attempt(client, model):
    model.set_faults(status_rates={"503": 1.0}, retry_after="0")
    entered: list[int] = []

    @contextlib.contextmanager
    def gate():
        entered.append(1)
        yield

    with pytest.raises(httpx.HTTPStatusError):
        HttpEmbeddingClient(
            base_url=model.base_url, model="m", retry=CallRetry(max_attempts=3, base_s=0.01)
        ).embed(["x"], idempotency_key="k", gate=gate)
    assert len(entered) == model.stats()["requests"] == 3
