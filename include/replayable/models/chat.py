"""Chat completions over httpx: one conversation in, one answer out, classified.

The answer is the first choice's message. OpenAI answers a refusal with ``content`` null and
the reason in ``refusal``; a model that returns nothing at all (an empty or blank
``content``) has not summarised anything either. Both are item errors the stage dead-letters
(terminal: asking the same model the same thing again gets the same answer), never a
summary stored as if it were one. A malformed answer is the provider's fault and retryable,
as for embeddings (ADR 0078). An answer cut off at ``max_tokens`` (``finish_reason``
``length``) is ``truncated`` and one stopped by the provider's filter ``content_filtered``,
both terminal, whatever partial content they carry; a client told to keep truncated answers
returns them marked (ADR 0134).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from replayable.models.http import CallRecord, Gate, HttpModelClient, Request
from replayable.retry import ErrorKind, ItemError

# Why an answer ended when it was cut off at max_tokens (OpenAI says length; some
# compatible servers say max_tokens), and when the provider's filter stopped it.
TRUNCATED = frozenset({"length", "max_tokens"})
FILTERED = "content_filter"

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

    @property
    def truncated(self) -> bool:
        """Whether the answer was cut off at ``max_tokens``."""
        return self.finish_reason in TRUNCATED


class HttpChatClient(HttpModelClient):
    """OpenAI-compatible chat completions over httpx, with classified, bounded retries.

    ``max_tokens``: the answer's length limit, or None for the provider's default;
    ``keep_truncated``: return an answer cut off at it (marked) instead of failing with
    ``truncated``; the other parameters are
    :class:`~replayable.models.http.HttpModelClient`'s.
    """

    def __init__(
        self, *, max_tokens: int | None = None, keep_truncated: bool = False, **client: Any
    ) -> None:
        client.setdefault("timeout_s", 60.0)
        super().__init__(**client)
        self.max_tokens = max_tokens
        self.keep_truncated = keep_truncated

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
        return self._send(self._request(messages), idempotency_key, on_call, gate, what="chat")

    def _request(self, messages: Sequence[Mapping[str, str]]) -> Request[ChatResult]:
        body: dict[str, object] = {"model": self.model, "messages": [dict(m) for m in messages]}
        if self.max_tokens:
            body["max_tokens"] = self.max_tokens
        keep = self.keep_truncated
        return Request(
            "/chat/completions",
            body,
            RESPONSE_LIMIT,
            1,
            lambda payload: parse_answer(payload, keep_truncated=keep),
            lambda r: r.tokens,
            lambda r: r.output_tokens,
            # A kept truncated answer is recorded as such: the report and metrics count it.
            status=lambda r: "truncated" if r.truncated else "ok",
        )


def parse_answer(payload: object, *, keep_truncated: bool = False) -> ChatResult:
    """The first choice's answer; a refusal, an empty, filtered or (unless ``keep_truncated``)
    truncated answer is a terminal item error, an unreadable one a retryable ``bad_response``.

    Checked with explicit tests, never ``assert`` (``python -O`` strips those).
    """
    try:
        choice = _field(payload, "choices", list)[0]
        message = _field(choice, "message", dict)
        content = message.get("content")
        refusal = message.get("refusal")
        finish_reason = str(_field(choice, "finish_reason", (str, type(None))) or "stop")
        usage = _field(payload, "usage", (dict, type(None))) or {}
        output_tokens = int(usage.get("completion_tokens") or 0)
        tokens = int(usage.get("total_tokens") or 0) or (
            int(usage.get("prompt_tokens") or 0) + output_tokens
        )
        if not (content is None or isinstance(content, str)):
            raise TypeError(f"content is {type(content).__name__}, not text")
    except (IndexError, KeyError, TypeError, ValueError) as exc:
        raise ItemError(
            "bad_response", f"unreadable chat completion: {exc!r}", ErrorKind.RETRYABLE
        ) from exc
    if refusal:
        raise ItemError("refused", f"the model refused: {str(refusal)[:500]}", ErrorKind.TERMINAL)
    if finish_reason == FILTERED:
        raise ItemError(
            "content_filtered",
            f"the provider's content filter stopped the answer after {output_tokens} tokens",
            ErrorKind.TERMINAL,
        )
    if content is None or not content.strip():
        raise ItemError(
            "empty_answer",
            f"the model answered nothing (finish_reason {finish_reason})",
            ErrorKind.TERMINAL,
        )
    result = ChatResult(
        text=content, finish_reason=finish_reason, tokens=tokens, output_tokens=output_tokens
    )
    if result.truncated and not keep_truncated:
        raise ItemError(
            "truncated",
            f"the answer was cut off at max_tokens (finish_reason {finish_reason}, "
            f"{output_tokens} tokens): raise summary_max_tokens, or set summary_keep_truncated "
            "to keep such answers",
            ErrorKind.TERMINAL,
        )
    return result


def _field(container: object, name: str, kind: type | tuple[type, ...]) -> Any:
    """``container[name]`` when ``container`` is a JSON object and the value a ``kind``."""
    if not isinstance(container, dict):
        raise TypeError(f"expected a JSON object around {name!r}, got {type(container).__name__}")
    value = container.get(name)
    if not isinstance(value, kind):
        raise TypeError(f"{name!r} is {type(value).__name__}")
    return value
