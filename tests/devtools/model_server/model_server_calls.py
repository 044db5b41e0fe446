"""What the model server's tests share: calls to its API and a clean shared server.

Each test module gets its own server (the ``server`` fixture of this folder's conftest), of
``DIM`` dimensions, cleaned around every test with :func:`clean_shared_server`; the
``auth_server`` wants ``API_KEY``.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from devtools.model_server import LocalModelServer

DIM = 64
API_KEY = "test-key-123"


@contextlib.contextmanager
def clean_shared_server(request: pytest.FixtureRequest) -> Iterator[None]:
    """Give a test that uses the module's shared server no faults and zeroed stats."""
    running: LocalModelServer | None = None
    if "server" in request.fixturenames:
        running = request.getfixturevalue("server")
        running.clear_faults()
        running.reset_stats()
    yield
    if running is not None:
        # Clearing also releases any request a hang test left waiting; let it finish so the
        # next test starts with nothing in flight.
        running.clear_faults()
        deadline = time.monotonic() + 5
        while running.stats()["in_flight"] and time.monotonic() < deadline:
            time.sleep(0.01)
        running.reset_stats()


def embed(
    client: httpx.Client, inputs: str | list[str], key: str | None = None, **extra: Any
) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return client.post(
        "/embeddings", json={"model": "local-hash", "input": inputs, **extra}, headers=headers
    )


def chat(
    client: httpx.Client,
    messages: str | list[dict[str, Any]],
    key: str | None = None,
    **extra: Any,
) -> httpx.Response:
    """POST a chat completion; a string is sent as the only, user, message."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    headers = {"Idempotency-Key": key} if key is not None else {}
    return client.post(
        "/chat/completions",
        json={"model": "local-chat", "messages": messages, **extra},
        headers=headers,
    )


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def vectors(response: httpx.Response) -> list[list[float]]:
    assert response.status_code == 200, response.text
    return [item["embedding"] for item in response.json()["data"]]


def words(count: int, tag: str = "w") -> str:
    """A one-sentence text of ``count`` usage tokens (whitespace-separated words)."""
    return " ".join(f"{tag}{i}" for i in range(count))
