"""The hooks: the only modules that read Airflow connections.

Operators, tasks, the CLI and the UI ask these for what a connection holds; they do not
read connections themselves, nor import each other for it (ADR 0090, ADR 0098).

- :mod:`~replayable.hooks.embeddings`: the model connection, ``EmbeddingsHook`` and
  :func:`model_choice` (the run's model and budget);
- :mod:`~replayable.hooks.ledger`: :func:`connection_dsn`, the replayable database's
  connection as a libpq DSN;
- :mod:`~replayable.hooks.webhook`: the URL an HTTP connection's fields name, and a
  webhook connection's fields.
"""

from __future__ import annotations

from replayable.get_provider_info import CONNECTION_FIELDS, UI_FIELD_BEHAVIOUR
from replayable.hooks.embeddings import (
    EmbeddingsHook,
    ModelChoice,
    chat_model_of,
    model_choice,
    run_models,
)
from replayable.hooks.ledger import connection_dsn
from replayable.hooks.webhook import ConnectionFields, connection_fields

__all__ = [
    "CONNECTION_FIELDS",
    "UI_FIELD_BEHAVIOUR",
    "ConnectionFields",
    "EmbeddingsHook",
    "ModelChoice",
    "chat_model_of",
    "connection_dsn",
    "connection_fields",
    "model_choice",
    "run_models",
]
