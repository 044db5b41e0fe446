"""The model clients of one endpoint, built from its settings: what a hook or a stage asks for.

Each is closed by its caller (``client.close()``). Arguments win over the endpoint's
defaults; the HTTP libraries load only when a client is made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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
    from replayable.retry import CallRetry

    chosen_model, chosen_dimensions = model_of(model, dimensions, provider)
    return HttpEmbeddingClient(
        base_url=provider.base_url,
        model=chosen_model,
        api_key=provider.api_key,
        dimensions=chosen_dimensions,
        timeout_s=provider.timeout_s,
        retry=retry or CallRetry(),
        max_connections=max_in_flight or shared_in_flight(provider),
        price=provider.price_of(chosen_model),
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
    from replayable.retry import CallRetry

    chosen = chat_model_of(model, provider)
    return HttpChatClient(
        base_url=provider.base_url,
        model=chosen,
        api_key=provider.api_key,
        max_tokens=max_tokens,
        keep_truncated=keep_truncated,
        timeout_s=provider.timeout_s,
        retry=retry or CallRetry(),
        max_connections=max_in_flight or shared_in_flight(provider),
        price=provider.price_of(chosen),
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
    from replayable.retry import CallRetry

    chosen_model, _ = model_of(model, None, provider)
    return BatchApi(
        base_url=provider.base_url,
        model=chosen_model,
        api_key=provider.api_key,
        timeout_s=max(provider.timeout_s, 300.0),  # uploads and result files are large
        retry=retry or CallRetry(),
        max_connections=2,
        price=provider.price_of(chosen_model),
        gate=budget.paced if budget is not None else None,
    )
