"""The model connection's extra ``prices``, and a call's cost from its tokens (ADR 0110)."""

from __future__ import annotations

import pytest

from replayable.models.chat import parse_answer
from replayable.models.endpoint import prices_from_extra, settings_from_fields
from replayable.models.http import Price


def test_prices_are_read_per_model_with_output_defaulting_to_free():
    prices = prices_from_extra(
        {"text-embedding-3-small": {"input": 0.02}, "gpt-4o-mini": {"input": 0.15, "output": 0.6}}
    )
    assert prices == {
        "text-embedding-3-small": Price(0.02, 0.0),
        "gpt-4o-mini": Price(0.15, 0.6),
    }
    settings = settings_from_fields("http://127.0.0.1:9/v1", None, None, None, {"prices": {}})
    assert settings.price_of("gpt-4o-mini") is None


@pytest.mark.parametrize(
    ("prices", "named"),
    [
        ("0.02", r"extra prices must map each model"),
        ({"m": 0.02}, r"extra prices\.m must hold at least input"),
        ({"m": {"output": 1}}, r"extra prices\.m must hold at least input"),
        ({"m": {"input": -1}}, r"prices\.m\.input must be USD per million tokens.*-1"),
        ({"m": {"input": "cheap"}}, r"prices\.m\.input .*'cheap'"),
        ({"m": {"input": 1, "output": True}}, r"prices\.m\.output .*True"),
        ({"m": {"input": 1, "batch": 0.5}}, r"prices\.m has unknown fields \['batch'\]"),
    ],
)
def test_a_bad_price_is_refused_naming_its_field(prices, named):
    with pytest.raises(ValueError, match=named):
        settings_from_fields("http://127.0.0.1:9/v1", None, None, None, {"prices": prices})


def test_a_call_costs_its_input_and_output_tokens_at_their_prices():
    assert Price(0.15, 0.6).of(1_000_000, 0) == pytest.approx(0.15)
    assert Price(0.15, 0.6).of(2_000, 500) == pytest.approx((2_000 * 0.15 + 500 * 0.6) / 1e6)


def test_a_chat_answer_reports_its_completion_tokens_apart():
    answer = parse_answer(
        {
            "choices": [{"message": {"content": "A summary."}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 40, "completion_tokens": 2, "total_tokens": 42},
        }
    )
    assert (answer.tokens, answer.output_tokens) == (42, 2)
    no_total = parse_answer(
        {
            "choices": [{"message": {"content": "A summary."}}],
            "usage": {"prompt_tokens": 40, "completion_tokens": 2},
        }
    )
    assert (no_total.tokens, no_total.output_tokens) == (42, 2)
