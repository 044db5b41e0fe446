"""HttpChatClient against the local model server's /v1/chat/completions."""

from __future__ import annotations

import httpx
import pytest

from devtools.model_server import LocalModelServer
from replayable.models.chat import HttpChatClient, parse_answer
from replayable.models.http import CallRecord
from replayable.retry import CallRetry, ErrorKind, ItemError

FAST = CallRetry(max_attempts=6, base_s=0.01, cap_s=0.05, max_total_s=30)
TEXT = "Invoices are due in thirty days. Late payments accrue interest. Disputes go to Bern."
ASK = [{"role": "system", "content": "Summarise."}, {"role": "user", "content": TEXT}]


@pytest.fixture
def client(model: LocalModelServer):
    chat = HttpChatClient(base_url=model.base_url, model="m", max_tokens=12, retry=FAST)
    yield chat
    chat.close()


def test_the_answer_is_the_models_text_with_its_usage(client, model):
    calls: list[CallRecord] = []
    result = client.complete(ASK, idempotency_key="k1", on_call=calls.append)
    assert result.text == "Invoices are due in thirty days. Late payments accrue interest."
    assert result.finish_reason == "stop" and result.tokens > 0
    assert [(c.status, c.http_status, c.tokens) for c in calls] == [("ok", 200, result.tokens)]
    assert model.stats()["by_endpoint"]["chat"] == 1


def test_a_lost_answer_is_asked_again_under_its_key_and_paid_once(client, model):
    model.set_faults(lose_response_rate=1.0, seed=1)
    calls: list[CallRecord] = []
    with pytest.raises(httpx.TransportError):
        HttpChatClient(
            base_url=model.base_url, model="m", max_tokens=12, retry=CallRetry(max_attempts=1)
        ).complete(ASK, idempotency_key="k2", on_call=calls.append)
    model.clear_faults()
    again = client.complete(ASK, idempotency_key="k2")
    assert again.text.startswith("Invoices are due")
    assert model.stats()["chat_charged"] == 1  # the replay was answered from memory


def test_a_429_is_retried_until_the_tries_run_out(client, model):
    model.set_faults(status_rates={"429": 1.0}, retry_after="0.05")
    calls: list[CallRecord] = []
    with pytest.raises(httpx.HTTPStatusError):
        HttpChatClient(
            base_url=model.base_url, model="m", retry=CallRetry(max_attempts=2, base_s=0.01)
        ).complete(ASK, idempotency_key="k3", on_call=calls.append)
    assert [c.http_status for c in calls] == [429, 429]


def test_a_refusal_is_a_terminal_item_error_and_not_retried(client, model):
    model.set_faults(chat_refusal_containing="Bern")
    with pytest.raises(ItemError) as caught:
        client.complete(ASK, idempotency_key="k4")
    assert (caught.value.error_class, caught.value.kind) == ("refused", ErrorKind.TERMINAL)
    assert model.stats()["requests"] == 1


def test_an_empty_answer_is_a_terminal_item_error(client, model):
    with pytest.raises(ItemError) as caught:
        client.complete([{"role": "user", "content": "   "}], idempotency_key="k5")
    assert caught.value.error_class == "empty_answer"
    assert model.stats()["requests"] == 1


def test_a_bad_request_is_not_retried(client, model):
    model.set_faults(fail_inputs_containing={"POISON": 400})
    with pytest.raises(httpx.HTTPStatusError) as info:
        client.complete([{"role": "user", "content": "a POISON text"}], idempotency_key="k6")
    assert info.value.response.status_code == 400
    assert model.stats()["requests"] == 1


@pytest.mark.parametrize(
    "payload",
    [[], {"choices": []}, {"choices": [{"message": "text"}]}, {"choices": [{}]}],
)
def test_an_unreadable_answer_is_a_retryable_bad_response(payload):
    with pytest.raises(ItemError) as caught:
        parse_answer(payload)
    assert (caught.value.error_class, caught.value.kind) == ("bad_response", ErrorKind.RETRYABLE)


def test_the_api_key_is_sent_as_a_bearer_token_and_never_in_errors():
    with LocalModelServer(api_key="sk-secret-123") as secured:
        good = HttpChatClient(base_url=secured.base_url, model="m", api_key="sk-secret-123")
        assert good.complete(ASK, idempotency_key="k7").text
        bad = HttpChatClient(base_url=secured.base_url, model="m", api_key="sk-wrong-456")
        with pytest.raises(httpx.HTTPStatusError) as info:
            bad.complete(ASK, idempotency_key="k7")
        assert info.value.response.status_code == 401
        assert "sk-wrong-456" not in str(info.value)
