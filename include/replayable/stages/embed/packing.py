"""Chunks packed into embedding requests within a provider's per-request limits.

OpenAI's ``/v1/embeddings`` takes at most 2,048 inputs and 300,000 tokens in one request,
and at most 8,192 tokens in one input; past them it answers 400 after the request is sent.
Tokens are counted by the provider's tokenizer, which the pipeline does not have, so they
are estimated from each text's size in UTF-8 bytes: byte-level BPE tokens are at least one
byte, and English averages about four bytes a token, code and numbers about three, so one
token per three bytes is an estimate that rarely falls short. A budget spends the estimate
before the send and is corrected from the response's ``usage`` after it (ADR 0106).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

MAX_INPUTS_PER_REQUEST = 2048
MAX_TOKENS_PER_REQUEST = 300_000
MAX_TOKENS_PER_INPUT = 8192
BYTES_PER_TOKEN = 3


def estimate_tokens(n_bytes: int) -> int:
    """The tokens a text of ``n_bytes`` UTF-8 bytes is expected to use, at least one."""
    return max(1, math.ceil(n_bytes / BYTES_PER_TOKEN))


def pack(
    sizes: Iterable[tuple[str, int]],
    *,
    max_inputs: int = MAX_INPUTS_PER_REQUEST,
    max_tokens: int = MAX_TOKENS_PER_REQUEST,
) -> list[list[str]]:
    """Cut ``(chunk id, estimated tokens)`` pairs, in order, into requests within both limits.

    A request is closed when the next input would take it past ``max_inputs`` or
    ``max_tokens``; an input larger than ``max_tokens`` on its own goes alone (the caller
    refuses inputs past the per-input limit before packing).
    """
    if max_inputs < 1 or max_tokens < 1:
        raise ValueError("max_inputs and max_tokens must be at least 1")
    requests: list[list[str]] = []
    current: list[str] = []
    tokens = 0
    for chunk_id, size in sizes:
        if current and (len(current) == max_inputs or tokens + size > max_tokens):
            requests.append(current)
            current, tokens = [], 0
        current.append(chunk_id)
        tokens += size
    if current:
        requests.append(current)
    return requests
