"""The model connection: ``ModelHook`` reads it and hands out the model clients.

``ModelHook`` has the shape of the providers' hooks (``PostgresHook``, ``HttpHook``):
the hook owns the connection (``replayable_model`` by default), the operator owns its
arguments and asks the hook for a client. The connection holds:

- ``host``: the API root including ``/v1`` (``https://api.openai.com/v1``, Ollama's
  ``http://127.0.0.1:11434/v1``, …), or a bare host with ``port``, ``schema`` and
  ``extra.base_path`` (see :func:`replayable.models.endpoint.settings_from_fields`);
- ``password``: the API key, if any: sent as a bearer token, never logged or returned;
- extra fields ``model``, ``dimensions``, ``timeout_s`` and ``max_in_flight`` (the
  provider's budget of concurrent requests, shared by every task and worker).

The connection type ``replayable_embeddings`` and its form fields are declared in
:mod:`replayable.airflow.get_provider_info`, the way Airflow 3.2+ wants them;
a connection of any other type (``http`` in the dev environment) works all the same.

Which models and budget a run uses from it is :mod:`replayable.models.choice`'s policy.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

from replayable.airflow.get_provider_info import CONN_TYPE, HOOK_NAME, UI_FIELD_BEHAVIOUR
from replayable.models import clients
from replayable.models.choice import ModelChoice, model_choice
from replayable.models.endpoint import ModelSettings, settings_from_fields
from replayable.vocabulary import MODEL_CONN_ID

if TYPE_CHECKING:
    from replayable.models.batch_api import BatchApi
    from replayable.models.chat import HttpChatClient
    from replayable.models.choice import RunAsks
    from replayable.models.embeddings import HttpEmbeddingClient

__all__ = ["EmbeddingsHook", "ModelHook", "choice_of"]


class ModelHook(BaseHook):
    """Reads the model connection and builds the embeddings, chat and Batch API clients.

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

    def get_client(self, **options: Any) -> HttpEmbeddingClient:
        """The embeddings client of the connection's endpoint; ``options`` (``model``,
        ``dimensions``, ``max_in_flight``, ``retry``) win over the connection's extra, as
        :func:`replayable.models.clients.embedding_client` takes them. The caller closes it."""
        return clients.embedding_client(self.get_settings(), **options)

    def get_chat_client(self, **options: Any) -> HttpChatClient:
        """The chat completions client of the same endpoint (the summarize stage), with the
        options of :func:`replayable.models.clients.chat_client`. The caller closes it."""
        return clients.chat_client(self.get_settings(), **options)

    def get_batch_api(self, **options: Any) -> BatchApi:
        """The Files and Batch API of the same endpoint (``embed_mode: "batch"``), with the
        options of :func:`replayable.models.clients.batch_api`. The caller closes it."""
        return clients.batch_api(self.get_settings(), **options)

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


# The name of the hook before it served chat and the Batch API too: code that names it still works.
EmbeddingsHook = ModelHook


def choice_of(asks: RunAsks, conn: str | ModelHook) -> ModelChoice:
    """The run's model choice (:func:`replayable.models.choice.model_choice`) on the model
    connection ``conn``: its id, or a hook already made for it."""
    hook = conn if isinstance(conn, ModelHook) else ModelHook(conn)
    return model_choice(asks, hook.get_settings())
