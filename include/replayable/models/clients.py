"""The model clients of one endpoint, built from its settings: what a hook or a stage asks for.

Each is closed by its caller (``client.close()``). Arguments win over the endpoint's
defaults; the HTTP libraries load only when a client is made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from replayable.models.choice import chat_model_of, model_of, shared_in_flight
from replayable.models.endpoint import ModelSettings

if TYPE_CHECKING:
    from replayable.budget import RequestBudget
    from replayable.models.batch_api import BatchApi
    from replayable.models.chat import HttpChatClient
    from replayable.models.embeddings import HttpEmbeddingClient
    from replayable.retry import CallRetry

__all__ = ["batch_api", "chat_client", "embedding_client"]


def embedding_client(
    provider: ModelSettings,
    *,
    model: str | None = None,
    dimensions: int | None = None,
    max_in_flight: int | None = None,
    retry: CallRetry | None = None,
) -> HttpEmbeddingClient:
    """The embeddings endpoint's client, sending at most ``max_in_flight`` requests at once."""
    from replayable.models.embeddings import HttpEmbeddingClient

    chosen_model, chosen_dimensions = model_of(model, dimensions, provider)
    return HttpEmbeddingClient(
        **_endpoint_args(provider, chosen_model, retry),
        dimensions=chosen_dimensions,
        max_connections=max_in_flight or shared_in_flight(provider),
    )


def chat_client(
    provider: ModelSettings,
    *,
    model: str | None = None,
    max_tokens: int | None = None,
    keep_truncated: bool = False,
    max_in_flight: int | None = None,
    retry: CallRetry | None = None,
) -> HttpChatClient:
    """The chat completions client of the same endpoint (the summarize stage)."""
    from replayable.models.chat import HttpChatClient

    chosen = chat_model_of(model, provider)
    return HttpChatClient(
        **_endpoint_args(provider, chosen, retry),
        max_tokens=max_tokens,
        keep_truncated=keep_truncated,
        max_connections=max_in_flight or shared_in_flight(provider),
    )


def batch_api(
    provider: ModelSettings,
    *,
    model: str | None = None,
    retry: CallRetry | None = None,
    budget: RequestBudget | None = None,
) -> BatchApi:
    """The Files and Batch API of the same endpoint (``embed_mode: "batch"``), each call
    paced by ``budget``'s requests a second (ADR 0149)."""
    from replayable.models.batch_api import BatchApi

    chosen_model, _ = model_of(model, None, provider)
    return BatchApi(
        **{
            **_endpoint_args(provider, chosen_model, retry),
            "timeout_s": max(provider.timeout_s, 300.0),  # uploads and result files are large
        },
        max_connections=2,
        gate=budget.paced if budget is not None else None,
    )


def _endpoint_args(provider: ModelSettings, model: str, retry: CallRetry | None) -> dict[str, Any]:
    """What every client of the endpoint is built with: its URL and key, the connection's
    timeout, the model asked for at that model's price, and the retry bounds (the client's
    default when None)."""
    return {
        "base_url": provider.base_url,
        "api_key": provider.api_key,
        "timeout_s": provider.timeout_s,
        "model": model,
        "price": provider.price_of(model),
        "retry": retry,
    }
