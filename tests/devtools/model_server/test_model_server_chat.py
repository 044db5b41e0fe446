"""Chat completions: the extractive answer, its usage, and the faults, keys, limits and
counters it shares with embeddings.

The answers are a pure function of the request, so these tests state them exactly. The
token limit is 6000 a minute, 100 tokens a second of refill: a request of a thousand
tokens refused by a spent bucket stays refused far longer than any of these tests takes.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from model_server_calls import API_KEY, chat, embed, sha, wait_until, words

from devtools.model_server import LocalModelServer
from devtools.model_server.chat import (
    DEFAULT_MAX_TOKENS,
    REFUSAL,
    ChatMessage,
    ChatRequest,
    chat_response,
    parse_chat_request,
    sentences,
    summarize,
)
from devtools.model_server.errors import HttpError
from devtools.model_server.faults import FaultConfig
from devtools.model_server.idempotency import fingerprint
from devtools.model_server.vectors import EmbeddingsRequest

LIMIT = 6000
TEXT = "The invoice is due in March.  It totals 1,200 euros!\nPay by   transfer? Or by card."


def choice(response: httpx.Response) -> dict[str, Any]:
    """The only choice of a 200 chat completion."""
    assert response.status_code == 200, response.text
    (only,) = response.json()["choices"]
    return dict(only)


def error(response: httpx.Response, status: int) -> dict[str, Any]:
    """The OpenAI-shaped error object of a response that must have ``status``."""
    assert response.status_code == status, response.text
    return dict(response.json()["error"])


def request_of(body: dict[str, Any]) -> ChatRequest:
    return parse_chat_request(json.dumps(body).encode())


def user(content: str, **extra: Any) -> ChatRequest:
    """The checked request :func:`chat` sends for ``content`` and ``extra``."""
    return request_of(
        {"model": "local-chat", "messages": [{"role": "user", "content": content}], **extra}
    )


# The pure functions


def test_sentences_end_at_punctuation_before_whitespace_and_at_line_breaks() -> None:
    assert sentences(TEXT) == [
        "The invoice is due in March.",
        "It totals 1,200 euros!",
        "Pay by transfer?",
        "Or by card.",
    ]
    # A point with no whitespace after it ends nothing: decimals run on.
    assert sentences("Pi is 3.14 or so.\r\n\n  \tNext\tline ") == ["Pi is 3.14 or so.", "Next line"]
    assert sentences(" \n\t ") == []


def test_summary_is_the_first_whole_sentences_that_fit() -> None:
    two = summarize(TEXT, 10)
    assert (two.content, two.cut) == ("The invoice is due in March. It totals 1,200 euros!", False)
    # The third sentence (three words) fits in 13 words only; the fourth is never skipped to.
    assert summarize(TEXT, 11) == summarize(TEXT, 12) == two
    assert summarize(TEXT, 13).content == f"{two.content} Pay by transfer?"
    assert summarize(TEXT, 100) == summarize(TEXT, 16)
    assert summarize(TEXT, 16).content == " ".join(sentences(TEXT))


def test_a_first_sentence_longer_than_the_budget_is_cut_to_it() -> None:
    assert summarize(TEXT, 3).content == "The invoice is"
    assert summarize(TEXT, 3).cut
    assert summarize(TEXT, 1).content == "The"
    with pytest.raises(ValueError, match="max_words"):
        summarize(TEXT, 0)


def test_a_text_without_words_has_the_empty_summary() -> None:
    assert summarize("", 5).content == summarize(" \n\t ", 5).content == ""
    assert not summarize("", 5).cut


def test_the_response_answers_the_last_user_message_and_counts_every_message() -> None:
    request = request_of(
        {
            "model": "local-chat",
            "messages": [
                {"role": "system", "content": "Summarize the text."},
                {"role": "user", "content": "An earlier question."},
                {"role": "assistant", "content": ""},
                {"role": "user", "content": TEXT},
            ],
            "max_tokens": 10,
        }
    )
    response = chat_response(request)
    assert response == {
        "id": f"chatcmpl-{fingerprint(request)}",
        "object": "chat.completion",
        "created": 0,
        "model": "local-chat",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "The invoice is due in March. It totals 1,200 euros!",
                    "refusal": None,
                },
                "finish_reason": "stop",
            }
        ],
        # 3 + 3 + 1 (an empty message counts as one token, as an embeddings input) + 16.
        "usage": {"prompt_tokens": 23, "completion_tokens": 10, "total_tokens": 33},
    }
    assert chat_response(request) == response


def test_a_cut_answer_finishes_for_length_and_an_empty_one_has_no_completion_tokens() -> None:
    cut = chat_response(user(TEXT, max_tokens=2))
    assert cut["choices"][0]["message"]["content"] == "The invoice"
    assert cut["choices"][0]["finish_reason"] == "length"
    assert cut["usage"] == {"prompt_tokens": 16, "completion_tokens": 2, "total_tokens": 18}
    empty = chat_response(user("   "))
    assert empty["choices"][0]["message"]["content"] == ""
    assert empty["choices"][0]["finish_reason"] == "stop"
    assert empty["usage"] == {"prompt_tokens": 1, "completion_tokens": 0, "total_tokens": 1}
    system_only = request_of({"model": "m", "messages": [{"role": "system", "content": "Hi."}]})
    assert chat_response(system_only)["choices"][0]["message"]["content"] == ""


def test_a_refusal_has_openais_shape_and_looks_at_the_last_user_message_only() -> None:
    refused = chat_response(user("please FORBIDDEN things"), "FORBIDDEN")
    assert refused["choices"][0] == {
        "index": 0,
        "message": {"role": "assistant", "content": None, "refusal": REFUSAL},
        "finish_reason": "stop",
    }
    assert refused["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    earlier = request_of(
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "FORBIDDEN"},
                {"role": "assistant", "content": "No."},
                {"role": "user", "content": "Fine."},
            ],
        }
    )
    assert chat_response(earlier, "FORBIDDEN")["choices"][0]["message"]["content"] == "Fine."


def test_parsing_keeps_what_the_request_asks_and_ignores_unused_keys() -> None:
    expected = ChatRequest("local-chat", (ChatMessage("user", "hi"),), DEFAULT_MAX_TOKENS, None)
    assert user("hi") == expected
    assert user("hi", max_completion_tokens=5).max_tokens == 5
    assert user("hi", max_tokens=5, max_completion_tokens=5).max_tokens == 5
    assert user("hi", max_tokens=None, temperature=None) == user("hi")
    assert user("hi", temperature=1).temperature == 1.0
    extra = user("hi", n=1, top_p=0.5, user="someone", stream=False, response_format={})
    assert extra == user("hi")


def test_the_fingerprint_is_what_is_asked_of_which_endpoint() -> None:
    assert fingerprint(user("hi", max_tokens=DEFAULT_MAX_TOKENS)) == fingerprint(user("hi"))
    assert fingerprint(user("hi", max_tokens=5)) != fingerprint(user("hi"))
    assert fingerprint(user("hi", temperature=0)) != fingerprint(user("hi"))
    assert fingerprint(user("hi")) != fingerprint(EmbeddingsRequest("m", ["hi"], 16, "float"))


DROP = object()  # a key to leave out of the body


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"model": DROP}, "'model'"),
        ({"model": ""}, "'model'"),
        ({"model": 7}, "'model'"),
        ({"messages": DROP}, "'messages'"),
        ({"messages": []}, "'messages'"),
        ({"messages": "hello"}, "'messages'"),
        ({"messages": ["hello"]}, "'messages[0]'"),
        ({"messages": [{"content": "x"}]}, "'messages[0].role'"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "'messages[0].role'"),
        (
            {"messages": [{"role": "user", "content": "x"}, {"role": "user"}]},
            "'messages[1].content'",
        ),
        ({"messages": [{"role": "user", "content": None}]}, "'messages[0].content'"),
        ({"messages": [{"role": "user", "content": [{"text": "x"}]}]}, "'messages[0].content'"),
        ({"max_tokens": 0}, "'max_tokens'"),
        ({"max_tokens": -3}, "'max_tokens'"),
        ({"max_tokens": 2.5}, "'max_tokens'"),
        ({"max_tokens": "5"}, "'max_tokens'"),
        ({"max_tokens": True}, "'max_tokens'"),
        ({"max_completion_tokens": 0}, "'max_completion_tokens'"),
        ({"max_tokens": 5, "max_completion_tokens": 6}, "disagree"),
        ({"temperature": "warm"}, "'temperature'"),
        ({"temperature": 2.5}, "'temperature'"),
        ({"temperature": True}, "'temperature'"),
        ({"stream": True}, "'stream'"),
    ],
)
def test_a_bad_body_is_a_400_naming_the_field(changes: dict[str, Any], field: str) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], **changes}
    body = {key: value for key, value in body.items() if value is not DROP}
    with pytest.raises(HttpError) as raised:
        parse_chat_request(json.dumps(body).encode())
    assert raised.value.status == 400
    assert field in raised.value.message


@pytest.mark.parametrize("body", [b"", b"{", b"[1]", b'"text"'])
def test_a_body_that_is_no_json_object_is_a_400(body: bytes) -> None:
    with pytest.raises(HttpError) as raised:
        parse_chat_request(body)
    assert raised.value.status == 400


@pytest.mark.parametrize("value", [5, "", True, ["x"], {"x": 1}])
def test_a_bad_refusal_trigger_is_refused_naming_the_key(value: object) -> None:
    with pytest.raises(ValueError, match="chat_refusal_containing"):
        FaultConfig.from_json({"chat_refusal_containing": value})


# The endpoint


def test_the_answer_is_the_same_extractive_summary_every_time(client: httpx.Client) -> None:
    first = chat(client, TEXT, max_tokens=10)
    again = chat(client, TEXT, max_tokens=10)
    assert first.content == again.content
    assert first.headers["Content-Type"] == "application/json"
    assert first.json() == chat_response(user(TEXT, max_tokens=10))


def test_max_tokens_cuts_the_answer_and_finishes_for_length(client: httpx.Client) -> None:
    cut = choice(chat(client, TEXT, max_tokens=4))
    assert (cut["message"]["content"], cut["finish_reason"]) == ("The invoice is due", "length")
    same = choice(chat(client, TEXT, max_completion_tokens=4))
    assert same == cut
    whole = chat(client, TEXT, max_tokens=6)
    assert choice(whole)["message"]["content"] == "The invoice is due in March."
    assert choice(whole)["finish_reason"] == "stop"
    assert whole.json()["usage"] == {
        "prompt_tokens": 16,
        "completion_tokens": 6,
        "total_tokens": 22,
    }


def test_an_empty_user_message_gets_an_empty_answer(
    client: httpx.Client, server: LocalModelServer
) -> None:
    answered = chat(client, " \n ")
    assert choice(answered)["message"]["content"] == ""
    assert answered.json()["usage"]["completion_tokens"] == 0
    assert server.stats()["chat_charged"] == 1


def test_unused_keys_are_ignored_and_do_not_change_the_request(
    client: httpx.Client, server: LocalModelServer
) -> None:
    plain = chat(client, TEXT, key="k1")
    extra = chat(client, TEXT, key="k1", n=1, top_p=0.9, user="someone", seed=7)
    assert extra.content == plain.content
    stats = server.stats()
    assert (stats["chat_charged"], stats["deduplicated"]) == (1, 1)


def test_bad_bodies_are_400s_naming_the_field_and_cost_nothing(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(max_tpm=100)
    assert "'model'" in error(chat(client, "x", model=""), 400)["message"]
    assert "'messages'" in error(chat(client, []), 400)["message"]
    bad_role = chat(client, [{"role": "tool", "content": "x"}])
    assert "'messages[0].role'" in error(bad_role, 400)["message"]
    no_content = chat(client, [{"role": "user", "content": None}])
    assert "'messages[0].content'" in error(no_content, 400)["message"]
    assert "'max_tokens'" in error(chat(client, "x", max_tokens=0), 400)["message"]
    not_json = client.post("/chat/completions", content=b"{")
    assert error(not_json, 400)["type"] == "invalid_request_error"
    # The bucket took nothing: a request of the whole limit passes.
    assert chat(client, words(99), max_tokens=1).status_code == 200
    stats = server.stats()
    assert stats["by_status"] == {"400": 6, "200": 1}
    assert (stats["charged"], stats["tokens_charged"], stats["rejected_tpm"]) == (1, 100, 0)


def test_the_api_key_is_required_as_for_embeddings(auth_server: LocalModelServer) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "Hello there."}]}
    url = f"{auth_server.base_url}/chat/completions"
    missing = httpx.post(url, json=body, trust_env=False)
    assert error(missing, 401)["code"] == "invalid_api_key"
    assert missing.headers["WWW-Authenticate"] == "Bearer"
    wrong = httpx.post(url, json=body, headers={"Authorization": "Bearer no"}, trust_env=False)
    error(wrong, 401)
    # The key is checked before the body: a bad body without a key is a 401 too.
    error(httpx.post(url, json={"model": "m"}, trust_env=False), 401)
    right = httpx.post(
        url, json=body, headers={"Authorization": f"Bearer {API_KEY}"}, trust_env=False
    )
    assert choice(right)["message"]["content"] == "Hello there."


# Idempotency keys


def test_a_repeated_key_gets_the_first_answer_and_is_charged_once(
    client: httpx.Client, server: LocalModelServer
) -> None:
    first = chat(client, TEXT, key="k1", max_tokens=10)
    reordered = json.dumps(
        {"max_tokens": 10, "messages": [{"content": TEXT, "role": "user"}], "model": "local-chat"}
    )
    again = client.post("/chat/completions", content=reordered, headers={"Idempotency-Key": "k1"})
    assert again.status_code == 200
    assert again.content == first.content
    stats = server.stats()
    assert (stats["charged"], stats["chat_charged"], stats["deduplicated"]) == (1, 1, 1)
    assert stats["tokens_charged"] == first.json()["usage"]["total_tokens"] == 26
    assert stats["idempotency_keys"] == {"k1": 1}
    assert stats["by_status"] == {"200": 2}


def test_a_key_reused_for_a_different_request_gets_422_and_is_not_charged(
    client: httpx.Client, server: LocalModelServer
) -> None:
    assert chat(client, TEXT, key="k1").status_code == 200
    reused = chat(client, TEXT, key="k1", max_tokens=3)
    assert error(reused, 422)["code"] == "idempotency_key_reused"
    assert "k1" in error(reused, 422)["message"]
    stats = server.stats()
    assert (stats["chat_charged"], stats["deduplicated"], stats["failed"]) == (1, 0, 1)
    assert stats["by_status"] == {"200": 1, "422": 1}


def test_a_key_used_on_one_endpoint_is_never_replayed_on_the_other(
    client: httpx.Client, server: LocalModelServer
) -> None:
    assert embed(client, "alpha", key="shared").status_code == 200
    on_chat = chat(client, "alpha", key="shared")
    assert error(on_chat, 422)["code"] == "idempotency_key_reused"
    assert chat(client, "beta", key="chat-first").status_code == 200
    assert error(embed(client, "beta", key="chat-first"), 422)["code"] == "idempotency_key_reused"
    stats = server.stats()
    assert (stats["charged"], stats["chat_charged"], stats["deduplicated"]) == (2, 1, 0)
    assert stats["by_status"] == {"200": 2, "422": 2}
    assert stats["input_success_counts"] == {sha("alpha"): 1}


def test_a_failed_chat_is_not_remembered_so_its_retry_is_charged(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(status_always=503, retry_after=1.5)
    failed = chat(client, TEXT, key="k1")
    assert error(failed, 503)["code"] == "injected"
    assert failed.headers["Retry-After"] == "1.5"
    server.clear_faults()
    assert chat(client, TEXT, key="k1").status_code == 200
    stats = server.stats()
    assert (stats["chat_charged"], stats["deduplicated"], stats["failed"]) == (1, 0, 1)
    assert stats["idempotency_keys"] == {"k1": 1}


def test_a_lost_answer_is_charged_then_replayed_uncharged(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(lose_response_rate=1.0)
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        chat(client, TEXT, key="k1")
    server.clear_faults()
    retry = chat(client, TEXT, key="k1")
    assert retry.json() == chat_response(user(TEXT))
    stats = server.stats()
    assert (stats["chat_charged"], stats["deduplicated"], stats["lost_responses"]) == (1, 1, 1)


# Faults


def test_injected_statuses_carry_retry_after(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(status_rates={"429": 1.0}, retry_after="2")
    limited = chat(client, TEXT)
    assert error(limited, 429)["type"] == "rate_limit_error"
    assert limited.headers["Retry-After"] == "2"
    stats = server.stats()
    assert (stats["failed"], stats["charged"], stats["by_status"]) == (1, 0, {"429": 1})


def test_a_seeded_status_rate_gives_the_same_sequence_to_chat(
    client: httpx.Client, server: LocalModelServer
) -> None:
    runs = []
    for _ in range(2):
        server.set_faults(status_rates={"503": 0.5}, seed=11)
        runs.append([chat(client, f"doc {i}").status_code for i in range(12)])
    assert runs[0] == runs[1]
    assert set(runs[0]) == {200, 503}


def test_a_poison_substring_in_any_message_fails_the_request(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(fail_inputs_containing={"POISON": 400, "DOWN": 503})
    in_system = [{"role": "system", "content": "POISON"}, {"role": "user", "content": "x"}]
    assert "'POISON'" in error(chat(client, in_system), 400)["message"]
    in_reply = [{"role": "assistant", "content": "DOWN"}, {"role": "user", "content": "x"}]
    assert error(chat(client, in_reply), 503)["code"] == "injected"
    assert chat(client, "clean text").status_code == 200
    assert server.stats()["by_status"] == {"400": 1, "503": 1, "200": 1}


def test_the_refusal_fault_answers_with_openais_refusal_shape(
    client: httpx.Client, server: LocalModelServer
) -> None:
    assert server.set_faults(chat_refusal_containing="FORBIDDEN")["chat_refusal_containing"] == (
        "FORBIDDEN"
    )
    refused = chat(client, "Tell me FORBIDDEN things.", key="k1")
    assert choice(refused) == {
        "index": 0,
        "message": {"role": "assistant", "content": None, "refusal": REFUSAL},
        "finish_reason": "stop",
    }
    assert refused.json()["usage"] == {
        "prompt_tokens": 4,
        "completion_tokens": 5,
        "total_tokens": 9,
    }
    assert choice(chat(client, "Fine things."))["message"]["refusal"] is None
    # A refusal is an answer: charged, and replayed under its key once the fault is gone.
    server.clear_faults()
    assert chat(client, "Tell me FORBIDDEN things.", key="k1").content == refused.content
    stats = server.stats()
    assert (stats["chat_charged"], stats["deduplicated"], stats["tokens_charged"]) == (2, 1, 13)
    assert server.faults()["chat_refusal_containing"] is None


def test_padding_applies_to_chat_answers(client: httpx.Client, server: LocalModelServer) -> None:
    plain = chat(client, TEXT).json()
    server.set_faults(pad_response_bytes=1000)
    padded = chat(client, TEXT).json()
    assert len(padded.pop("padding")) == 1000
    assert padded == plain


def test_the_concurrency_limit_counts_both_endpoints(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(max_concurrency=1, concurrency_retry_after=3, hang_rate=1.0, hang_s=60)
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(embed, client, "held")
        wait_until(lambda: server.stats()["in_flight"] == 1)
        refused = chat(client, TEXT)
        server.clear_faults()
        assert held.result().status_code == 200
    assert error(refused, 429)["code"] == "concurrency_limit_exceeded"
    assert refused.headers["Retry-After"] == "3"
    stats = server.stats()
    assert (stats["rejected_concurrency"], stats["peak_in_flight"]) == (1, 1)
    assert stats["by_endpoint"] == {"embeddings": 1, "chat": 1}


# The tokens-per-minute limit


def test_chat_pays_its_total_tokens_from_the_bucket_embeddings_use(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(max_tpm=LIMIT)
    assert embed(client, words(3000)).status_code == 200
    # 2999 prompt tokens and a one-word answer: the other half of the bucket.
    answered = chat(client, words(2999), max_tokens=1)
    assert answered.json()["usage"]["total_tokens"] == 3000
    refused = chat(client, words(999), max_tokens=1)
    over = error(refused, 429)
    assert (over["type"], over["code"]) == ("rate_limit_error", "rate_limit_exceeded")
    assert "tokens per minute" in over["message"]
    assert float(refused.headers["Retry-After"]) > 0
    assert error(embed(client, words(500)), 429)["code"] == "rate_limit_exceeded"
    stats = server.stats()
    assert (stats["tokens_charged"], stats["rejected_tpm"]) == (LIMIT, 2)
    assert (stats["charged"], stats["chat_charged"], stats["failed"]) == (2, 1, 2)
    assert stats["by_status"] == {"200": 2, "429": 2}


def test_the_answers_tokens_count_toward_the_limit(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(max_tpm=100)
    # 95 prompt tokens fit, but not with the ten words the answer would have.
    too_large = chat(client, words(95), max_tokens=10)
    assert "too large" in error(too_large, 429)["message"]
    assert "Retry-After" not in too_large.headers
    assert chat(client, words(95), max_tokens=5).json()["usage"]["total_tokens"] == 100
    stats = server.stats()
    assert (stats["tokens_charged"], stats["rejected_tpm"]) == (100, 1)


def test_a_replayed_chat_is_neither_refused_nor_charged_by_the_limit(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(max_tpm=LIMIT)
    first = chat(client, words(2999, "a"), key="k1", max_tokens=1)
    assert first.status_code == 200
    assert chat(client, words(5999, "b"), max_tokens=1).status_code == 429
    assert chat(client, words(2999, "c"), max_tokens=1).status_code == 200
    # The bucket is spent, and the replay passes all the same.
    assert chat(client, words(2999, "a"), key="k1", max_tokens=1).content == first.content
    stats = server.stats()
    assert (stats["chat_charged"], stats["deduplicated"], stats["rejected_tpm"]) == (2, 1, 1)
    assert stats["tokens_charged"] == LIMIT


# The counters


def test_stats_count_requests_per_endpoint_and_charged_chats(
    client: httpx.Client, server: LocalModelServer
) -> None:
    assert server.stats()["by_endpoint"] == {"embeddings": 0, "chat": 0}
    embed(client, ["alpha", "beta"])
    embed(client, "gamma", key="e1")
    chat(client, TEXT, max_tokens=10)
    chat(client, TEXT, key="c1")
    chat(client, TEXT, key="c1")
    chat(client, [])
    stats = server.stats()
    assert stats["requests"] == 6
    assert stats["by_endpoint"] == {"embeddings": 2, "chat": 4}
    assert (stats["charged"], stats["chat_charged"], stats["deduplicated"]) == (4, 2, 1)
    assert (stats["succeeded"], stats["failed"]) == (5, 1)
    # Embeddings inputs 2 + 1 tokens; chats 16 + 10 and 16 + 16 (the default budget takes
    # all 16 words of TEXT); the replay and the 400 cost nothing.
    assert stats["tokens_charged"] == 3 + 26 + 32
    assert stats["inputs_embedded"] == 3
    assert set(stats["input_success_counts"]) == {sha("alpha"), sha("beta"), sha("gamma")}
    assert stats["idempotency_keys"] == {"e1": 1, "c1": 1}
    server.reset_stats()
    stats = server.stats()
    assert stats["by_endpoint"] == {"embeddings": 0, "chat": 0}
    assert stats["chat_charged"] == 0
