"""A batch's input file, checked line by line before the batch runs.

Every line must be valid for the batch to run (the codes are in
:mod:`~devtools.model_server.batches`); the bodies of valid lines are then checked as
``POST /v1/embeddings`` checks a request, and the poison faults applied, so that each line
knows whether it will succeed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from devtools.model_server.api_shapes import to_bytes
from devtools.model_server.errors import HttpError
from devtools.model_server.vectors import EmbeddingsRequest, parse_embeddings_request

if TYPE_CHECKING:
    from devtools.model_server.faults import FaultConfig

BATCH_ENDPOINT: Final = "/v1/embeddings"
MAX_REPORTED_LINE_ERRORS = 100


@dataclass(frozen=True)
class Line:
    """One valid input line: its request, or the error ``/v1/embeddings`` would answer it."""

    number: int
    custom_id: str
    request: EmbeddingsRequest | None
    error: HttpError | None


@dataclass(frozen=True)
class Plan:
    """What a batch's input file holds, checked: its lines, or why it fails.

    ``succeeding[i]`` is how many of the first ``i`` lines succeed, for ``request_counts``.
    ``lines`` is emptied once the batch's results are written; ``total`` stays.
    """

    lines: tuple[Line, ...]
    errors: tuple[dict[str, Any], ...]
    succeeding: tuple[int, ...]
    total: int


def _line_error(code: str, message: str, line: int | None, param: str | None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


def _input_count(body: Mapping[str, Any]) -> int:
    """The embedding inputs a body asks for, as the batch limit counts them."""
    raw = body.get("input")
    if isinstance(raw, str):
        return 1
    return len(raw) if isinstance(raw, list) else 0


def _check_line(
    raw: bytes, number: int, seen: set[str], model: str | None
) -> tuple[str, dict[str, Any]] | dict[str, Any]:
    """Return a line's ``custom_id`` and body, or the validation error it gets.

    ``seen`` collects the custom_ids so far; ``model`` is the first line's model, if any.
    """
    try:
        item = json.loads(raw)
    except (ValueError, RecursionError):
        return _line_error(
            "invalid_json_line", "This line is not parseable as valid JSON.", number, None
        )
    if not isinstance(item, dict):
        return _line_error("invalid_json_line", "This line is not a JSON object.", number, None)
    for field in ("custom_id", "method", "url", "body"):
        if field not in item:
            message = f"Missing required parameter: '{field}'."
            return _line_error("missing_required_parameter", message, number, field)
    custom_id, body = item["custom_id"], item["body"]
    if not isinstance(custom_id, str) or not custom_id:
        return _line_error(
            "invalid_value", "'custom_id' must be a non-empty string.", number, "custom_id"
        )
    if item["method"] != "POST":
        return _line_error("invalid_value", "'method' must be 'POST'.", number, "method")
    if item["url"] != BATCH_ENDPOINT:
        return _line_error(
            "url_mismatch",
            f"The url {item['url']!r} does not match the batch's endpoint {BATCH_ENDPOINT!r}.",
            number,
            "url",
        )
    if not isinstance(body, dict):
        return _line_error("invalid_value", "'body' must be a JSON object.", number, "body")
    line_model = body.get("model")
    if model is not None and isinstance(line_model, str) and line_model != model:
        return _line_error(
            "model_mismatch",
            f"The model {line_model!r} differs from the first line's {model!r}; "
            "a batch uses one model.",
            number,
            "body.model",
        )
    if custom_id in seen:
        return _line_error(
            "duplicate_custom_id",
            f"The custom_id {custom_id!r} is used by an earlier line; each must be unique.",
            number,
            "custom_id",
        )
    seen.add(custom_id)
    return custom_id, body


def _injected(config: FaultConfig, inputs: Sequence[str]) -> HttpError | None:
    """The injected failure of a line with these inputs, if a poison substring matches."""
    for needle, status in (*config.batch_fail_inputs_containing, *config.fail_inputs_containing):
        if any(needle in text for text in inputs):
            return HttpError(
                status,
                f"injected fault: HTTP {status} (an input contains {needle!r})",
                code="injected",
            )
    return None


def plan_lines(data: bytes, config: FaultConfig, dim: int) -> Plan:
    """Check a batch's input file under ``config``; return its lines or its errors.

    Every line must be valid for the batch to run (see the module docstring). The bodies of
    valid lines are then checked as ``POST /v1/embeddings`` checks a request (``dim`` being
    the server's default ``dimensions``), and the poison faults are applied, so that each
    line knows whether it will succeed.
    """
    raw_lines = data.split(b"\n")
    if raw_lines[-1] == b"":
        raw_lines.pop()  # the newline that ends the last line
    if not any(raw.strip() for raw in raw_lines):
        error = _line_error("empty_file", "The input file has no requests.", None, None)
        return Plan((), (error,), (0,), 0)

    limit_errors: list[dict[str, Any]] = []
    if len(raw_lines) > config.batch_max_requests:
        limit_errors.append(
            _line_error(
                "too_many_tasks",
                f"The batch has {len(raw_lines)} requests; at most "
                f"{config.batch_max_requests} are allowed.",
                config.batch_max_requests + 1,
                None,
            )
        )
    line_errors: list[dict[str, Any]] = []
    valid: list[tuple[int, str, dict[str, Any]]] = []
    seen: set[str] = set()
    model: str | None = None
    inputs = 0
    over_inputs: int | None = None
    for number, raw in enumerate(raw_lines, start=1):
        checked = _check_line(raw, number, seen, model)
        if isinstance(checked, dict):
            if len(line_errors) < MAX_REPORTED_LINE_ERRORS:
                line_errors.append(checked)
            continue
        custom_id, body = checked
        if model is None and isinstance(body.get("model"), str):
            model = body["model"]
        inputs += _input_count(body)
        if over_inputs is None and inputs > config.batch_max_inputs:
            over_inputs = number
        valid.append((number, custom_id, body))
    if over_inputs is not None:
        limit_errors.append(
            _line_error(
                "too_many_inputs",
                f"The batch asks for {inputs} embedding inputs; at most "
                f"{config.batch_max_inputs} are allowed across its requests.",
                over_inputs,
                "body.input",
            )
        )
    if limit_errors or line_errors:
        return Plan((), (*limit_errors, *line_errors), (0,), 0)

    lines: list[Line] = []
    succeeding = [0]
    for number, custom_id, body in valid:
        try:
            request = parse_embeddings_request(to_bytes(body), dim)
        except HttpError as exc:
            lines.append(Line(number, custom_id, None, exc))
        else:
            failure = _injected(config, request.inputs)
            if failure is None:
                lines.append(Line(number, custom_id, request, None))
            else:
                lines.append(Line(number, custom_id, None, failure))
        succeeding.append(succeeding[-1] + (lines[-1].request is not None))
    return Plan(tuple(lines), (), tuple(succeeding), len(lines))
