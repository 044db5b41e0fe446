"""The provider's Files and Batch API over httpx, as OpenAI-compatible providers serve it.

A batch job is a JSONL file of requests uploaded to ``/files`` (purpose ``batch``), a batch
created from it at ``/batches`` for ``/v1/embeddings`` within a 24-hour window, and, once it
ends, an output file and an error file whose lines carry each request's ``custom_id``. Every
call here is retried like a model call (classified, Retry-After honoured); none of them is
billed: only the lines a batch completes are.

A submission names its file and its batch's metadata after itself, so that a worker killed
between the upload, the batch's creation and the ledger's record of them finds them again
(:meth:`BatchApi.find_file`, :meth:`BatchApi.find_batch`) instead of sending them twice.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from replayable.models.http import Gate, HttpModelClient, parse_json, read_within
from replayable.retry import ErrorKind, ItemError

# What one batch may hold, at OpenAI: requests, embedding inputs across them, file bytes.
MAX_BATCH_REQUESTS = 50_000
MAX_BATCH_INPUTS = 50_000
MAX_BATCH_BYTES = 200 * 10**6
# A batch ends in one of these; until then it is waited for.
FINISHED = frozenset({"completed", "failed", "expired", "cancelled"})
# A file read whole (:meth:`BatchApi.content`) is at most this large.
RESULT_LIMIT = 2 * 2**30
# Result files are read line by line (:meth:`BatchApi.result_lines`); one line, a request's
# vectors (at most 2,048 inputs of 3,072 dimensions as JSON), is at most this large.
LINE_LIMIT = 256 * 2**20
METADATA_KEY = "replayable_submission"
ENDPOINT = "/v1/embeddings"


@dataclass(frozen=True)
class BatchJob:
    """A batch as the provider describes it: its id, status, and result files."""

    id: str
    status: str
    output_file_id: str | None
    error_file_id: str | None
    submission: str | None
    counts: Mapping[str, int]
    errors: str = ""  # why a batch that failed validation failed, as the provider says

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    @classmethod
    def of(cls, payload: object) -> BatchJob:
        try:
            assert isinstance(payload, dict)
            metadata = payload.get("metadata") or {}
            return cls(
                id=str(payload["id"]),
                status=str(payload["status"]),
                output_file_id=payload.get("output_file_id") or None,
                error_file_id=payload.get("error_file_id") or None,
                submission=metadata.get(METADATA_KEY) if isinstance(metadata, dict) else None,
                counts=dict(payload.get("request_counts") or {}),
                errors="; ".join(
                    str(e.get("message"))
                    for e in ((payload.get("errors") or {}).get("data") or [])[:3]
                ),
            )
        except (AssertionError, KeyError, TypeError) as exc:
            raise ItemError(
                "bad_response", f"unreadable batch object: {exc!r}", ErrorKind.RETRYABLE
            ) from exc


FILE_PREFIX, FILE_SUFFIX = "replayable-", ".jsonl"


def file_name(submission: str) -> str:
    """The name of a submission's input file at the provider."""
    return f"{FILE_PREFIX}{submission}{FILE_SUFFIX}"


def submission_of(name: str) -> str | None:
    """The submission a provider file of ours was named after (:func:`file_name`), or None
    for a file that is not ours."""
    if not (name.startswith(FILE_PREFIX) and name.endswith(FILE_SUFFIX)):
        return None
    return name.removeprefix(FILE_PREFIX).removesuffix(FILE_SUFFIX)


class BatchApi(HttpModelClient):
    """The Files and Batch API of the model connection's endpoint (see the module doc).

    :param gate: taken around every call, each retry included: the shared budget's rate
        (:meth:`~replayable.budget.RequestBudget.paced`), so that these calls count against
        the requests a second the provider allows (ADR 0149); None: no budget.
    """

    def __init__(self, *, gate: Gate | None = None, **client: Any) -> None:
        super().__init__(**client)
        self.gate = gate

    def upload(self, submission: str, data: bytes) -> str:
        """Upload a submission's lines; return the file id."""

        def send(attempt: int) -> str:
            response = self._http.post(
                "/files",
                data={"purpose": "batch"},
                files={"file": (file_name(submission), data, "application/jsonl")},
            )
            return str(self._json(response)["id"])

        return self._call(send, gate=self.gate, describe=f"upload {submission}")

    def find_file(self, submission: str) -> str | None:
        """The id of a file a submission uploaded before, if the provider has one."""
        wanted = file_name(submission)
        for item in self._list("/files", {"purpose": "batch"}):
            if item.get("filename") == wanted:
                return str(item["id"])
        return None

    def create(self, submission: str, file_id: str) -> BatchJob:
        body = {
            "input_file_id": file_id,
            "endpoint": ENDPOINT,
            "completion_window": "24h",
            "metadata": {METADATA_KEY: submission},
        }
        return self._call(
            lambda attempt: BatchJob.of(self._json(self._http.post("/batches", json=body))),
            gate=self.gate,
            describe=f"create batch {submission}",
        )

    def find_batch(self, submission: str, since: float) -> BatchJob | None:
        """A batch created for ``submission`` (created at or after ``since``, Unix s)."""
        for item in self._list("/batches", {"limit": "100"}, newer_than=since):
            job = BatchJob.of(item)
            if job.submission == submission:
                return job
        return None

    def get(self, batch_id: str) -> BatchJob:
        return self._call(
            lambda attempt: BatchJob.of(self._json(self._http.get(f"/batches/{batch_id}"))),
            gate=self.gate,
            describe=f"read batch {batch_id}",
        )

    @contextlib.contextmanager
    def result_lines(self, file_id: str) -> Iterator[Iterator[str]]:
        """The lines of a result file, read as they arrive (a full-size batch's results
        are about a gigabyte: they are never held whole). Opening the file is retried
        like any call; a line longer than :data:`LINE_LIMIT` is ``bad_response``."""

        def open_file(attempt: int) -> httpx.Response:
            request = self._http.build_request("GET", f"/files/{file_id}/content")
            response = self._http.send(request, stream=True)
            if not response.is_success:
                try:
                    content = read_within(response, float("inf"), 2**20)
                finally:
                    response.close()
                _raise_for_status(response, content)
            return response

        response = self._call(open_file, gate=self.gate, describe=f"read file {file_id}")
        try:
            yield _bounded_lines(response.iter_lines(), file_id)
        finally:
            response.close()

    def content(self, file_id: str) -> bytes:
        def send(attempt: int) -> bytes:
            with self._http.stream("GET", f"/files/{file_id}/content") as response:
                data = read_within(response, float("inf"), RESULT_LIMIT)
            _raise_for_status(response, data)
            return data

        return self._call(send, gate=self.gate, describe=f"read file {file_id}")

    def delete_file(self, file_id: str) -> None:
        def send(attempt: int) -> None:
            response = self._http.delete(f"/files/{file_id}")
            if response.status_code != 404:  # already gone: what a delete wants
                self._json(response)

        self._call(send, gate=self.gate, describe=f"delete file {file_id}")

    def files(self, purpose: str | None = "batch") -> Iterator[dict[str, Any]]:
        """Every file of ``purpose`` the provider keeps (None: of every purpose, batch
        results included), for the orphan sweep."""
        return self._list("/files", {"purpose": purpose} if purpose else {})

    def _list(
        self, path: str, params: dict[str, str], newer_than: float | None = None
    ) -> Iterator[dict[str, Any]]:
        """Page through a list endpoint, newest first; stop at items older than ``newer_than``."""
        after: str | None = None
        while True:
            query = {**params, **({"after": after} if after else {})}

            def read(attempt: int, q: dict[str, str] = query) -> dict[str, Any]:
                return self._json(self._http.get(path, params=q))

            page = self._call(read, gate=self.gate, describe=f"list {path}")
            data = page.get("data") or []
            for item in data:
                if newer_than is not None and float(item.get("created_at") or 0) < newer_than:
                    return
                yield item
            if not page.get("has_more") or not data:
                return
            after = str(data[-1]["id"])

    @staticmethod
    def _json(response: httpx.Response) -> dict[str, Any]:
        _raise_for_status(response, response.content)
        payload = parse_json(response.content)
        if not isinstance(payload, dict):
            raise ItemError("bad_response", "expected a JSON object", ErrorKind.RETRYABLE)
        return payload


def _bounded_lines(lines: Iterator[str], file_id: str) -> Iterator[str]:
    for line in lines:
        if len(line) > LINE_LIMIT:
            raise ItemError(
                "bad_response",
                f"a line of the provider's result file {file_id} is over {LINE_LIMIT} bytes",
                ErrorKind.RETRYABLE,
            )
        yield line


def _raise_for_status(response: httpx.Response, content: bytes) -> None:
    """Raise for an error answer. A 4xx other than auth and rate limits is retryable here:
    these calls carry no document's input (a line's own error is in the error file), so
    what they refuse is no document's fault, and the items' attempts bound the retries."""
    if response.is_success:
        return
    # The body's error message says what the provider refused; it never holds the key.
    try:
        message = json.loads(content)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = content[:200].decode(errors="replace")
    status = response.status_code
    path = response.request.url.path
    if status in (404, 405) and path.endswith(("/files", "/batches")):
        # A provider without the Files or Batch API: every item would fail alike, so the
        # batch stops without spending their attempts, saying what to change.
        raise ItemError(
            "batch_api_unavailable",
            f'the provider has no Batch API ({status} on {path}): use embed_mode "sync" with it',
            ErrorKind.SYSTEMIC,
        )
    if 400 <= status < 500 and status not in (401, 403, 408, 429):
        raise ItemError(
            f"http_{status}",
            f"the provider's batch API refused {response.request.url.path}: {message}",
            ErrorKind.RETRYABLE,
        )
    raise httpx.HTTPStatusError(
        f"{response.status_code} from {response.request.url.path}: {message}",
        request=response.request,
        response=response,
    )
