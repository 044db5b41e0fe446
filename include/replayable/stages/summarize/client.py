"""Chat completions over httpx: one conversation in, one answer out, classified.

The answer is the first choice's message. OpenAI answers a refusal with ``content`` null and
the reason in ``refusal``; a model that returns nothing at all (an empty or blank
``content``) has not summarised anything either. Both are item errors the stage dead-letters
(terminal: asking the same model the same thing again gets the same answer), never a
summary stored as if it were one. A malformed answer is the provider's fault and retryable,
as for embeddings (ADR 0078).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from replayable.retry import ErrorKind, ItemError
from replayable.stages.model_http import CallRecord, Gate, HttpModelClient, Request

# An answer is refused past this size: a chat answer is text bounded by max_tokens (at most
# a few hundred KB for the longest completions providers offer), plus its envelope.
RESPONSE_LIMIT = 4 * 2**20


@dataclass(frozen=True)
class ChatResult:
    """The answer's text, why it ended (``stop``, or ``length`` at max_tokens), its tokens
    (all of them, and those the model generated)."""

    text: str
    finish_reason: str
    tokens: int
    output_tokens: int = 0


class HttpChatClient(HttpModelClient):
    """OpenAI-compatible chat completions over httpx, with classified, bounded retries.

    ``max_tokens``: the answer's length limit, or None for the provider's default; the
    other parameters are :class:`~replayable.stages.model_http.HttpModelClient`'s.
    """

    def __init__(self, *, max_tokens: int | None = None, **client: Any) -> None:
        client.setdefault("timeout_s", 60.0)
        super().__init__(**client)
        self.max_tokens = max_tokens

    def complete(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        idempotency_key: str,
        on_call: Callable[[CallRecord], None] | None = None,
        gate: Gate | None = None,
    ) -> ChatResult:
        """Answer ``messages`` in one request, retried per :class:`CallRetry`.

        ``idempotency_key`` names the request, so a provider that de-duplicates never
        charges a replay; ``on_call`` receives a record of every request made; ``gate`` is
        entered around each one (the shared budget).
        """
        return self._call(
            lambda attempt: self._request(messages, idempotency_key, attempt, on_call),
            gate=gate,
            describe=f"chat {idempotency_key}",
        )

    def _request(
        self,
        messages: Sequence[Mapping[str, str]],
        key: str,
        attempt: int,
        on_call: Callable[[CallRecord], None] | None,
    ) -> ChatResult:
        body: dict[str, object] = {"model": self.model, "messages": [dict(m) for m in messages]}
        if self.max_tokens:
            body["max_tokens"] = self.max_tokens
        request = Request(
            "/chat/completions",
            body,
            RESPONSE_LIMIT,
            1,
            parse_answer,
            lambda r: r.tokens,
            lambda r: r.output_tokens,
        )
        return self._post(request, key, attempt, on_call)


def parse_answer(payload: object) -> ChatResult:
    """The first choice's answer; a refusal or an empty answer is a terminal item error."""
    try:
        assert isinstance(payload, dict)
        choice = payload["choices"][0]
        message = choice["message"]
        assert isinstance(message, dict)
        content = message.get("content")
        refusal = message.get("refusal")
        finish_reason = str(choice.get("finish_reason") or "stop")
        usage = payload.get("usage") or {}
        output_tokens = int(usage.get("completion_tokens") or 0)
        tokens = int(usage.get("total_tokens") or 0) or (
            int(usage.get("prompt_tokens") or 0) + output_tokens
        )
        assert content is None or isinstance(content, str)
    except (AssertionError, IndexError, KeyError, TypeError, ValueError) as exc:
        raise ItemError(
            "bad_response", f"unreadable chat completion: {exc!r}", ErrorKind.RETRYABLE
        ) from exc
    if refusal:
        raise ItemError("refused", f"the model refused: {str(refusal)[:500]}", ErrorKind.TERMINAL)
    if content is None or not content.strip():
        raise ItemError(
            "empty_answer",
            f"the model answered nothing (finish_reason {finish_reason})",
            ErrorKind.TERMINAL,
        )
    return ChatResult(
        text=content, finish_reason=finish_reason, tokens=tokens, output_tokens=output_tokens
    )
