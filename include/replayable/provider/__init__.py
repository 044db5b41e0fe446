"""Embedding providers: a local OpenAI-compatible server for offline demos and tests."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from replayable.provider.server import LocalModelServer

__all__ = ["LocalModelServer"]


def __getattr__(name: str) -> Any:
    # Imported lazily: an eager import would make ``python -m replayable.provider.server``
    # find the module already loaded and warn.
    if name == "LocalModelServer":
        from replayable.provider.server import LocalModelServer

        return LocalModelServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
