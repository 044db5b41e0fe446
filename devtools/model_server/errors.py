"""Error responses in the OpenAI API's shape.

Handlers raise :class:`HttpError`; the handler answers it with :func:`error_body`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def error_body(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """The JSON error body OpenAI's clients expect, its ``type`` chosen by ``status``."""
    if status == 401:
        kind = "authentication_error"
    elif status == 403:
        kind = "permission_error"
    elif status == 404:
        kind = "not_found_error"
    elif status == 429:
        kind = "rate_limit_error"
    elif status >= 500:
        kind = "server_error"
    else:
        kind = "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


class HttpError(Exception):
    """An error response; ``injected`` marks one caused by the fault config."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = dict(headers or {})


def json_object(body: bytes) -> dict[str, Any]:
    """A request body as a JSON object; else a 400 naming why."""
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise HttpError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise HttpError(400, "request body must be a JSON object")
    return payload


def model_request(body: bytes) -> tuple[dict[str, Any], str]:
    """A ``/v1`` request body as a JSON object, and its ``model``; else a 400 naming why."""
    payload = json_object(body)
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise HttpError(400, "'model' must be a non-empty string")
    return payload, model
