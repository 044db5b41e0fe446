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
  null}``. A file larger than :data:`~.limits.FILE_MAX_BYTES` (200 MB, OpenAI's limit)
  gets 413, and so does one that would take the bytes of all stored files (uploads and
  batch results) past ``files_max_total_bytes`` (at most
  :data:`~.limits.FILES_MAX_TOTAL_BYTES`): delete files to make room. Lines are checked
  when a batch is created, as OpenAI does, not here;
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
numbers from 1; at most :data:`~.batch_lines.MAX_REPORTED_LINE_ERRORS` bad lines are
listed) and no result files. The codes: ``empty_file``; ``invalid_json_line`` (not a JSON object);
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

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qs

from devtools.model_server.api_shapes import metadata, new_id, page, parse_multipart
from devtools.model_server.api_shapes import to_bytes as _json
from devtools.model_server.batch_life import COMPLETED, ENDED, EXPIRED, Batch
from devtools.model_server.batch_life import expired_line as _expired_line
from devtools.model_server.batch_life import result_line as _result_line
from devtools.model_server.batch_lines import BATCH_ENDPOINT, plan_lines
from devtools.model_server.errors import HttpError, error_body, json_object
from devtools.model_server.limits import FILE_MAX_BYTES
from devtools.model_server.stats import charge_key
from devtools.model_server.vectors import embeddings_response, usage_tokens

if TYPE_CHECKING:
    from devtools.model_server.faults import FaultConfig
    from devtools.model_server.stats import Stats

COMPLETION_WINDOW: Final = "24h"
FILES_LIST_MAX = 10_000
BATCHES_LIST_DEFAULT = 20
BATCHES_LIST_MAX = 100

UPLOAD_PURPOSE: Final = "batch"
OUTPUT_PURPOSE: Final = "batch_output"

_PATH_ROOTS = ("/v1/files", "/v1/batches")
_ID = r"([A-Za-z0-9_-]{1,200})"


def is_files_or_batches_path(path: str) -> bool:
    """Whether ``path`` is one of this module's endpoints (or an unknown one below them)."""
    return any(path == root or path.startswith(root + "/") for root in _PATH_ROOTS)


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
        if batch.finished or status not in ENDED:
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
        return Reply(200, _json(page(files, query, FILES_LIST_MAX, FILES_LIST_MAX)))

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
        payload = json_object(call.body)
        file_id = payload.get("input_file_id")
        if not isinstance(file_id, str) or not file_id:
            raise HttpError(400, "'input_file_id' must be the id of an uploaded file")
        if payload.get("endpoint") != BATCH_ENDPOINT:
            raise HttpError(
                400, f"'endpoint' must be {BATCH_ENDPOINT!r}, the only one batches run here"
            )
        if payload.get("completion_window") != COMPLETION_WINDOW:
            raise HttpError(400, f"'completion_window' must be {COMPLETION_WINDOW!r}")
        found_metadata = metadata(payload.get("metadata"))
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
            metadata=found_metadata,
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
        return Reply(200, _json(page(batches, query, BATCHES_LIST_DEFAULT, BATCHES_LIST_MAX)))

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
