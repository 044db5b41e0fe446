"""Requests packed within the provider's per-request limits, from estimated tokens."""

from __future__ import annotations

import pytest

from replayable.stages.embed.packing import (
    MAX_INPUTS_PER_REQUEST,
    MAX_TOKENS_PER_REQUEST,
    estimate_tokens,
    pack,
)


def test_an_estimate_is_a_token_per_three_bytes_and_at_least_one():
    assert estimate_tokens(0) == 1
    assert estimate_tokens(3) == 1
    assert estimate_tokens(4) == 2
    assert estimate_tokens(len("naïve café".encode())) == 4  # 12 bytes


def test_no_request_passes_2048_inputs():
    requests = pack((f"c{i}", 1) for i in range(5000))
    assert [len(r) for r in requests] == [2048, 2048, 904]
    assert MAX_INPUTS_PER_REQUEST == 2048


def test_no_request_passes_300000_tokens():
    requests = pack((f"c{i}", 7000) for i in range(100))  # 42 fit in 294,000
    assert [len(r) for r in requests] == [42, 42, 16]
    assert MAX_TOKENS_PER_REQUEST == 300_000


def test_the_tighter_limit_closes_a_request_and_order_is_kept():
    sizes = [("a", 5), ("b", 5), ("c", 1), ("d", 9), ("e", 1), ("f", 1)]
    assert pack(sizes, max_inputs=3, max_tokens=10) == [["a", "b"], ["c", "d"], ["e", "f"]]


def test_an_input_larger_than_a_request_goes_alone():
    assert pack([("a", 1), ("big", 50), ("b", 1)], max_tokens=10) == [["a"], ["big"], ["b"]]


@pytest.mark.parametrize("limits", [{"max_inputs": 0}, {"max_tokens": 0}])
def test_limits_below_one_are_refused(limits):
    with pytest.raises(ValueError, match="at least 1"):
        pack([("a", 1)], **limits)
