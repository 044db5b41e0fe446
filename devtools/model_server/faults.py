"""The fault configuration: what the server injects, parsed and checked from JSON.

Fault config keys (``PUT /faults`` with a JSON object; unknown keys and bad values get 400
naming the key; every key is optional and the default injects nothing). The ``/v1`` faults
apply alike to ``POST /v1/embeddings`` and ``POST /v1/chat/completions``, which share the
draws, the concurrency count and the token bucket:

- ``status_rates``: ``{"503": 0.3, "429": 0.1}``, the share of ``/v1`` requests failing
  with each status (at most 1 in total);
- ``retry_after``: seconds or an HTTP-date sent as ``Retry-After`` on injected 429 and 503
  responses, webhooks included;
- ``latency_ms``: delay before a ``/v1`` request is handled; an embeddings or chat request
  is delayed after its API key, its body and ``max_tpm`` are checked, so that a provider's
  quick refusals (401, 400, 429 over the token limit) come at once;
- ``hang_rate``, ``hang_s`` (default 600): the share of requests held ``hang_s`` seconds
  (or until the faults are cleared) before they go on;
- ``fail_inputs_containing``: ``{"POISON": 400}``, the status for a request with an input
  containing the substring: an embeddings input, or the content of any chat message (and
  a batch line's input too, see ``batch_fail_inputs_containing``);
- ``chat_refusal_containing``: a non-empty string (null: none): a chat request whose last
  user message contains it is answered 200 with a refusal, as OpenAI refuses:
  ``choices[0].message`` has ``content`` null and ``refusal`` set, ``finish_reason`` is
  ``"stop"``. The refusal is an answer like any other: charged, remembered under its key
  and counted by ``max_tpm`` (its words being the completion tokens);
- ``status_always``: fail every ``/v1`` request with this status;
- ``seed``: reseed the fault draws, so a config gives the same sequence every time;
- ``dedupe`` (default true): replay repeated idempotency keys; false charges every
  repeat, answers no 422, and counts ``would_deduplicate``;
- ``lose_response_rate``: the share of 200 responses that are dropped after the work is
  done: the request is charged (or replayed) and its key remembered as usual, then the
  connection is shut down without a response, so the client sees the server disconnect;
- ``max_concurrency``: answer 429 at once, with ``Retry-After:
  concurrency_retry_after`` (seconds, default 1), to an embeddings or chat request that
  arrives while this many of them are in flight (null: no limit);
- ``max_tpm``: tokens per minute, like a provider's TPM limit (null: no limit). A bucket
  shared by every embeddings and chat request holds up to ``tpm_window_s`` (default 60, at
  most 60) seconds of ``max_tpm`` tokens: a minute's burst, or less for a provider that
  enforces its minute over shorter windows. It starts full whenever the faults are set,
  and refills continuously at ``max_tpm / 60`` a second. A request costs its
  ``usage.total_tokens`` (a chat request: those of the answer it would get, prompt and
  completion), taken from the bucket once ``max_concurrency`` has let it in and its API
  key and body are checked, before the other faults (latency included).
  One the bucket cannot pay for gets 429 ``rate_limit_exceeded`` at once, with
  ``Retry-After``: the seconds, to the millisecond and rounded up, until the bucket holds
  its cost; one larger than the whole bucket gets 429 without ``Retry-After``, since no
  wait makes it fit. A refused request takes nothing and is not charged. A request whose
  ``Idempotency-Key`` is remembered (with ``dedupe`` on) is answered from memory, or
  refused with 422, and costs nothing, so the limit neither refuses it nor takes its
  tokens; a repeat that arrives while the first request with its key is still being served
  cannot be told from a new request yet, so it pays, and gets its tokens back when it is
  answered from memory;
- ``trickle_bytes_per_s``: send 200 bodies at about this rate, in pieces of a tenth of it
  (at least one byte), so from 10 bytes/s up a piece arrives every tenth of a second: a
  per-read timeout does not fire while a deadline on the whole response does (0: at once);
- ``pad_response_bytes``: add a ``"padding"`` field of this many characters to 200
  bodies (at most :data:`MAX_PAD_BYTES`), for a client's response-size cap;
- ``webhook_statuses``: ``[503, 503, 200]``, statuses answered to webhook deliveries one
  per delivery, in order, before they succeed normally; 4xx/5xx fail the delivery, a 2xx
  stores it and is the status it and its replays get. Setting the faults restarts the
  list;
- ``webhook_status_always``: fail every webhook delivery with this status.

The Files and Batch API (:mod:`~devtools.model_server.batches`) has keys of its own; none of
the ``/v1`` faults above apply to it, except ``fail_inputs_containing``, which fails a
batch's lines as it fails synchronous requests. A batch runs under the faults in force when
it is created, whatever is set later:

- ``batch_delay_s`` (default 1, at most 86400): how long a batch takes from creation to
  ``completed`` (or ``expired``); 0 ends it at once. It is ``validating`` for the first
  quarter of it, ``in_progress`` until three quarters, ``finalizing`` for the rest; a
  cancel takes a quarter of it;
- ``batch_fail_inputs_containing``: ``{"POISON": 400}``, like ``fail_inputs_containing``
  but for batch lines only: a line with an input containing the substring goes to the
  error file with that status (a 500 or 503 for a failure a retry may cure, a 400 for one
  it will not), and is not charged. Both keys apply to batch lines, this one first;
- ``batch_expire_after_fraction``: 0 to 1, or null (the default: batches complete). The
  batch ends ``expired`` instead, after ``batch_delay_s``, with this share (rounded down)
  of its lines done, first in file order: those are in the output file (or the error file,
  if they failed) and the rest in the error file as ``batch_expired``; only the lines done
  and succeeded are charged;
- ``batch_cancel_after_fraction``: 0 to 1, or null (the default): the share (rounded down)
  of a batch's lines done when a cancel takes effect, whenever it arrives; null counts the
  share of the ``in_progress`` phase that had passed when the cancel came, so a batch
  cancelled while ``validating`` has none done;
- ``batch_lose_lines_rate``: 0 to 1 (default 0): the share of a batch's succeeding lines,
  drawn one by one when the batch is created (seeded by ``seed``), that a batch ending
  ``completed`` runs and charges but writes to neither its output file nor its error file,
  as a provider that loses answers it billed: the client finds no result for them. They
  count in ``request_counts.completed``; a batch that expires or is cancelled loses none;
- ``batch_max_requests``, ``batch_max_inputs``: the most lines, and the most embedding
  inputs over all its lines, a batch may have (1 to 50,000, the default, which is
  OpenAI's); a batch over either fails validation;
- ``lose_upload_responses``: a count (default 0): the next this many ``POST /v1/files``
  uploads are stored, and counted, but their responses are dropped as
  ``lose_response_rate`` drops them, so the client never learns the file's id. Setting the
  faults restarts the count;
- ``files_max_total_bytes``: the most bytes all stored files (uploads and batch results)
  may hold; an upload past it gets 413 (at most, and by default,
  :data:`~devtools.model_server.limits.FILES_MAX_TOTAL_BYTES`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from devtools.model_server.errors import HttpError
from devtools.model_server.limits import (
    BATCH_MAX_INPUTS,
    BATCH_MAX_REQUESTS,
    FILES_MAX_TOTAL_BYTES,
)

MAX_PAD_BYTES = 64 * 1024 * 1024

_FAULT_FIELDS = frozenset(
    {
        "status_rates",
        "retry_after",
        "latency_ms",
        "hang_rate",
        "hang_s",
        "fail_inputs_containing",
        "status_always",
        "chat_refusal_containing",
        "seed",
        "dedupe",
        "lose_response_rate",
        "max_concurrency",
        "concurrency_retry_after",
        "max_tpm",
        "tpm_window_s",
        "trickle_bytes_per_s",
        "pad_response_bytes",
        "webhook_statuses",
        "webhook_status_always",
        "batch_delay_s",
        "batch_fail_inputs_containing",
        "batch_expire_after_fraction",
        "batch_cancel_after_fraction",
        "batch_lose_lines_rate",
        "batch_max_requests",
        "batch_max_inputs",
        "lose_upload_responses",
        "files_max_total_bytes",
    }
)
MAX_BATCH_DELAY_S = 86_400.0


def _finite_number(raw: Mapping[str, object], key: str, default: float, low: float) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{key} must be a finite number")
    if value < low:
        raise ValueError(f"{key} must be >= {low}")
    return float(value)


def _probability(value: object, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ValueError(f"{key} must be a number between 0 and 1")
    return float(value)


def _error_status(value: object, key: str) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 400 <= value <= 599:
        raise ValueError(f"{key} must be an HTTP error status between 400 and 599")
    return value


def _webhook_status(value: object, key: str) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not (200 <= value <= 299 or 400 <= value <= 599)
    ):
        raise ValueError(f"{key} must be an HTTP status between 200 and 299 or 400 and 599")
    return value


def _positive_number(raw: Mapping[str, object], key: str) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not value > 0
    ):
        raise ValueError(f"{key} must be a finite number above 0, or null for no limit")
    return float(value)


def _window(raw: Mapping[str, object]) -> float:
    """``tpm_window_s``: the seconds of ``max_tpm`` the bucket holds, above 0 and at most 60."""
    value = _finite_number(raw, "tpm_window_s", 60.0, 0.0)
    if not 0 < value <= 60:
        raise ValueError("tpm_window_s must be above 0 and at most 60")
    return value


def _batch_delay(raw: Mapping[str, object]) -> float:
    """``batch_delay_s``: seconds from a batch's creation to its end, 0 to a day."""
    value = _finite_number(raw, "batch_delay_s", 1.0, 0.0)
    if value > MAX_BATCH_DELAY_S:
        raise ValueError(f"batch_delay_s must be at most {MAX_BATCH_DELAY_S:.0f}")
    return value


def _whole_number(raw: Mapping[str, object], key: str, low: int, high: int) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{key} must be an integer between {low} and {high}")
    return value


def _needles(raw: Mapping[str, object], key: str) -> tuple[tuple[str, int], ...]:
    """A ``{"SUBSTRING": status}`` key such as ``fail_inputs_containing``."""
    value = raw.get(key) or {}
    if not isinstance(value, dict) or not all(value):
        raise ValueError(f'{key} must be an object like {{"POISON": 400}}')
    return tuple(
        (str(needle), _error_status(status, f"{key}[{needle}]")) for needle, status in value.items()
    )


def _optional_fraction(raw: Mapping[str, object], key: str) -> float | None:
    value = raw.get(key)
    return None if value is None else _probability(value, key)


def _limit(raw: Mapping[str, object], key: str, most: int) -> int:
    """A key that lowers one of the provider's limits (:mod:`.limits`); ``most`` when unset."""
    return _whole_number(raw, key, 1, most) or most


def _optional_error_status(raw: Mapping[str, Any], key: str) -> int | None:
    value = raw.get(key)
    return None if value is None else _error_status(value, key)


def _status_rates(raw: Mapping[str, Any]) -> tuple[tuple[int, float], ...]:
    """``status_rates``: ``{"503": 0.3}``, shares of requests that add up to at most 1."""
    rates_raw = raw.get("status_rates") or {}
    if not isinstance(rates_raw, dict):
        raise ValueError('status_rates must be an object like {"503": 0.3}')
    rates = tuple(
        (
            _error_status(status, "status_rates key"),
            _probability(rate, f"status_rates[{status}]"),
        )
        for status, rate in rates_raw.items()
    )
    if sum(rate for _, rate in rates) > 1 + 1e-9:
        raise ValueError("status_rates must add up to at most 1")
    return rates


def _retry_after(raw: Mapping[str, Any]) -> str | int | float | None:
    """``retry_after``: seconds (>= 0), a non-empty HTTP-date, or null."""
    retry_after = raw.get("retry_after")
    if isinstance(retry_after, bool) or not (
        retry_after is None
        or (isinstance(retry_after, str) and retry_after.strip())
        or (isinstance(retry_after, int | float) and 0 <= retry_after < math.inf)
    ):
        raise ValueError("retry_after must be seconds (>= 0) or a non-empty HTTP-date string")
    return retry_after


def _refusal(raw: Mapping[str, Any]) -> str | None:
    refusal = raw.get("chat_refusal_containing")
    if refusal is not None and (not isinstance(refusal, str) or not refusal):
        raise ValueError("chat_refusal_containing must be a non-empty string, or null")
    return refusal


def _seed(raw: Mapping[str, Any]) -> int | None:
    seed = raw.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError("seed must be an integer")
    return seed


def _dedupe(raw: Mapping[str, Any]) -> bool:
    dedupe = raw.get("dedupe", True)
    if not isinstance(dedupe, bool):
        raise ValueError("dedupe must be true or false")
    return dedupe


def _webhook_statuses(raw: Mapping[str, Any]) -> tuple[int, ...]:
    """``webhook_statuses``: ``[503, 200]``, answered to deliveries one by one."""
    webhook_raw = raw.get("webhook_statuses") or []
    if not isinstance(webhook_raw, list):
        raise ValueError("webhook_statuses must be a list like [503, 200]")
    return tuple(
        _webhook_status(status, f"webhook_statuses[{index}]")
        for index, status in enumerate(webhook_raw)
    )


def seconds_header(value: float) -> str:
    """Seconds as a header value: ``2`` rather than ``2.0``."""
    return str(int(value)) if float(value).is_integer() else str(value)


@dataclass(frozen=True)
class FaultConfig:
    """Faults the server injects, and whether it de-duplicates; the default injects none.

    The module docstring describes each field under its JSON key.
    """

    status_rates: tuple[tuple[int, float], ...] = ()
    retry_after: str | int | float | None = None
    latency_ms: float = 0.0
    hang_rate: float = 0.0
    hang_s: float = 600.0
    fail_inputs_containing: tuple[tuple[str, int], ...] = ()
    status_always: int | None = None
    chat_refusal_containing: str | None = None
    seed: int | None = None
    dedupe: bool = True
    lose_response_rate: float = 0.0
    max_concurrency: int | None = None
    concurrency_retry_after: float = 1.0
    max_tpm: float | None = None
    tpm_window_s: float = 60.0
    trickle_bytes_per_s: float = 0.0
    pad_response_bytes: int = 0
    webhook_statuses: tuple[int, ...] = ()
    webhook_status_always: int | None = None
    batch_delay_s: float = 1.0
    batch_fail_inputs_containing: tuple[tuple[str, int], ...] = ()
    batch_expire_after_fraction: float | None = None
    batch_cancel_after_fraction: float | None = None
    batch_lose_lines_rate: float = 0.0
    batch_max_requests: int = BATCH_MAX_REQUESTS
    batch_max_inputs: int = BATCH_MAX_INPUTS
    lose_upload_responses: int = 0
    files_max_total_bytes: int = FILES_MAX_TOTAL_BYTES

    @classmethod
    def from_json(cls, raw: object) -> FaultConfig:
        """Validate a JSON fault config; raise ``ValueError`` describing the first problem."""
        if not isinstance(raw, dict):
            raise ValueError("fault config must be a JSON object")
        # Unknown keys are usually typos; silently ignoring one would make a test pass for
        # the wrong reason.
        unknown = sorted(set(raw) - _FAULT_FIELDS)
        if unknown:
            raise ValueError(f"unknown fault config keys: {', '.join(unknown)}")
        # In the order of the fields, so that the first problem named is the first key's.
        return cls(
            status_rates=_status_rates(raw),
            retry_after=_retry_after(raw),
            latency_ms=_finite_number(raw, "latency_ms", 0.0, 0.0),
            hang_rate=_probability(raw.get("hang_rate", 0.0), "hang_rate"),
            hang_s=_finite_number(raw, "hang_s", 600.0, 0.0),
            fail_inputs_containing=_needles(raw, "fail_inputs_containing"),
            status_always=_optional_error_status(raw, "status_always"),
            chat_refusal_containing=_refusal(raw),
            seed=_seed(raw),
            dedupe=_dedupe(raw),
            lose_response_rate=_probability(
                raw.get("lose_response_rate", 0.0), "lose_response_rate"
            ),
            max_concurrency=_whole_number(raw, "max_concurrency", 1, 1_000_000),
            concurrency_retry_after=_finite_number(raw, "concurrency_retry_after", 1.0, 0.0),
            max_tpm=_positive_number(raw, "max_tpm"),
            tpm_window_s=_window(raw),
            trickle_bytes_per_s=_finite_number(raw, "trickle_bytes_per_s", 0.0, 0.0),
            pad_response_bytes=_whole_number(raw, "pad_response_bytes", 0, MAX_PAD_BYTES) or 0,
            webhook_statuses=_webhook_statuses(raw),
            webhook_status_always=_optional_error_status(raw, "webhook_status_always"),
            batch_delay_s=_batch_delay(raw),
            batch_fail_inputs_containing=_needles(raw, "batch_fail_inputs_containing"),
            batch_expire_after_fraction=_optional_fraction(raw, "batch_expire_after_fraction"),
            batch_cancel_after_fraction=_optional_fraction(raw, "batch_cancel_after_fraction"),
            batch_lose_lines_rate=_probability(
                raw.get("batch_lose_lines_rate", 0.0), "batch_lose_lines_rate"
            ),
            batch_max_requests=_limit(raw, "batch_max_requests", BATCH_MAX_REQUESTS),
            batch_max_inputs=_limit(raw, "batch_max_inputs", BATCH_MAX_INPUTS),
            lose_upload_responses=_whole_number(raw, "lose_upload_responses", 0, 1_000_000) or 0,
            files_max_total_bytes=_limit(raw, "files_max_total_bytes", FILES_MAX_TOTAL_BYTES),
        )

    def to_json(self) -> dict[str, Any]:
        """Return the config as the JSON object ``GET /faults`` shows."""
        return {
            "status_rates": {str(status): rate for status, rate in self.status_rates},
            "retry_after": self.retry_after,
            "latency_ms": self.latency_ms,
            "hang_rate": self.hang_rate,
            "hang_s": self.hang_s,
            "fail_inputs_containing": dict(self.fail_inputs_containing),
            "status_always": self.status_always,
            "chat_refusal_containing": self.chat_refusal_containing,
            "seed": self.seed,
            "dedupe": self.dedupe,
            "lose_response_rate": self.lose_response_rate,
            "max_concurrency": self.max_concurrency,
            "concurrency_retry_after": self.concurrency_retry_after,
            "max_tpm": self.max_tpm,
            "tpm_window_s": self.tpm_window_s,
            "trickle_bytes_per_s": self.trickle_bytes_per_s,
            "pad_response_bytes": self.pad_response_bytes,
            "webhook_statuses": list(self.webhook_statuses),
            "webhook_status_always": self.webhook_status_always,
            "batch_delay_s": self.batch_delay_s,
            "batch_fail_inputs_containing": dict(self.batch_fail_inputs_containing),
            "batch_expire_after_fraction": self.batch_expire_after_fraction,
            "batch_cancel_after_fraction": self.batch_cancel_after_fraction,
            "batch_lose_lines_rate": self.batch_lose_lines_rate,
            "batch_max_requests": self.batch_max_requests,
            "batch_max_inputs": self.batch_max_inputs,
            "lose_upload_responses": self.lose_upload_responses,
            "files_max_total_bytes": self.files_max_total_bytes,
        }

    def injected(self, status: int, reason: str) -> HttpError:
        """The failure this config injects with ``status``, with its ``Retry-After`` on a 429
        or a 503 when ``retry_after`` is set."""
        headers: dict[str, str] = {}
        retry_after = self.retry_after_header()
        if status in (429, 503) and retry_after is not None:
            headers["Retry-After"] = retry_after
        return HttpError(
            status, f"injected fault: HTTP {status} ({reason})", code="injected", headers=headers
        )

    def retry_after_header(self) -> str | None:
        """Return the ``Retry-After`` header value, or None when none is configured."""
        value = self.retry_after
        if value is None or isinstance(value, str):
            return value
        return seconds_header(value)
