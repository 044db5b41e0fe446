"""The hooks: the only modules that read Airflow connections.

Operators, tasks, the CLI and the UI ask these for what a connection holds; they do not
read connections themselves, nor import each other for it (ADR 0090, ADR 0098).

- :mod:`~replayable.airflow.hooks.model`: the model connection, ``ModelHook``, and
  :func:`choice_of` (a run's model and budget on it, by :mod:`replayable.models.choice`);
- :mod:`~replayable.airflow.hooks.ledger`: :func:`connection_dsn`, the replayable
  database's connection as a libpq DSN;
- :mod:`~replayable.airflow.hooks.webhook`: the URL an HTTP connection's fields name, and a
  webhook connection's fields.
"""

from __future__ import annotations

from replayable.airflow.get_provider_info import CONNECTION_FIELDS, UI_FIELD_BEHAVIOUR
from replayable.airflow.hooks.ledger import connection_dsn
from replayable.airflow.hooks.model import EmbeddingsHook, ModelHook, choice_of
from replayable.airflow.hooks.webhook import ConnectionFields, connection_fields

__all__ = [
    "CONNECTION_FIELDS",
    "UI_FIELD_BEHAVIOUR",
    "ConnectionFields",
    "EmbeddingsHook",
    "ModelHook",
    "choice_of",
    "connection_dsn",
    "connection_fields",
]
