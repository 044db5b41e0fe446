"""Chat completions: the request, the extractive summary that answers it, and the response.

The server is no language model. Its answer to a ``POST /v1/chat/completions`` request is a
pure function of the request: an extractive summary of the last user message, its first
sentences. That is enough for a pipeline stage that asks for summaries to be tested offline
like the embed stage: the same request always gets the same answer, a ``max_tokens`` cut is
visible in ``finish_reason``, the usage is countable, and a refusal (a fault, see
:mod:`devtools.model_server.faults`) has OpenAI's refusal shape. Never use it to judge what
a summary says.

Tokens are whitespace-separated words here as for embeddings: ``usage.prompt_tokens`` is
:func:`~devtools.model_server.vectors.count_tokens` summed over the messages, and
``max_tokens`` and ``usage.completion_tokens`` count the answer's words.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from devtools.model_server.errors import HttpError, model_request
from devtools.model_server.idempotency import fingerprint
from devtools.model_server.vectors import usage_tokens

DEFAULT_MAX_TOKENS = 64
ROLES = ("system", "user", "assistant")
REFUSAL = "I can't help with that."

# A sentence ends at ". ", "! " or "? " (after whitespace is collapsed) or at a line break.
_SENTENCE_END_RE = re.compile(r"(?<=[.!?]) ")


@dataclass(frozen=True)
class ChatMessage:
    """One message of the conversation: who said it and what."""

    role: str
    content: str


@dataclass(frozen=True)
class ChatRequest:
    """What a ``POST /v1/chat/completions`` body asks for, checked.

    ``max_tokens`` is the answer's budget in words, :data:`DEFAULT_MAX_TOKENS` when the
    request gives none, so that two requests that must get the same answer are the same.
    """

    model: str
    messages: tuple[ChatMessage, ...]
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float | None = None

    def canonical(self) -> list[object]:
        """What identifies the request for its idempotency key; it names the endpoint."""
        return [
            "chat.completions",
            self.model,
            [[message.role, message.content] for message in self.messages],
            self.max_tokens,
            self.temperature,
        ]

    @property
    def contents(self) -> list[str]:
        """Every message's content, in order: the request's inputs for faults and usage."""
        return [message.content for message in self.messages]

    @property
    def last_user_content(self) -> str:
        """The content of the last user message, the one answered; "" if there is none."""
        for message in reversed(self.messages):
            if message.role == "user":
                return message.content
        return ""


@dataclass(frozen=True)
class Summary:
    """An answer's text, and whether ``max_tokens`` cut it in the middle of a sentence."""

    content: str
    cut: bool


def _budget(payload: dict[str, Any], key: str) -> int | None:
    """``max_tokens`` or ``max_completion_tokens``: a positive integer, or None if absent."""
    value = payload.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise HttpError(400, f"'{key}' must be a positive integer")
    return value


def parse_chat_request(body: bytes) -> ChatRequest:
    """Parse and check a request body; raise a 400 :class:`HttpError` naming the field.

    Keys the server does not use (``n``, ``top_p``, ``user``...) are ignored, so that the
    options a client usually sends pass; ``stream`` is refused, since the answer would not
    be the event stream such a client reads.
    """
    payload, model = model_request(body)
    raw_messages = payload.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise HttpError(400, "'messages' must be a non-empty list of messages")
    messages = []
    for index, raw in enumerate(raw_messages):
        if not isinstance(raw, dict):
            raise HttpError(400, f"'messages[{index}]' must be an object with a role and content")
        role = raw.get("role")
        if role not in ROLES:
            allowed = ", ".join(repr(name) for name in ROLES)
            raise HttpError(400, f"'messages[{index}].role' must be one of {allowed}")
        content = raw.get("content")
        if not isinstance(content, str):
            raise HttpError(400, f"'messages[{index}].content' must be a string")
        messages.append(ChatMessage(role, content))
    max_tokens = _budget(payload, "max_tokens")
    max_completion_tokens = _budget(payload, "max_completion_tokens")
    if None not in (max_tokens, max_completion_tokens) and max_tokens != max_completion_tokens:
        raise HttpError(400, "'max_tokens' and 'max_completion_tokens' disagree; send one of them")
    budget = max_completion_tokens or max_tokens or DEFAULT_MAX_TOKENS
    temperature = payload.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool)
        or not isinstance(temperature, int | float)
        or not (math.isfinite(temperature) and 0 <= temperature <= 2)
    ):
        raise HttpError(400, "'temperature' must be a number between 0 and 2")
    if payload.get("stream") not in (None, False):
        raise HttpError(400, "'stream' is not supported by the local model server; omit it")
    return ChatRequest(
        model,
        tuple(messages),
        budget,
        None if temperature is None else float(temperature),
    )


def sentences(text: str) -> list[str]:
    """Split ``text`` into sentences, each with its whitespace collapsed to single spaces.

    A sentence ends at a line break or at ``.``, ``!`` or ``?`` followed by whitespace, and
    keeps its punctuation; blank lines make no sentence.
    """
    found: list[str] = []
    for line in text.splitlines():
        collapsed = " ".join(line.split())
        found.extend(sentence for sentence in _SENTENCE_END_RE.split(collapsed) if sentence)
    return found


def summarize(text: str, max_words: int) -> Summary:
    """Return the first sentences of ``text`` that fit within ``max_words`` words together.

    Whole sentences only, unless not even the first one fits: then its first ``max_words``
    words, and the summary is ``cut``, as a model's answer stopped by its ``max_tokens``
    is. A text without words has the empty summary.
    """
    if max_words < 1:
        raise ValueError(f"max_words must be at least 1, got {max_words}")
    chosen: list[str] = []
    used = 0
    for sentence in sentences(text):
        words = sentence.split(" ")
        if used + len(words) > max_words:
            if not chosen:
                return Summary(" ".join(words[:max_words]), cut=True)
            break
        chosen.append(sentence)
        used += len(words)
    return Summary(" ".join(chosen), cut=False)


def completion_tokens(text: str | None) -> int:
    """Return the usage tokens of an answer: its words (none for the empty answer)."""
    return len(text.split()) if text else 0


def chat_usage(request: ChatRequest, answer: str | None) -> dict[str, int]:
    """The response's ``usage``; its ``total_tokens`` is what ``max_tpm`` charges."""
    prompt = usage_tokens(request.contents)
    completion = completion_tokens(answer)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def chat_response(request: ChatRequest, refuse_containing: str | None = None) -> dict[str, Any]:
    """The OpenAI-shaped response to ``request``: one choice, the summary, and the usage.

    When the last user message contains ``refuse_containing``, the answer is a refusal:
    ``content`` null and ``refusal`` set, as OpenAI answers one; its words count as
    completion tokens. The ``id`` is the request's fingerprint and ``created`` is 0, so the
    same request always gets the same bytes.
    """
    last = request.last_user_content
    message: dict[str, Any]
    if refuse_containing is not None and refuse_containing in last:
        message = {"role": "assistant", "content": None, "refusal": REFUSAL}
        answer, finish_reason = REFUSAL, "stop"
    else:
        summary = summarize(last, request.max_tokens)
        message = {"role": "assistant", "content": summary.content, "refusal": None}
        answer, finish_reason = summary.content, "length" if summary.cut else "stop"
    return {
        "id": f"chatcmpl-{fingerprint(request)}",
        "object": "chat.completion",
        "created": 0,
        "model": request.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": chat_usage(request, answer),
    }
