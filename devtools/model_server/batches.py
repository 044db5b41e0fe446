"""OpenAI's Files and Batch API, for embeddings: uploaded JSONL files, batches, their results.

A client uploads a JSONL file of embeddings requests, creates a batch that runs them, polls
the batch and downloads its output file and its error file, as with OpenAI's Batch API.
Everything is kept in memory until ``POST /stats/reset``, which drops every file and
batch. The endpoints need the API key as ``/v1/embeddings`` does (401 without it); errors
are in OpenAI's shape, a 400 naming the bad field. The ``/v1`` faults of
:mod:`~devtools.model_server.faults` (statuses, latency, hangs, lost responses, the
concurrency and token limits) do not apply here, and these requests are not counted among
``/v1``'s ``requests``; the ``batch_*`` keys and ``lose_upload_responses`` do.

Files:

- ``POST /v1/files``: ``multipart/form-data`` with the fields ``purpose``, which must be
  ``"batch"``, and ``file``, the JSONL (a file field, as OpenAI's SDK and httpx send it).
  Answered with a file object ``{"id": "file-…", "object": "file", "bytes", "created_at",
  "filename", "purpose", "status": "processed", "expires_at": null, "status_details":
  null}``. A file larger than :data:`FILE_MAX_BYTES` (200 MB, OpenAI's limit) gets 413, and
  so does one that would take the bytes of all stored files (uploads and batch results)
  past ``files_max_total_bytes`` (at most :data:`FILES_MAX_TOTAL_BYTES`): delete files to
  make room. Lines are checked when a batch is created, as OpenAI does, not here;
- ``GET /v1/files``: ``{"object": "list", "data": [file objects], "first_id", "last_id",
  "has_more"}``, newest first; ``?purpose=batch`` lists uploads only (batch results have
  purpose ``"batch_output"``), ``?order=asc`` oldest first, ``?limit=N`` (1 to 10000, the
  default) and ``?after=ID`` page through them;
- ``GET /v1/files/ID``: the file object; 404 for an unknown or deleted file;
- ``GET /v1/files/ID/content``: the file's bytes, as ``application/octet-stream``;
- ``DELETE /v1/files/ID``: ``{"id", "object": "file", "deleted": true}``; a batch that read
  the file is not affected.

Batches:

- ``POST /v1/batches``: ``{"input_file_id", "endpoint": "/v1/embeddings",
  "completion_window": "24h", "metadata"}`` (metadata optional: at most 16 string keys of
  up to 64 characters, with string values of up to 512). Answered with the batch object
  ``{"id": "batch_…", "object": "batch", "endpoint", "errors", "input_file_id",
  "completion_window", "status", "output_file_id", "error_file_id", "created_at",
  "in_progress_at", "expires_at", "finalizing_at", "completed_at", "failed_at",
  "expired_at", "cancelling_at", "cancelled_at", "request_counts": {"total", "completed",
  "failed"}, "metadata"}``, timestamps in Unix seconds, null until reached. An unknown
  ``input_file_id`` gets 404, a batch result file as input 400;
- ``GET /v1/batches/ID``; ``GET /v1/batches``: ``{"object": "list", "data", "first_id",
  "last_id", "has_more"}``, newest first, ``?limit=N`` (1 to 100, default 20) and
  ``?after=ID``;
- ``POST /v1/batches/ID/cancel``: a ``validating`` or ``in_progress`` batch turns
  ``cancelling``, then ``cancelled``; cancelling one that is already is a no-op, and one in
  any other status gets 409 ``batch_not_cancellable``.

Each input line is ``{"custom_id": str, "method": "POST", "url": "/v1/embeddings", "body":
{embeddings request}}``. A file with any bad line makes the batch ``failed`` once validated,
with ``errors: {"object": "list", "data": [{"code", "message", "param", "line"}]}`` (line
numbers from 1; at most :data:`MAX_REPORTED_LINE_ERRORS` bad lines are listed) and no
result files. The codes: ``empty_file``; ``invalid_json_line`` (not a JSON object);
``missing_required_parameter`` and ``invalid_value`` (``param`` names the field:
``custom_id`` a non-empty string, ``method`` ``"POST"``, ``body`` an object);
``url_mismatch`` (``url`` is not the batch's endpoint); ``model_mismatch`` (a
``body.model`` other than the first line's: one model per batch); ``duplicate_custom_id``;
``too_many_tasks``, more than ``batch_max_requests`` lines, and ``too_many_inputs``, more
than ``batch_max_inputs`` embedding inputs over all lines (both default to OpenAI's
50,000), each naming the first line past the limit. The rest of a body is checked as
``POST /v1/embeddings`` checks it, line by line: a body that endpoint would refuse is not
a validation error but a line that fails with that endpoint's 400, in the error file.

A batch's life is set by the faults in force when it is created, ``D`` being its
``batch_delay_s``, and is computed from the clock whenever it is looked at: ``validating``
for the first quarter of ``D`` (then ``failed`` if a line was bad), ``in_progress`` until
three quarters, ``finalizing`` until ``D``, then ``completed``. While it is in progress the
lines are done in file order at an even pace, as ``request_counts`` shows (``total`` is 0
while validating and once failed). A cancel takes a quarter of ``D`` (``cancelling``)
before it is ``cancelled``; the lines done when it came (or ``batch_cancel_after_fraction``
of them) are kept. With ``batch_expire_after_fraction`` the batch is ``in_progress`` until
``D`` (its ``expires_at``) and then ``expired``, with that share of its lines done.

Results, written when the batch ends: the output file (purpose ``"batch_output"``) has a
line ``{"id": "batch_req_…", "custom_id", "response": {"status_code": 200, "request_id":
"req_…", "body"}, "error": null}`` per line done, ``body`` being exactly what ``POST
/v1/embeddings`` answers for that line's body (same vectors, same ``usage``); the error file
has ``{"id", "custom_id", "response": {"status_code", "request_id", "body": {"error":
{...}}}, "error": null}`` for a line done that failed (its body refused, or an input
matched by ``batch_fail_inputs_containing`` or ``fail_inputs_containing``), and, for an
expired batch, ``{"id", "custom_id", "response": null, "error": {"code": "batch_expired",
"message"}}`` for every line not done. Lines a cancel left undone are in neither file. Each
file is only made if it has lines (``output_file_id`` or ``error_file_id`` stays null
otherwise). ``request_counts.completed`` counts the output lines, ``failed`` the lines done
that failed; expired and undone lines are in neither count. A batch that ends ``completed``
under ``batch_lose_lines_rate`` leaves the lines it lost out of both files, though it
charges them and counts them as completed.

Charges: the lines in the output file, when the batch ends, and the lines a completed
batch lost, and only those, go into ``/stats``'s batch counters
(:mod:`~devtools.model_server.stats`), never the synchronous ones.
"""

from __future__ import annotations

import email.parser
import email.policy
import json
import math
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final, cast
from urllib.parse import parse_qs

from devtools.model_server.errors import HttpError, error_body
from devtools.model_server.stats import charge_key
from devtools.model_server.vectors import (
    EmbeddingsRequest,
    embeddings_response,
    parse_embeddings_request,
    usage_tokens,
)

if TYPE_CHECKING:
    from devtools.model_server.faults import FaultConfig
    from devtools.model_server.stats import Stats

FILE_MAX_BYTES = 200 * 1024 * 1024
FILES_MAX_TOTAL_BYTES = 512 * 1024 * 1024
# An upload's body: the file and the rest of the form around it.
UPLOAD_MAX_BODY_BYTES = FILE_MAX_BYTES + 1024 * 1024
BATCH_MAX_REQUESTS = 50_000
BATCH_MAX_INPUTS = 50_000
BATCH_ENDPOINT: Final = "/v1/embeddings"
COMPLETION_WINDOW: Final = "24h"
COMPLETION_WINDOW_S = 24 * 3600
MAX_REPORTED_LINE_ERRORS = 100
METADATA_MAX_PAIRS = 16
METADATA_KEY_MAX_CHARS = 64
METADATA_VALUE_MAX_CHARS = 512
FILES_LIST_MAX = 10_000
BATCHES_LIST_DEFAULT = 20
BATCHES_LIST_MAX = 100

VALIDATING: Final = "validating"
FAILED: Final = "failed"
IN_PROGRESS: Final = "in_progress"
FINALIZING: Final = "finalizing"
COMPLETED: Final = "completed"
EXPIRED: Final = "expired"
CANCELLING: Final = "cancelling"
CANCELLED: Final = "cancelled"

UPLOAD_PURPOSE: Final = "batch"
OUTPUT_PURPOSE: Final = "batch_output"

# Where the phases of a batch end, as shares of its batch_delay_s.
_VALIDATED = 0.25
_PROCESSED = 0.75
_CANCELLING = 0.25

_EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."

_PATH_ROOTS = ("/v1/files", "/v1/batches")
_ID = r"([A-Za-z0-9_-]{1,200})"


def is_files_or_batches_path(path: str) -> bool:
    """Whether ``path`` is one of this module's endpoints (or an unknown one below them)."""
    return any(path == root or path.startswith(root + "/") for root in _PATH_ROOTS)


def new_id(prefix: str) -> str:
    """A fresh object id, e.g. ``file-…`` or ``batch_…``."""
    return prefix + secrets.token_hex(12)


def _json(payload: object) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def _share_of(count: int, share: float) -> int:
    """``share`` of ``count`` lines, rounded down (0.6 of 10 is 6, not 5 from 5.9999…)."""
    return max(0, min(count, math.floor(share * count + 1e-9)))


@dataclass(frozen=True)
class StoredFile:
    """An uploaded file or a batch's output or error file, with its bytes."""

    id: str
    filename: str
    purpose: str
    created_at: int
    data: bytes

    def to_json(self) -> dict[str, Any]:
        """The OpenAI file object."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.data),
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "expires_at": None,
            "status_details": None,
        }


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
            request = parse_embeddings_request(_json(body), dim)
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


@dataclass
class Batch:
    """A batch and the faults it runs under; its status is computed from the clock.

    ``started`` and ``cancel_requested`` are ``time.monotonic()`` readings, ``created_at``
    the wall clock at ``started``. Changed only under the :class:`BatchStore` lock.
    """

    id: str
    input_file_id: str
    completion_window: str
    metadata: dict[str, str] | None
    created_at: float
    started: float
    delay_s: float
    plan: Plan
    expire_fraction: float | None
    cancel_fraction: float | None
    # Indexes of the plan's lines a completed batch charges but writes to no file.
    lost_lines: frozenset[int] = frozenset()
    cancel_requested: float | None = None
    done_when_cancelled: int = 0
    output_file_id: str | None = None
    error_file_id: str | None = None
    finished: bool = False

    def _planned(self) -> int:
        """How many lines are done by the end, unless a cancel stops it first."""
        if self.expire_fraction is None:
            return self.plan.total
        return _share_of(self.plan.total, self.expire_fraction)

    def status(self, now: float) -> str:
        """The status at monotonic time ``now``."""
        delay = self.delay_s
        if self.cancel_requested is not None:
            ends = self.cancel_requested + delay * _CANCELLING
            return CANCELLED if now >= ends else CANCELLING
        elapsed = now - self.started
        if elapsed < delay * _VALIDATED:
            return VALIDATING
        if self.plan.errors:
            return FAILED
        if self.expire_fraction is not None:
            return IN_PROGRESS if elapsed < delay else EXPIRED
        if elapsed < delay * _PROCESSED:
            return IN_PROGRESS
        return FINALIZING if elapsed < delay else COMPLETED

    def processed(self, now: float, status: str) -> int:
        """How many lines, first in file order, are done at ``now``."""
        if status in (VALIDATING, FAILED):
            return 0
        if status in (CANCELLING, CANCELLED):
            return self.done_when_cancelled
        planned = self._planned()
        if status != IN_PROGRESS:
            return planned
        start = self.delay_s * _VALIDATED
        end = self.delay_s * (1.0 if self.expire_fraction is not None else _PROCESSED)
        share = (now - self.started - start) / (end - start) if end > start else 1.0
        return _share_of(planned, share)

    def cancel(self, now: float) -> None:
        """Cancel the batch at ``now``; raise a 409 :class:`HttpError` if it is too late."""
        status = self.status(now)
        if status in (CANCELLING, CANCELLED):
            return
        if status not in (VALIDATING, IN_PROGRESS):
            raise HttpError(
                409,
                f"cannot cancel batch {self.id}: its status is {status!r}; only a "
                "validating or in_progress batch can be cancelled",
                code="batch_not_cancellable",
            )
        if self.plan.errors:
            done = 0
        elif self.cancel_fraction is not None:
            done = min(self._planned(), _share_of(self.plan.total, self.cancel_fraction))
        else:
            done = self.processed(now, status)
        self.cancel_requested = now
        self.done_when_cancelled = done

    def to_json(self, now: float) -> dict[str, Any]:
        """The OpenAI batch object at monotonic time ``now``."""
        status = self.status(now)
        delay = self.delay_s

        def at(offset: float) -> int:
            return int(self.created_at + offset)

        cancel_offset = (
            None if self.cancel_requested is None else self.cancel_requested - self.started
        )
        validated = not self.plan.errors and (
            now - self.started >= delay * _VALIDATED
            and (cancel_offset is None or cancel_offset >= delay * _VALIDATED)
        )
        done = self.processed(now, status)
        succeeded = self.plan.succeeding[done]
        counting = status not in (VALIDATING, FAILED)
        expires = delay if self.expire_fraction is not None else COMPLETION_WINDOW_S
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": BATCH_ENDPOINT,
            "errors": (
                {"object": "list", "data": list(self.plan.errors)} if status == FAILED else None
            ),
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": at(0),
            "in_progress_at": at(delay * _VALIDATED) if validated else None,
            "expires_at": at(expires),
            "finalizing_at": at(delay * _PROCESSED) if status in (FINALIZING, COMPLETED) else None,
            "completed_at": at(delay) if status == COMPLETED else None,
            "failed_at": at(delay * _VALIDATED) if status == FAILED else None,
            "expired_at": at(delay) if status == EXPIRED else None,
            "cancelling_at": None if cancel_offset is None else at(cancel_offset),
            "cancelled_at": (
                at(cast(float, cancel_offset) + delay * _CANCELLING)
                if status == CANCELLED
                else None
            ),
            "request_counts": {
                "total": self.plan.total if counting else 0,
                "completed": succeeded if counting else 0,
                "failed": done - succeeded if counting else 0,
            },
            "metadata": self.metadata,
        }


def _result_line(custom_id: str, status: int, body: object) -> bytes:
    return _json(
        {
            "id": new_id("batch_req_"),
            "custom_id": custom_id,
            "response": {"status_code": status, "request_id": new_id("req_"), "body": body},
            "error": None,
        }
    )


def _expired_line(custom_id: str) -> bytes:
    return _json(
        {
            "id": new_id("batch_req_"),
            "custom_id": custom_id,
            "response": None,
            "error": {"code": "batch_expired", "message": _EXPIRED_MESSAGE},
        }
    )


def parse_multipart(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """The fields of a ``multipart/form-data`` body: name -> (filename or None, bytes).

    The first field of a name wins. Raise a 400 :class:`HttpError` for another body.
    """
    if content_type.split(";", 1)[0].strip().lower() != "multipart/form-data":
        raise HttpError(
            400,
            "the request body must be multipart/form-data with the fields 'purpose' and 'file'",
        )
    head = b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n"
    parser = email.parser.BytesParser(policy=email.policy.HTTP)
    message = parser.parsebytes(head + body)
    if not message.is_multipart():
        raise HttpError(400, "the multipart/form-data body has no boundary or no parts")
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str) or name in fields:
            continue
        payload = part.get_payload(decode=True)
        fields[name] = (part.get_filename(), payload if isinstance(payload, bytes) else b"")
    return fields


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise HttpError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise HttpError(400, "request body must be a JSON object")
    return payload


def _metadata(raw: object) -> dict[str, str] | None:
    """A batch's ``metadata``, checked as OpenAI checks it; None when it has none."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or len(raw) > METADATA_MAX_PAIRS:
        raise HttpError(
            400, f"'metadata' must be an object of at most {METADATA_MAX_PAIRS} pairs, or null"
        )
    for key, value in raw.items():
        if len(key) > METADATA_KEY_MAX_CHARS:
            raise HttpError(
                400, f"'metadata' keys must be at most {METADATA_KEY_MAX_CHARS} characters"
            )
        if not isinstance(value, str) or len(value) > METADATA_VALUE_MAX_CHARS:
            raise HttpError(
                400,
                f"'metadata[{key}]' must be a string of at most {METADATA_VALUE_MAX_CHARS} "
                "characters",
            )
    return dict(raw)


def _page(
    items: Sequence[Mapping[str, Any]], query: Mapping[str, str], default: int, most: int
) -> dict[str, Any]:
    """A list object of ``items`` (in listing order) after ``?after=ID``, ``?limit`` long."""
    raw_limit = query.get("limit", str(default))
    try:
        limit = int(raw_limit)
    except ValueError:
        limit = 0
    if not 1 <= limit <= most:
        raise HttpError(400, f"'limit' must be an integer between 1 and {most}")
    start = 0
    after = query.get("after")
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise HttpError(400, f"'after' must be the id of a listed object, not {after!r}")
        start = ids.index(after) + 1
    data = list(items[start : start + limit])
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": start + limit < len(items),
    }


@dataclass(frozen=True)
class ApiCall:
    """One Files or Batch API request, and what the server serves it under.

    ``lose_upload`` tells, once per stored upload, whether its response is to be lost;
    ``lose_line`` draws, for each succeeding line of a batch being created, whether it is
    lost (``batch_lose_lines_rate``, the rate passed).
    """

    method: str
    path: str
    query: str
    content_type: str
    body: bytes
    config: FaultConfig
    dim: int
    lose_upload: Callable[[], bool]
    lose_line: Callable[[float], bool]


@dataclass(frozen=True)
class Reply:
    """What to answer: a status and a body, or nothing at all when ``lose`` is set."""

    status: int
    body: bytes
    content_type: str = "application/json"
    lose: bool = False


class BatchStore:
    """The stored files and batches, thread-safe; charges and counts go to ``stats``.

    One lock guards the files, the batches and the batch counters they change, so a
    reset cannot come between a batch's results and its charges. A batch's results are
    written by whichever request first finds it ended (``GET /stats`` included), under the
    lock; the stats lock is only ever taken inside this one.
    """

    def __init__(self, stats: Stats) -> None:
        self._stats = stats
        self._lock = threading.Lock()
        self._files: dict[str, StoredFile] = {}
        self._batches: dict[str, Batch] = {}
        self._bytes = 0

    def serve(self, call: ApiCall) -> Reply:
        """Serve a request to one of the Files or Batch endpoints; raise :class:`HttpError`."""
        for pattern, methods in _ROUTES:
            match = pattern.fullmatch(call.path)
            if match is None:
                continue
            route = methods.get(call.method)
            if route is None:
                allow = ", ".join(sorted(methods))
                raise HttpError(405, f"use {allow} on {call.path}", headers={"Allow": allow})
            return route(self, call, *match.groups())
        raise HttpError(404, f"unknown endpoint {call.method} {call.path}")

    def advance(self) -> None:
        """Write the results of every batch that has ended, and charge them."""
        now = time.monotonic()
        with self._lock:
            for batch in self._batches.values():
                self._finish(batch, now)

    def reset(self) -> None:
        """Drop every file and batch and zero ``stats``, at once."""
        with self._lock:
            self._files.clear()
            self._batches.clear()
            self._bytes = 0
            self._stats.reset()

    def _add_file(self, filename: str, purpose: str, data: bytes) -> StoredFile:
        stored = StoredFile(new_id("file-"), filename, purpose, int(time.time()), data)
        self._files[stored.id] = stored
        self._bytes += len(data)
        self._stats.count_file_stored()
        return stored

    def _file(self, file_id: str) -> StoredFile:
        stored = self._files.get(file_id)
        if stored is None:
            raise HttpError(404, f"No such File object: {file_id}")
        return stored

    def _batch(self, batch_id: str) -> Batch:
        batch = self._batches.get(batch_id)
        if batch is None:
            raise HttpError(404, f"No such Batch object: {batch_id}")
        return batch

    def _finish(self, batch: Batch, now: float) -> None:
        """Write an ended batch's output and error files and charge its lines, once."""
        status = batch.status(now)
        if batch.finished or status not in (COMPLETED, EXPIRED, CANCELLED, FAILED):
            return
        batch.finished = True
        done = batch.processed(now, status)
        outputs: list[bytes] = []
        failures: list[bytes] = []
        charges: list[tuple[str, int, int]] = []
        charge_keys: list[str] = []
        lost = 0
        for index, line in enumerate(batch.plan.lines):
            if index >= done:
                if status == EXPIRED:
                    failures.append(_expired_line(line.custom_id))
                continue
            if line.request is not None:
                if status == COMPLETED and index in batch.lost_lines:
                    lost += 1  # run and charged, and in neither file
                else:
                    response = embeddings_response(line.request)
                    outputs.append(_result_line(line.custom_id, 200, response))
                inputs = line.request.inputs
                charges.append((line.custom_id, len(inputs), usage_tokens(inputs)))
                charge_keys += [charge_key(line.request.model, line.request.dim, t) for t in inputs]
            elif line.error is not None:
                error = line.error
                body = error_body(error.status, error.message, error.code)
                failures.append(_result_line(line.custom_id, error.status, body))
        if outputs:
            data = b"\n".join(outputs) + b"\n"
            name = f"{batch.id}_output.jsonl"
            batch.output_file_id = self._add_file(name, OUTPUT_PURPOSE, data).id
        if failures:
            data = b"\n".join(failures) + b"\n"
            name = f"{batch.id}_error.jsonl"
            batch.error_file_id = self._add_file(name, OUTPUT_PURPOSE, data).id
        self._stats.charge_batch_lines(charges, charge_keys, lost=lost)
        # Only the counts are needed from now on.
        batch.plan = replace(batch.plan, lines=())

    def _upload(self, call: ApiCall) -> Reply:
        fields = parse_multipart(call.content_type, call.body)
        purpose = fields.get("purpose")
        if purpose is None:
            raise HttpError(400, "'purpose' is required: use 'batch'")
        if purpose[1].decode("utf-8", "replace").strip() != UPLOAD_PURPOSE:
            raise HttpError(400, "'purpose' must be 'batch', the only purpose this server keeps")
        upload = fields.get("file")
        if upload is None:
            raise HttpError(400, "'file' is required: the JSONL file, as a multipart file field")
        filename, data = upload
        if len(data) > FILE_MAX_BYTES:
            raise HttpError(413, f"'file' is larger than {FILE_MAX_BYTES} bytes")
        with self._lock:
            cap = call.config.files_max_total_bytes
            if self._bytes + len(data) > cap:
                raise HttpError(
                    413,
                    f"file storage is full: {self._bytes} bytes stored, and 'file' has "
                    f"{len(data)} more than the {cap} allowed; delete files first",
                    code="storage_full",
                )
            stored = self._add_file(filename or "file", UPLOAD_PURPOSE, data)
            lose = call.lose_upload()
            self._stats.count_upload(lost=lose)
        return Reply(200, _json(stored.to_json()), lose=lose)

    def _list_files(self, call: ApiCall) -> Reply:
        query = {name: values[0] for name, values in parse_qs(call.query).items()}
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise HttpError(400, "'order' must be 'asc' or 'desc'")
        purpose = query.get("purpose")
        self.advance()
        with self._lock:
            files = [
                stored.to_json()
                for stored in self._files.values()
                if purpose is None or stored.purpose == purpose
            ]
        if order == "desc":
            files.reverse()
        return Reply(200, _json(_page(files, query, FILES_LIST_MAX, FILES_LIST_MAX)))

    def _get_file(self, call: ApiCall, file_id: str) -> Reply:
        self.advance()
        with self._lock:
            return Reply(200, _json(self._file(file_id).to_json()))

    def _file_content(self, call: ApiCall, file_id: str) -> Reply:
        self.advance()
        with self._lock:
            data = self._file(file_id).data
        return Reply(200, data, content_type="application/octet-stream")

    def _delete_file(self, call: ApiCall, file_id: str) -> Reply:
        with self._lock:
            stored = self._file(file_id)
            del self._files[file_id]
            self._bytes -= len(stored.data)
            self._stats.count_file_deleted()
        return Reply(200, _json({"id": file_id, "object": "file", "deleted": True}))

    def _create_batch(self, call: ApiCall) -> Reply:
        payload = _json_object(call.body)
        file_id = payload.get("input_file_id")
        if not isinstance(file_id, str) or not file_id:
            raise HttpError(400, "'input_file_id' must be the id of an uploaded file")
        if payload.get("endpoint") != BATCH_ENDPOINT:
            raise HttpError(
                400, f"'endpoint' must be {BATCH_ENDPOINT!r}, the only one batches run here"
            )
        if payload.get("completion_window") != COMPLETION_WINDOW:
            raise HttpError(400, f"'completion_window' must be {COMPLETION_WINDOW!r}")
        metadata = _metadata(payload.get("metadata"))
        with self._lock:
            stored = self._files.get(file_id)
            if stored is None:
                raise HttpError(404, f"No such File object: {file_id} ('input_file_id')")
            if stored.purpose != UPLOAD_PURPOSE:
                raise HttpError(
                    400,
                    f"'input_file_id' {file_id} has purpose {stored.purpose!r}; a batch "
                    f"reads a file uploaded with purpose {UPLOAD_PURPOSE!r}",
                )
        config = call.config
        plan = plan_lines(stored.data, config, call.dim)
        rate = config.batch_lose_lines_rate
        lost_lines = frozenset(
            index
            for index, line in enumerate(plan.lines)
            if line.request is not None and call.lose_line(rate)
        )
        batch = Batch(
            id=new_id("batch_"),
            input_file_id=file_id,
            completion_window=COMPLETION_WINDOW,
            metadata=metadata,
            created_at=time.time(),
            started=time.monotonic(),
            delay_s=config.batch_delay_s,
            plan=plan,
            expire_fraction=config.batch_expire_after_fraction,
            cancel_fraction=config.batch_cancel_after_fraction,
            lost_lines=lost_lines,
        )
        with self._lock:
            self._batches[batch.id] = batch
            self._stats.count_batch_created()
            now = time.monotonic()
            self._finish(batch, now)
            return Reply(200, _json(batch.to_json(now)))

    def _list_batches(self, call: ApiCall) -> Reply:
        query = {name: values[0] for name, values in parse_qs(call.query).items()}
        self.advance()
        now = time.monotonic()
        with self._lock:
            batches = [batch.to_json(now) for batch in reversed(self._batches.values())]
        return Reply(200, _json(_page(batches, query, BATCHES_LIST_DEFAULT, BATCHES_LIST_MAX)))

    def _get_batch(self, call: ApiCall, batch_id: str) -> Reply:
        now = time.monotonic()
        with self._lock:
            batch = self._batch(batch_id)
            self._finish(batch, now)
            return Reply(200, _json(batch.to_json(now)))

    def _cancel_batch(self, call: ApiCall, batch_id: str) -> Reply:
        now = time.monotonic()
        with self._lock:
            batch = self._batch(batch_id)
            batch.cancel(now)
            self._finish(batch, now)
            return Reply(200, _json(batch.to_json(now)))


_Route = Callable[..., Reply]
_ROUTES: tuple[tuple[re.Pattern[str], dict[str, _Route]], ...] = (
    (re.compile(r"/v1/files"), {"GET": BatchStore._list_files, "POST": BatchStore._upload}),
    (
        re.compile(rf"/v1/files/{_ID}"),
        {"GET": BatchStore._get_file, "DELETE": BatchStore._delete_file},
    ),
    (re.compile(rf"/v1/files/{_ID}/content"), {"GET": BatchStore._file_content}),
    (
        re.compile(r"/v1/batches"),
        {"GET": BatchStore._list_batches, "POST": BatchStore._create_batch},
    ),
    (re.compile(rf"/v1/batches/{_ID}"), {"GET": BatchStore._get_batch}),
    (re.compile(rf"/v1/batches/{_ID}/cancel"), {"POST": BatchStore._cancel_batch}),
)
