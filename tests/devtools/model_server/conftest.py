"""The model server's tests: a server per test module, cleaned around each test."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from model_server_calls import API_KEY, DIM, clean_shared_server

from devtools.model_server import LocalModelServer


@pytest.fixture(scope="module")
def server() -> Iterator[LocalModelServer]:
    """The module's server: no API key, ``DIM`` dimensions."""
    with LocalModelServer(dim=DIM) as running:
        yield running


@pytest.fixture(scope="module")
def auth_server() -> Iterator[LocalModelServer]:
    """The module's server that wants ``API_KEY``."""
    with LocalModelServer(dim=DIM, api_key=API_KEY) as running:
        yield running


@pytest.fixture(autouse=True)
def _clean_server(request: pytest.FixtureRequest) -> Iterator[None]:
    with clean_shared_server(request):
        yield


@pytest.fixture
def client(server: LocalModelServer) -> Iterator[httpx.Client]:
    """A client for the server's OpenAI-shaped API (``/v1``)."""
    with httpx.Client(base_url=server.base_url, trust_env=False, timeout=10.0) as http:
        yield http
