"""The local OpenAI-compatible model server, with fault injection, for demos and tests."""

from __future__ import annotations

from devtools.model_server.server import LocalModelServer

__all__ = ["LocalModelServer"]
