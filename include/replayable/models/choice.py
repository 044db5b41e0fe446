"""The models and the budget a run uses: its conf's asks held against the model connection.

The plan and every stage resolve them here alike, because they feed the keys: the embed
keys name the model and its dimensions, the summarize keys the chat model. A run's
``max_in_flight`` and ``max_rps`` may only lower the connection's (invariant 15).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from replayable.knobs import DEFAULT_CHAT_MODEL, DEFAULT_MAX_IN_FLIGHT, DEFAULT_MODEL
from replayable.models.endpoint import ModelSettings

__all__ = [
    "MODEL_STAGES",
    "ModelChoice",
    "Models",
    "RunAsks",
    "chat_model_of",
    "model_choice",
    "model_of",
    "run_models",
    "shared_in_flight",
]

# The shipped stages that call the model provider: their keys name the models a run resolves.
MODEL_STAGES = frozenset({"embed", "summarize"})

log = logging.getLogger(__name__)


class RunAsks(Protocol):
    """What a run's conf asks of the model connection (``PipelineSettings`` has these)."""

    @property
    def model(self) -> str | None: ...
    @property
    def dimensions(self) -> int | None: ...
    @property
    def summary_model(self) -> str | None: ...
    @property
    def max_in_flight(self) -> int | None: ...
    @property
    def max_rps(self) -> float | None: ...
    @property
    def batch_poll_s(self) -> float: ...


@dataclass(frozen=True)
class Models:
    """The models a run resolved from its params and the model connection."""

    embed: str = ""
    dimensions: int | None = None
    chat: str = ""


@dataclass(frozen=True)
class ModelChoice:
    """The provider, model and budget a run uses: params win over the connection's extra."""

    provider: ModelSettings
    model: str
    dimensions: int | None
    max_in_flight: int
    max_rps: float | None = None
    # The connection's own limits: the budget every run shares counts against these.
    shared_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    shared_rps: float | None = None


def model_of(
    model: str | None, dimensions: int | None, provider: ModelSettings
) -> tuple[str, int | None]:
    """The one fallback chain of a model and its dimensions: asked, else the connection's.

    The model then falls back to ``DEFAULT_MODEL``. It feeds the embed keys, so the plan
    (through :func:`model_choice`) and the client must resolve it the same way.
    """
    return model or provider.model or DEFAULT_MODEL, dimensions or provider.dimensions


def chat_model_of(model: str | None, provider: ModelSettings) -> str:
    """The summarize stage's chat model: asked, else the connection's extra ``chat_model``,
    else ``DEFAULT_CHAT_MODEL``; it feeds the summarize keys, as :func:`model_of` the embed
    keys."""
    return model or provider.chat_model or DEFAULT_CHAT_MODEL


def shared_in_flight(provider: ModelSettings) -> int:
    """The requests in flight the connection allows every run together (ADR 0086)."""
    return provider.max_in_flight or DEFAULT_MAX_IN_FLIGHT


def _tighter(asked: float | None, allowed: float | None) -> float | None:
    """The lower of a run's ask and the connection's limit; None where neither limits."""
    if asked is None:
        return allowed
    return asked if allowed is None else min(asked, allowed)


def model_choice(asks: RunAsks, provider: ModelSettings) -> ModelChoice:
    """Resolve the run's model once; it feeds the embed keys, so plan and stage must agree.

    A higher ``max_in_flight`` or ``max_rps`` than the connection's is held to the
    connection's value, with a warning in the task's log. A ``batch_poll_s`` shorter than
    the connection's ``min_batch_poll_s`` is refused (ADR 0149).
    """
    shared = shared_in_flight(provider)
    in_flight = int(_tighter(asks.max_in_flight, shared) or shared)
    rps = _tighter(asks.max_rps, provider.max_rps)
    for name, asked, allowed in (
        ("max_in_flight", asks.max_in_flight, shared),
        ("max_rps", asks.max_rps, provider.max_rps),
    ):
        if asked is not None and allowed is not None and asked > allowed:
            log.warning(
                "%s %s asks for more than the model connection allows (%s): using %s; "
                "raise it on the connection, not in a run's conf",
                name,
                asked,
                allowed,
                allowed,
            )
    if asks.batch_poll_s < provider.min_batch_poll_s:
        # Unlike a rate, a poll interval is not held up to the floor: the run would not
        # poll as it asked, and it is refused at plan, naming both.
        raise ValueError(
            f"batch_poll_s: {asks.batch_poll_s:g} s is shorter than the model "
            f"connection allows ({provider.min_batch_poll_s:g} s, its extra "
            "min_batch_poll_s): ask for at least that, or lower it on the connection"
        )
    model, dimensions = model_of(asks.model, asks.dimensions, provider)
    return ModelChoice(
        provider=provider,
        model=model,
        dimensions=dimensions,
        max_in_flight=in_flight,
        max_rps=rps,
        shared_in_flight=shared,
        shared_rps=provider.max_rps,
    )


def run_models(
    asks: RunAsks, provider: Callable[[], ModelSettings], stages: Iterable[str]
) -> Models:
    """The models that key a run's ``stages``, resolved as the stages resolve them.

    ``provider`` reads the model connection, and is called only when a model stage runs: a
    run of extract and chunk alone needs no model connection.
    """
    if not MODEL_STAGES & set(stages):
        return Models(asks.model or "", asks.dimensions, asks.summary_model or "")
    settings = provider()
    choice = model_choice(asks, settings)
    return Models(choice.model, choice.dimensions, chat_model_of(asks.summary_model, settings))
