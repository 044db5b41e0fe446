"""A stand-in for Airflow's REST API on loopback: records what a client sends, answers as told.

Serves the two calls Replayable makes (``POST /auth/token`` and ``POST
/api/v2/dags/{dag_id}/dagRuns``) over real HTTP, so that the clients under test use their
real transport. Each trigger answers ``answer`` (200 with a new run id by default).

Airflow itself runs here, and the e2e tier triggers redrives through its real API server
(``tests/e2e/test_ui_in_airflow.py``: roles, the recorded triggering user, the conf). This
stand-in serves the fast tiers, and the answers a real Airflow cannot be made to give on
demand (a 5xx, a conf it rejects after the page accepted it), to test how they are passed on.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

USERNAME, PASSWORD, TOKEN = "ana", "s3cret", "jwt-of-ana"


@dataclass
class Sent:
    path: str
    authorization: str | None
    body: Any


@dataclass
class FakeAirflow:
    """``with FakeAirflow() as airflow: ... airflow.url``; ``airflow.sent`` lists requests."""

    answer: tuple[int, dict[str, Any]] | None = None
    sent: list[Sent] = field(default_factory=list)
    runs: int = 0

    def __enter__(self) -> FakeAirflow:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                body = json.loads(raw) if raw else None
                fake.sent.append(Sent(self.path, self.headers.get("authorization"), body))
                status, payload = fake.respond(self.path, body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def triggers(self) -> list[Sent]:
        return [s for s in self.sent if s.path.endswith("/dagRuns")]

    def respond(self, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        if path == "/auth/token":
            if body == {"username": USERNAME, "password": PASSWORD}:
                return 201, {"access_token": TOKEN}
            return 401, {"detail": "Invalid credentials"}
        if path.startswith("/api/v2/dags/") and path.endswith("/dagRuns"):
            if self.answer is not None:
                return self.answer
            self.runs += 1
            return 200, {"dag_run_id": f"manual__fake-{self.runs}", "state": "queued"}
        return 404, {"detail": "Not Found"}
