"""The wire under the handler: bodies read within a limit, JSON answered, slow or dropped.

:class:`JsonHandler` is an HTTP/1.1 keep-alive handler that always consumes a request's
body (so the next request on the connection parses cleanly), answers errors as OpenAI's
JSON bodies, and can trickle an answer or drop the connection instead of answering, as
the faults ask.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler

from devtools.model_server.errors import HttpError, error_body
from devtools.model_server.limits import MAX_BODY_BYTES


def padded(body: bytes, size: int) -> bytes:
    """Return the JSON object ``body`` with a ``padding`` field of ``size`` characters added."""
    if size <= 0:
        return body
    return b"".join((body[:-1], b',"padding":"', b"x" * size, b'"}'))


class JsonHandler(BaseHTTPRequestHandler):
    """Reads bodies within a limit and answers JSON; :class:`~.handler.Handler` routes."""

    protocol_version = "HTTP/1.1"
    # Idle keep-alive connections each hold a thread; let them go eventually.
    timeout = 60
    # Headers and body go out in separate writes; with Nagle on, delayed ACKs would add
    # about 40 ms to every keep-alive response.
    disable_nagle_algorithm = True

    def _drop_connection(self) -> None:
        # No status line, just the end of the stream: what a client sees when a provider or
        # a proxy fails after the work was done and billed.
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _read_body(self, limit: int = MAX_BODY_BYTES) -> bytes:
        # The body must be consumed even when the request is refused, or the next request on
        # this keep-alive connection would be parsed from its leftovers.
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise HttpError(411, "chunked request bodies are not supported; send Content-Length")
        raw_length = self.headers.get("Content-Length", "0")
        try:
            length = int(raw_length)
        except ValueError:
            self.close_connection = True
            raise HttpError(400, f"invalid Content-Length {raw_length!r}") from None
        if length < 0:
            self.close_connection = True
            raise HttpError(400, f"invalid Content-Length {raw_length!r}")
        if length > limit:
            self.close_connection = True
            raise HttpError(413, f"request body larger than {limit} bytes")
        return self.rfile.read(length) if length else b""

    def _send_error(self, exc: HttpError) -> None:
        self._send_json(exc.status, error_body(exc.status, exc.message, exc.code), exc.headers)

    def _send_json(
        self, status: int, payload: object, headers: Mapping[str, str] | None = None
    ) -> None:
        self._send_body(status, json.dumps(payload, separators=(",", ":")).encode(), headers)

    def _send_body(
        self,
        status: int,
        data: bytes,
        headers: Mapping[str, str] | None = None,
        *,
        content_type: str = "application/json",
        trickle: float = 0.0,
        release: threading.Event | None = None,
    ) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            if trickle > 0 and release is not None:
                self._write_slowly(data, trickle, release)
            else:
                self.wfile.write(data)
        except (ConnectionError, TimeoutError):
            # The client gave up, e.g. on a hung request; nothing is left to tell it.
            self.close_connection = True

    def _write_slowly(self, data: bytes, rate: float, release: threading.Event) -> None:
        # A tenth of a second's worth per piece keeps every read short, so only a deadline
        # on the whole response notices how long it takes. Clearing the faults sends the rest
        # at once.
        piece = max(1, int(rate / 10))
        pause = piece / rate
        view = memoryview(data)
        for start in range(0, len(view), piece):
            if start and not release.is_set():
                release.wait(pause)
            self.wfile.write(view[start : start + piece])
