"""The model connection: ``EmbeddingsHook``, and the model and budget a run chooses from it.

``EmbeddingsHook`` has the shape of the providers' hooks (``PostgresHook``, ``HttpHook``):
the hook owns the connection (``replayable_model`` by default), the operator owns its
arguments and asks the hook for a client. The connection holds:

- ``host``: the API root including ``/v1`` (``https://api.openai.com/v1``, Ollama's
  ``http://127.0.0.1:11434/v1``, …), or a bare host with ``port``, ``schema`` and
  ``extra.base_path`` (see :func:`replayable.stages.embed.endpoint.settings_from_fields`);
- ``password``: the API key, if any: sent as a bearer token, never logged or returned;
- extra fields ``model``, ``dimensions``, ``timeout_s`` and ``max_in_flight`` (the
  provider's budget of concurrent requests, shared by every task and worker).

The connection type ``replayable_embeddings`` and its form fields are declared in
:mod:`replayable.get_provider_info`, the way Airflow 3.2+ wants them;
a connection of any other type (``http`` in the dev environment) works all the same.

:func:`model_choice` resolves a run's model and budget from that connection and the run's
params; the hook's client falls back to a model by the same chain.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

from replayable.get_provider_info import CONN_TYPE, HOOK_NAME, UI_FIELD_BEHAVIOUR
from replayable.settings import DEFAULT_MAX_IN_FLIGHT, DEFAULT_MODEL
from replayable.stages.embed.endpoint import ModelSettings, settings_from_fields
from replayable.stages.summarize.config import DEFAULT_CHAT_MODEL
from replayable.vocabulary import MODEL_CONN_ID

if TYPE_CHECKING:
    from replayable.budget import RequestBudget
    from replayable.retry import CallRetry
    from replayable.settings import PipelineSettings
    from replayable.stage import Models
    from replayable.stages.embed.batch_api import BatchApi
    from replayable.stages.embed.client import HttpEmbeddingClient
    from replayable.stages.summarize.client import HttpChatClient

__all__ = ["EmbeddingsHook", "ModelChoice", "chat_model_of", "model_choice", "run_models"]

# The shipped stages that call the model provider: their keys name the models a run resolves.
MODEL_STAGES = frozenset({"embed", "summarize"})

log = logging.getLogger(__name__)


class EmbeddingsHook(BaseHook):
    """Reads the embeddings connection and builds :class:`HttpEmbeddingClient` from it.

    :param embeddings_conn_id: Airflow connection of the OpenAI-compatible endpoint.
    """

    conn_name_attr = "embeddings_conn_id"
    default_conn_name = MODEL_CONN_ID
    conn_type = CONN_TYPE
    hook_name = HOOK_NAME

    def __init__(self, embeddings_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.embeddings_conn_id = embeddings_conn_id
        self._settings: ModelSettings | None = None

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """The form's hidden, relabelled and prefilled standard fields (snake_case keys).

        Airflow 3.2+ reads the same from the provider info; this is for callers that ask
        the hook, as Airflow 2 did.
        """
        return {key.replace("-", "_"): value for key, value in UI_FIELD_BEHAVIOUR.items()}

    def get_settings(self) -> ModelSettings:
        """Endpoint, key and defaults from the connection (read once per hook)."""
        if self._settings is None:
            conn = self.get_connection(self.embeddings_conn_id)
            self._settings = settings_from_fields(
                conn.host, conn.port, conn.schema, conn.password, conn.extra_dejson
            )
        return self._settings

    def get_client(
        self,
        *,
        model: str | None = None,
        dimensions: int | None = None,
        max_in_flight: int | None = None,
        retry: CallRetry | None = None,
    ) -> HttpEmbeddingClient:
        """A client for the connection's endpoint; arguments win over the connection's extra.

        The caller closes it (``client.close()``).
        """
        # Imported here: httpx is a task-time need, not a DAG-parse-time one.
        from replayable.retry import CallRetry
        from replayable.stages.embed.client import HttpEmbeddingClient

        settings = self.get_settings()
        chosen_model, chosen_dimensions = _model_of(model, dimensions, settings)
        return HttpEmbeddingClient(
            base_url=settings.base_url,
            model=chosen_model,
            api_key=settings.api_key,
            dimensions=chosen_dimensions,
            timeout_s=settings.timeout_s,
            retry=retry or CallRetry(),
            max_connections=max_in_flight or _shared_in_flight(settings),
            price=settings.price_of(chosen_model),
        )

    def get_chat_client(
        self,
        *,
        model: str | None = None,
        max_tokens: int | None = None,
        keep_truncated: bool = False,
        max_in_flight: int | None = None,
        retry: CallRetry | None = None,
    ) -> HttpChatClient:
        """A chat completions client for the same endpoint and key (the summarize stage).

        The model falls back to the connection's extra ``chat_model``, then
        ``DEFAULT_CHAT_MODEL``. The caller closes it (``client.close()``).
        """
        from replayable.retry import CallRetry
        from replayable.stages.summarize.client import HttpChatClient

        settings = self.get_settings()
        chosen = chat_model_of(model, settings)
        return HttpChatClient(
            base_url=settings.base_url,
            model=chosen,
            api_key=settings.api_key,
            max_tokens=max_tokens,
            keep_truncated=keep_truncated,
            timeout_s=settings.timeout_s,
            retry=retry or CallRetry(),
            max_connections=max_in_flight or _shared_in_flight(settings),
            price=settings.price_of(chosen),
        )

    def get_batch_api(
        self,
        *,
        model: str | None = None,
        retry: CallRetry | None = None,
        budget: RequestBudget | None = None,
    ) -> BatchApi:
        """The Files and Batch API of the same endpoint and key (``embed_mode: "batch"``),
        each call paced by ``budget``'s requests a second (ADR 0149).

        The caller closes it (``api.close()``).
        """
        from replayable.retry import CallRetry
        from replayable.stages.embed.batch_api import BatchApi

        settings = self.get_settings()
        chosen_model, _ = _model_of(model, None, settings)
        return BatchApi(
            base_url=settings.base_url,
            model=chosen_model,
            api_key=settings.api_key,
            timeout_s=max(settings.timeout_s, 300.0),  # uploads and result files are large
            retry=retry or CallRetry(),
            max_connections=2,
            price=settings.price_of(chosen_model),
            gate=budget.paced if budget is not None else None,
        )

    def get_conn(self) -> HttpEmbeddingClient:
        """The hook protocol's name for :meth:`get_client` with the connection's defaults."""
        return self.get_client()

    def test_connection(self) -> tuple[bool, str]:
        """Make one tiny embeddings call; return (ok, message). The key never appears in it.

        Used by Airflow's "Test" button (when ``[core] test_connection`` is enabled) and
        handy in a shell. The call is not retried, so a refused key or an endpoint that is
        down answers at once.
        """
        from replayable.retry import CallRetry, classify

        api_key: str | None = None
        try:
            settings = self.get_settings()
            api_key = settings.api_key
            client = self.get_client(retry=CallRetry(max_attempts=1))
            try:
                result = client.embed(
                    ["Replayable connection test"],
                    idempotency_key=f"replayable-connection-test-{uuid.uuid4().hex}",
                )
            finally:
                client.close()
        except Exception as error:
            failure = classify(error)
            message = f"{failure.error_class}: {failure.message}"
            if api_key:
                message = message.replace(api_key, "***")
            return False, message
        return (
            True,
            f"{client.model} at {settings.base_url} answered with a vector of "
            f"{len(result.vectors[0])} dimensions ({result.tokens} token(s) billed)",
        )


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


def _model_of(
    model: str | None, dimensions: int | None, provider: ModelSettings
) -> tuple[str, int | None]:
    """The one fallback chain of a model and its dimensions: asked, else the connection's.

    The model then falls back to ``DEFAULT_MODEL``. It feeds the embed keys, so the plan
    (through :func:`model_choice`) and the client must resolve it the same way.
    """
    return model or provider.model or DEFAULT_MODEL, dimensions or provider.dimensions


def chat_model_of(model: str | None, provider: ModelSettings) -> str:
    """The summarize stage's chat model: asked, else the connection's extra ``chat_model``,
    else ``DEFAULT_CHAT_MODEL``. It feeds the summarize keys, as :func:`_model_of` does the
    embed keys, so the plan and the stage resolve it here alike."""
    return model or provider.chat_model or DEFAULT_CHAT_MODEL


def _shared_in_flight(provider: ModelSettings) -> int:
    """The requests in flight the connection allows every run together (ADR 0086)."""
    return provider.max_in_flight or DEFAULT_MAX_IN_FLIGHT


def _tighter(asked: float | None, allowed: float | None) -> float | None:
    """The lower of a run's ask and the connection's limit; None where neither limits."""
    if asked is None:
        return allowed
    return asked if allowed is None else min(asked, allowed)


def model_choice(settings: PipelineSettings, conn: str | EmbeddingsHook) -> ModelChoice:
    """Resolve the run's model once; it feeds the embed keys, so plan and stage must agree.

    ``conn`` is the model connection's id or a hook already made for it. A run's
    ``max_in_flight`` and ``max_rps`` may only lower the connection's (invariant 15): a
    higher ask is held to the connection's value, with a warning in the task's log. A
    ``batch_poll_s`` shorter than the connection's ``min_batch_poll_s`` is refused.
    """
    hook = conn if isinstance(conn, EmbeddingsHook) else EmbeddingsHook(conn)
    provider = hook.get_settings()
    shared_in_flight = _shared_in_flight(provider)
    in_flight = int(_tighter(settings.max_in_flight, shared_in_flight) or shared_in_flight)
    rps = _tighter(settings.max_rps, provider.max_rps)
    for name, asked, allowed in (
        ("max_in_flight", settings.max_in_flight, shared_in_flight),
        ("max_rps", settings.max_rps, provider.max_rps),
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
    if settings.batch_poll_s < provider.min_batch_poll_s:
        # Unlike a rate, a poll interval is not held up to the floor: the run would not
        # poll as it asked, and it is refused at plan, naming both (ADR 0149).
        raise ValueError(
            f"batch_poll_s: {settings.batch_poll_s:g} s is shorter than the model "
            f"connection allows ({provider.min_batch_poll_s:g} s, its extra "
            "min_batch_poll_s): ask for at least that, or lower it on the connection"
        )
    model, dimensions = _model_of(settings.model, settings.dimensions, provider)
    return ModelChoice(
        provider=provider,
        model=model,
        dimensions=dimensions,
        max_in_flight=in_flight,
        max_rps=rps,
        shared_in_flight=shared_in_flight,
        shared_rps=provider.max_rps,
    )


def run_models(
    settings: PipelineSettings, conn: str | EmbeddingsHook, stages: Iterable[str]
) -> Models:
    """The models that key a run's ``stages``, resolved as the stages resolve them.

    The connection is read only when a model stage runs: a run of extract and chunk alone
    needs no model connection.
    """
    from replayable.stage import Models

    if not MODEL_STAGES & set(stages):
        return Models(settings.model or "", settings.dimensions, settings.summary_model or "")
    hook = conn if isinstance(conn, EmbeddingsHook) else EmbeddingsHook(conn)
    choice = model_choice(settings, hook)
    return Models(
        choice.model, choice.dimensions, chat_model_of(settings.summary_model, choice.provider)
    )
