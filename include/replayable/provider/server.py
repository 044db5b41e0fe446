"""Local OpenAI-compatible embeddings server for offline demos and tests.

This server is for offline demos and tests only. Its vectors are feature hashes of the
input's words, not semantic embeddings: texts that share words land close together, but
synonyms, paraphrases and other languages do not. Never use it to judge retrieval quality.

It speaks enough of the OpenAI API (``POST /v1/embeddings``) for the pipeline's provider
client, binds loopback only, and can inject faults at runtime (error statuses at a rate,
``Retry-After``, latency, hangs, poison inputs, outages) so retry and replay behaviour can
be exercised without a network or a paid account. Control endpoints:

- ``GET /healthz``: liveness;
- ``GET /stats``, ``POST /stats/reset``: request counters, including how many successful
  responses embedded each input and each ``Idempotency-Key``;
- ``GET /faults``, ``PUT``/``POST /faults``, ``DELETE /faults``: the fault configuration.

The server itself uses the standard library only, so it starts fast anywhere.
:class:`LocalModelServer` runs it as a subprocess for tests and demos; it imports ``httpx``
only when started.

Command line::

    python -m replayable.provider.server --host 127.0.0.1 --port 0 --dim 64 \\
        [--api-key KEY] [--port-file PATH] [--verbose]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import hmac
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import httpx

DEFAULT_DIM = 64
MAX_DIM = 8192
MAX_BODY_BYTES = 16 * 1024 * 1024
API_KEY_ENV = "REPLAYABLE_LOCAL_API_KEY"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})

_TOKEN_RE = re.compile(r"\w+")
_FAULT_FIELDS = frozenset(
    {
        "status_rates",
        "retry_after",
        "latency_ms",
        "hang_rate",
        "hang_s",
        "fail_inputs_containing",
        "status_always",
        "seed",
    }
)


def require_loopback(host: str) -> str:
    """Return ``host`` if it is a loopback name, else raise ``ValueError`` naming it."""
    if host not in LOOPBACK_HOSTS:
        allowed = ", ".join(sorted(LOOPBACK_HOSTS))
        raise ValueError(f"refusing to bind non-loopback host {host!r}; use one of {allowed}")
    return host


def embed_text(text: str, dim: int = DEFAULT_DIM) -> list[float]:
    """Return the unit-norm feature-hash vector of ``text`` with ``dim`` components.

    Lowercased word tokens are each hashed to a bucket and a sign and summed. A text with
    no tokens (or whose tokens cancel out) gets the fixed unit vector e0, so every vector
    has norm 1 and cosine similarity is always defined.
    """
    if not 1 <= dim <= MAX_DIM:
        raise ValueError(f"dim must be between 1 and {MAX_DIM}, got {dim}")
    vector = [0.0] * dim
    for token in _TOKEN_RE.findall(text.lower()):
        digest = hashlib.blake2b(token.encode(), digest_size=8).digest()
        bucket = int.from_bytes(digest[:4], "big") % dim
        vector[bucket] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(math.fsum(x * x for x in vector))
    if norm == 0.0:
        vector[0] = 1.0
        return vector
    return [x / norm for x in vector]


def count_tokens(text: str) -> int:
    """Return the usage token count of one input: its whitespace tokens, at least 1."""
    return max(1, len(text.split()))


def _error_body(status: int, message: str, code: str | None = None) -> dict[str, Any]:
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


@dataclass(frozen=True)
class FaultConfig:
    """Faults the server injects into ``/v1`` requests; the default injects none."""

    status_rates: tuple[tuple[int, float], ...] = ()
    retry_after: str | int | float | None = None
    latency_ms: float = 0.0
    hang_rate: float = 0.0
    hang_s: float = 600.0
    fail_inputs_containing: tuple[tuple[str, int], ...] = ()
    status_always: int | None = None
    seed: int | None = None

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

        retry_after = raw.get("retry_after")
        if isinstance(retry_after, bool) or not (
            retry_after is None
            or (isinstance(retry_after, str) and retry_after.strip())
            or (isinstance(retry_after, int | float) and 0 <= retry_after < math.inf)
        ):
            raise ValueError("retry_after must be seconds (>= 0) or a non-empty HTTP-date string")

        poison_raw = raw.get("fail_inputs_containing") or {}
        if not isinstance(poison_raw, dict) or not all(poison_raw):
            raise ValueError('fail_inputs_containing must be an object like {"POISON": 400}')
        poison = tuple(
            (str(needle), _error_status(status, f"fail_inputs_containing[{needle}]"))
            for needle, status in poison_raw.items()
        )

        status_always = raw.get("status_always")
        if status_always is not None:
            status_always = _error_status(status_always, "status_always")

        seed = raw.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError("seed must be an integer")

        return cls(
            status_rates=rates,
            retry_after=retry_after,
            latency_ms=_finite_number(raw, "latency_ms", 0.0, 0.0),
            hang_rate=_probability(raw.get("hang_rate", 0.0), "hang_rate"),
            hang_s=_finite_number(raw, "hang_s", 600.0, 0.0),
            fail_inputs_containing=poison,
            status_always=status_always,
            seed=seed,
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
            "seed": self.seed,
        }

    def retry_after_header(self) -> str | None:
        """Return the ``Retry-After`` header value, or None when none is configured."""
        value = self.retry_after
        if value is None or isinstance(value, str):
            return value
        return str(int(value)) if float(value).is_integer() else str(value)


class _Stats:
    """Thread-safe counters behind ``GET /stats``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # A reset bumps the generation; requests that began before it are not counted when
        # they finish, so a request left hanging by one test cannot leak into the next.
        self._generation = 0
        self._in_flight = 0
        self._zero()

    def _zero(self) -> None:
        self._requests = 0
        self._succeeded = 0
        self._failed = 0
        self._by_status: dict[str, int] = {}
        self._inputs_embedded = 0
        self._input_success_counts: dict[str, int] = {}
        self._idempotency_keys: dict[str, int] = {}

    def begin(self, idempotency_key: str | None) -> int:
        """Count a request as started and in flight; return the generation it belongs to."""
        with self._lock:
            self._requests += 1
            self._in_flight += 1
            if idempotency_key is not None:
                self._idempotency_keys.setdefault(idempotency_key, 0)
            return self._generation

    def record(
        self, generation: int, status: int, inputs: Sequence[str], idempotency_key: str | None
    ) -> None:
        """Count the response a request got, unless stats were reset since it began."""
        with self._lock:
            if generation != self._generation:
                return
            key = str(status)
            self._by_status[key] = self._by_status.get(key, 0) + 1
            if status != 200:
                self._failed += 1
                return
            self._succeeded += 1
            self._inputs_embedded += len(inputs)
            for text in inputs:
                digest = hashlib.sha256(text.encode()).hexdigest()
                self._input_success_counts[digest] = self._input_success_counts.get(digest, 0) + 1
            if idempotency_key is not None:
                count = self._idempotency_keys.get(idempotency_key, 0)
                self._idempotency_keys[idempotency_key] = count + 1

    def end(self) -> None:
        """Count a request as no longer in flight."""
        with self._lock:
            self._in_flight -= 1

    def reset(self) -> None:
        """Zero every counter except the live ``in_flight`` gauge."""
        with self._lock:
            self._generation += 1
            self._zero()

    def snapshot(self) -> dict[str, Any]:
        """Return the counters as the JSON object ``GET /stats`` shows."""
        with self._lock:
            return {
                "requests": self._requests,
                "succeeded": self._succeeded,
                "failed": self._failed,
                "by_status": dict(self._by_status),
                "inputs_embedded": self._inputs_embedded,
                "input_success_counts": dict(self._input_success_counts),
                "idempotency_keys": dict(self._idempotency_keys),
                "in_flight": self._in_flight,
            }


@dataclass(frozen=True)
class _FaultDraw:
    config: FaultConfig
    release: threading.Event


class _HttpError(Exception):
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


@dataclass(frozen=True)
class _EmbeddingsRequest:
    model: str
    inputs: list[str]
    dim: int
    encoding_format: str


def _parse_embeddings_request(body: bytes, default_dim: int) -> _EmbeddingsRequest:
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise _HttpError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise _HttpError(400, "request body must be a JSON object")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise _HttpError(400, "'model' must be a non-empty string")
    raw_input = payload.get("input")
    if isinstance(raw_input, str):
        inputs = [raw_input]
    elif isinstance(raw_input, list) and all(isinstance(item, str) for item in raw_input):
        inputs = cast("list[str]", raw_input)
    else:
        raise _HttpError(400, "'input' must be a string or a list of strings")
    if not inputs or not all(inputs):
        raise _HttpError(400, "'input' must not be empty and must not contain empty strings")
    encoding_format = payload.get("encoding_format", "float")
    if encoding_format not in ("float", "base64"):
        raise _HttpError(400, "'encoding_format' must be 'float' or 'base64'")
    dim = payload.get("dimensions", default_dim)
    if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= MAX_DIM:
        raise _HttpError(400, f"'dimensions' must be an integer between 1 and {MAX_DIM}")
    return _EmbeddingsRequest(model, inputs, dim, cast("str", encoding_format))


def _embeddings_response(request: _EmbeddingsRequest) -> dict[str, Any]:
    data: list[dict[str, Any]] = []
    for index, text in enumerate(request.inputs):
        vector = embed_text(text, request.dim)
        embedding: list[float] | str = vector
        if request.encoding_format == "base64":
            # The OpenAI Python client asks for base64 by default: little-endian float32.
            packed = struct.pack(f"<{len(vector)}f", *vector)
            embedding = base64.b64encode(packed).decode("ascii")
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    tokens = sum(count_tokens(text) for text in request.inputs)
    return {
        "object": "list",
        "data": data,
        "model": request.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


class EmbeddingServer(ThreadingHTTPServer):
    """A threading HTTP server for the embeddings API; binds loopback hosts only."""

    # Hung requests sleep in their own threads; neither shutdown nor exit may wait for them.
    daemon_threads = True
    block_on_close = False

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        dim: int = DEFAULT_DIM,
        api_key: str | None = None,
        verbose: bool = False,
    ) -> None:
        require_loopback(host)
        if not 1 <= dim <= MAX_DIM:
            raise ValueError(f"dim must be between 1 and {MAX_DIM}, got {dim}")
        if ":" in host:
            self.address_family = socket.AF_INET6
        self.dim = dim
        self.api_key = api_key or None
        self.verbose = verbose
        self.stats = _Stats()
        self._faults_lock = threading.Lock()
        self._faults = FaultConfig()
        self._rng = random.Random(0)  # noqa: S311 - fault draws must be reproducible
        self._release = threading.Event()
        super().__init__((host, port), _Handler)

    def server_bind(self) -> None:
        """Bind without the reverse DNS lookup ``HTTPServer`` does, which can stall startup."""
        socketserver.TCPServer.server_bind(self)
        host, port = self.socket.getsockname()[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    @property
    def url(self) -> str:
        """Return the root URL the server answers on, e.g. ``http://127.0.0.1:8000``."""
        host = f"[{self.server_name}]" if ":" in self.server_name else self.server_name
        return f"http://{host}:{self.server_port}"

    @property
    def faults(self) -> FaultConfig:
        """Return the current fault config."""
        with self._faults_lock:
            return self._faults

    def set_faults(self, config: FaultConfig) -> None:
        """Replace the fault config; reseed the fault RNG when it carries a seed."""
        with self._faults_lock:
            self._faults = config
            if config.seed is not None:
                self._rng.seed(config.seed)

    def clear_faults(self) -> None:
        """Remove every fault and release requests held by injected latency or hangs."""
        with self._faults_lock:
            self._faults = FaultConfig()
            self._release.set()
            self._release = threading.Event()

    def snapshot_faults(self) -> _FaultDraw:
        """Return the config a request runs under and the event that releases its waits."""
        with self._faults_lock:
            return _FaultDraw(self._faults, self._release)

    def draw(self, config: FaultConfig) -> tuple[bool, int | None]:
        """Draw whether a request hangs and which status, if any, it fails with."""
        with self._faults_lock:
            hang = config.hang_rate > 0 and self._rng.random() < config.hang_rate
            if not config.status_rates:
                return hang, None
            draw = self._rng.random()
        cumulative = 0.0
        for status, rate in config.status_rates:
            cumulative += rate
            if draw < cumulative:
                return hang, status
        return hang, None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ReplayableLocalModel/1"
    # Idle keep-alive connections each hold a thread; let them go eventually.
    timeout = 60
    # Headers and body go out in separate writes; with Nagle on, delayed ACKs would add
    # about 40 ms to every keep-alive response.
    disable_nagle_algorithm = True

    def version_string(self) -> str:
        return self.server_version

    @property
    def _srv(self) -> EmbeddingServer:
        return cast("EmbeddingServer", self.server)

    def log_message(self, format: str, *args: Any) -> None:
        if self._srv.verbose:
            super().log_message(format, *args)

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        path = urlsplit(self.path).path
        try:
            if path == "/v1/embeddings" and self.command == "POST":
                self._embeddings()
                return
            body = self._read_body()
            if path == "/v1" or path.startswith("/v1/"):
                self._wait_latency(self._srv.snapshot_faults())
                self._check_auth()
                raise _HttpError(404, f"unknown endpoint {self.command} {path}")
            methods = _ROUTES.get(path)
            if methods is None:
                raise _HttpError(404, f"unknown endpoint {path}")
            route = methods.get(self.command)
            if route is None:
                allow = ", ".join(sorted(methods))
                raise _HttpError(405, f"use {allow} on {path}", headers={"Allow": allow})
            status, payload = route(self, body)
            self._send_json(status, payload)
        except _HttpError as exc:
            self._send_error(exc)

    def _embeddings(self) -> None:
        srv = self._srv
        key = self.headers.get("Idempotency-Key")
        generation = srv.stats.begin(key)
        try:
            try:
                request, payload = self._embed()
            except _HttpError as exc:
                srv.stats.record(generation, exc.status, (), key)
                self._send_error(exc)
            except Exception:
                traceback.print_exc(file=sys.stderr)
                srv.stats.record(generation, 500, (), key)
                self._send_error(_HttpError(500, "internal error in the local model server"))
            else:
                srv.stats.record(generation, 200, request.inputs, key)
                self._send_json(200, payload)
        finally:
            srv.stats.end()

    def _embed(self) -> tuple[_EmbeddingsRequest, dict[str, Any]]:
        srv = self._srv
        body = self._read_body()
        faults = srv.snapshot_faults()
        config = faults.config
        self._wait_latency(faults)
        self._check_auth()
        if config.status_always is not None:
            raise self._injected(config, config.status_always, "every request fails")
        request = _parse_embeddings_request(body, srv.dim)
        for needle, poison_status in config.fail_inputs_containing:
            if any(needle in text for text in request.inputs):
                raise self._injected(config, poison_status, f"an input contains {needle!r}")
        hang, status = srv.draw(config)
        if hang:
            faults.release.wait(config.hang_s)
        if status is not None:
            raise self._injected(config, status, "random failure")
        return request, _embeddings_response(request)

    def _injected(self, config: FaultConfig, status: int, reason: str) -> _HttpError:
        headers: dict[str, str] = {}
        retry_after = config.retry_after_header()
        if status in (429, 503) and retry_after is not None:
            headers["Retry-After"] = retry_after
        return _HttpError(
            status, f"injected fault: HTTP {status} ({reason})", code="injected", headers=headers
        )

    def _wait_latency(self, faults: _FaultDraw) -> None:
        if faults.config.latency_ms > 0:
            faults.release.wait(faults.config.latency_ms / 1000)

    def _check_auth(self) -> None:
        expected = self._srv.api_key
        if expected is None:
            return
        given = self.headers.get("Authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), expected.encode()
        ):
            raise _HttpError(
                401,
                "missing or incorrect API key in the Authorization: Bearer header",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    def _read_body(self) -> bytes:
        # The body must be consumed even when the request is refused, or the next request on
        # this keep-alive connection would be parsed from its leftovers.
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise _HttpError(411, "chunked request bodies are not supported; send Content-Length")
        raw_length = self.headers.get("Content-Length", "0")
        try:
            length = int(raw_length)
        except ValueError:
            self.close_connection = True
            raise _HttpError(400, f"invalid Content-Length {raw_length!r}") from None
        if length < 0:
            self.close_connection = True
            raise _HttpError(400, f"invalid Content-Length {raw_length!r}")
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            raise _HttpError(413, f"request body larger than {MAX_BODY_BYTES} bytes")
        return self.rfile.read(length) if length else b""

    def _send_error(self, exc: _HttpError) -> None:
        self._send_json(exc.status, _error_body(exc.status, exc.message, exc.code), exc.headers)

    def _send_json(
        self, status: int, payload: object, headers: Mapping[str, str] | None = None
    ) -> None:
        data = json.dumps(payload, separators=(",", ":")).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up, e.g. on a hung request; nothing is left to tell it.
            self.close_connection = True

    def _healthz(self, body: bytes) -> tuple[int, object]:
        return 200, {"ok": True}

    def _get_stats(self, body: bytes) -> tuple[int, object]:
        return 200, self._srv.stats.snapshot()

    def _reset_stats(self, body: bytes) -> tuple[int, object]:
        self._srv.stats.reset()
        return 200, self._srv.stats.snapshot()

    def _get_faults(self, body: bytes) -> tuple[int, object]:
        return 200, self._srv.faults.to_json()

    def _put_faults(self, body: bytes) -> tuple[int, object]:
        try:
            config = FaultConfig.from_json(json.loads(body) if body.strip() else {})
        except (ValueError, RecursionError) as exc:
            raise _HttpError(400, f"invalid fault config: {exc}") from None
        self._srv.set_faults(config)
        return 200, config.to_json()

    def _delete_faults(self, body: bytes) -> tuple[int, object]:
        self._srv.clear_faults()
        return 200, self._srv.faults.to_json()


_Route = Callable[[_Handler, bytes], tuple[int, object]]
_ROUTES: dict[str, dict[str, _Route]] = {
    "/healthz": {"GET": _Handler._healthz},
    "/stats": {"GET": _Handler._get_stats},
    "/stats/reset": {"POST": _Handler._reset_stats},
    "/faults": {
        "GET": _Handler._get_faults,
        "PUT": _Handler._put_faults,
        "POST": _Handler._put_faults,
        "DELETE": _Handler._delete_faults,
    },
}


def _write_port_file(path: Path, port: int) -> None:
    # Readers poll for this file; a rename makes it appear complete or not at all.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{port}\n")
    os.replace(tmp, path)


def serve(
    host: str = "127.0.0.1",
    port: int = 0,
    dim: int = DEFAULT_DIM,
    api_key: str | None = None,
    port_file: str | os.PathLike[str] | None = None,
    verbose: bool = False,
) -> None:
    """Run the server until SIGTERM or SIGINT, then shut it down cleanly.

    Prints ``listening on URL`` once it accepts connections and, if ``port_file`` is given,
    writes the port there atomically (and removes the file on exit). Signal handlers are
    only installed when called from the main thread.
    """
    server = EmbeddingServer(host, port, dim=dim, api_key=api_key, verbose=verbose)
    stop = threading.Event()
    previous: dict[signal.Signals, Any] = {}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, on_signal)
    port_path = Path(port_file) if port_file is not None else None
    # serve_forever runs in a thread because shutdown() blocks until it returns, so it
    # cannot be called from the thread (here: the signal handler's) that runs it.
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="serve", daemon=True
    )
    try:
        thread.start()
        if port_path is not None:
            _write_port_file(port_path, server.server_port)
        print(f"listening on {server.url}", flush=True)
        stop.wait()
        server.shutdown()
    finally:
        server.server_close()
        for restored, handler in previous.items():
            signal.signal(restored, handler)
        if port_path is not None:
            port_path.unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run :func:`serve`; return the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m replayable.provider.server",
        description="Local OpenAI-compatible embeddings server for offline demos and tests "
        "(feature-hash vectors, not semantic embeddings).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="loopback host to bind")
    parser.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one")
    parser.add_argument("--dim", type=int, default=DEFAULT_DIM, help="default vector size")
    parser.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV) or None,
        help=f"require 'Authorization: Bearer KEY' on /v1 (default: ${API_KEY_ENV})",
    )
    parser.add_argument("--port-file", help="write the bound port to this file once listening")
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    args = parser.parse_args(argv)
    if not 1 <= args.dim <= MAX_DIM:
        parser.error(f"--dim must be between 1 and {MAX_DIM}")
    try:
        serve(args.host, args.port, args.dim, args.api_key, args.port_file, args.verbose)
    except ValueError as exc:
        parser.error(str(exc))
    return 0


class LocalModelServer:
    """Run the local embeddings server as a subprocess, e.g. ``with LocalModelServer() as s``.

    The subprocess gets its own process group so :meth:`stop` can take down everything it
    started. The API key is passed through the environment so it never shows in ``ps``.
    """

    def __init__(
        self,
        dim: int = DEFAULT_DIM,
        api_key: str | None = None,
        port: int = 0,
        port_file: str | os.PathLike[str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        *,
        startup_timeout: float = 15.0,
        verbose: bool = False,
    ) -> None:
        self.dim = dim
        self.api_key = api_key
        self._requested_port = port
        self._port_file = Path(port_file) if port_file is not None else None
        self._log_path = Path(log_path) if log_path is not None else None
        self._startup_timeout = startup_timeout
        self._verbose = verbose
        self._proc: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self._tmpdir: Path | None = None
        self._client: httpx.Client | None = None

    @property
    def port(self) -> int:
        """Return the port the running server listens on."""
        if self._port is None:
            raise RuntimeError("LocalModelServer is not running; call start() first")
        return self._port

    @property
    def root_url(self) -> str:
        """Return the server's root URL, e.g. ``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """Return the OpenAI-style base URL, which ends in ``/v1``."""
        return f"{self.root_url}/v1"

    @property
    def pid(self) -> int:
        """Return the server's process id, which is also its process group id."""
        if self._proc is None:
            raise RuntimeError("LocalModelServer is not running; call start() first")
        return self._proc.pid

    def __enter__(self) -> LocalModelServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> LocalModelServer:
        """Start the subprocess and wait until it answers ``/healthz``; no-op if running."""
        if self._proc is not None:
            return self
        import httpx

        if self._port_file is None or self._log_path is None:
            self._tmpdir = Path(tempfile.mkdtemp(prefix="replayable-local-model-"))
        port_file = self._port_file or cast(Path, self._tmpdir) / "port"
        # A port file left by an earlier run would point the readiness check at a dead port.
        port_file.unlink(missing_ok=True)
        log_path = self._log_path or cast(Path, self._tmpdir) / "server.log"
        include_dir = Path(__file__).resolve().parents[2]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(include_dir), env.get("PYTHONPATH", "")) if p
        )
        # An inherited key would silently switch on auth that the caller did not ask for.
        env.pop(API_KEY_ENV, None)
        if self.api_key:
            env[API_KEY_ENV] = self.api_key
        cmd = [
            sys.executable,
            "-m",
            "replayable.provider.server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self._requested_port),
            "--dim",
            str(self.dim),
            "--port-file",
            str(port_file),
        ]
        if self._verbose:
            cmd.append("--verbose")
        with log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                cmd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        # Loopback traffic must not be routed through a proxy taken from the environment.
        self._client = httpx.Client(trust_env=False, timeout=10.0)
        try:
            self._port = self._wait_ready(port_file, log_path)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, port_file: Path, log_path: Path) -> int:
        import httpx

        assert self._proc is not None and self._client is not None
        deadline = time.monotonic() + self._startup_timeout
        while time.monotonic() < deadline:
            returncode = self._proc.poll()
            if returncode is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(
                    f"local model server exited with code {returncode} during startup:\n{tail}"
                )
            with contextlib.suppress(OSError, ValueError):
                port = int(port_file.read_text().strip())
                with contextlib.suppress(httpx.HTTPError):
                    response = self._client.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0)
                    if response.status_code == 200:
                        return port
            time.sleep(0.05)
        raise TimeoutError(
            f"local model server did not become healthy within {self._startup_timeout} s"
        )

    def stop(self) -> None:
        """Stop the server: SIGTERM its process group, then SIGKILL after 5 s; idempotent."""
        proc, self._proc = self._proc, None
        try:
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        finally:
            self._port = None
            if self._client is not None:
                self._client.close()
                self._client = None
            if self._tmpdir is not None:
                shutil.rmtree(self._tmpdir, ignore_errors=True)
                self._tmpdir = None

    def _control(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        if self._client is None:
            raise RuntimeError("LocalModelServer is not running; call start() first")
        response = self._client.request(method, f"{self.root_url}{path}", json=body)
        if response.status_code == 400:
            raise ValueError(response.json()["error"]["message"])
        response.raise_for_status()
        return response.json()

    def stats(self) -> dict[str, Any]:
        """Return the server's ``GET /stats`` counters."""
        return cast("dict[str, Any]", self._control("GET", "/stats"))

    def reset_stats(self) -> None:
        """Zero the server's counters (``in_flight`` is a live gauge and stays)."""
        self._control("POST", "/stats/reset")

    def faults(self) -> dict[str, Any]:
        """Return the server's current fault config."""
        return cast("dict[str, Any]", self._control("GET", "/faults"))

    def set_faults(
        self, config: Mapping[str, Any] | None = None, /, **fields: Any
    ) -> dict[str, Any]:
        """Replace the fault config, given as a mapping, keywords or both; return it.

        Raises ``ValueError`` with the server's message when the config is invalid.
        """
        merged = {**(config or {}), **fields}
        return cast("dict[str, Any]", self._control("PUT", "/faults", merged))

    def clear_faults(self) -> None:
        """Remove every fault and release requests held by injected latency or hangs."""
        self._control("DELETE", "/faults")


if __name__ == "__main__":
    raise SystemExit(main())
