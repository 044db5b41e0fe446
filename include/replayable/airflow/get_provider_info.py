"""Replayable as an Airflow provider: its connection type, form fields and notifier.

Airflow finds this through the ``apache_airflow_provider`` entry point of an installed
distribution
(``provider_info = "replayable.airflow.get_provider_info:get_provider_info"``); with it, the
connection form offers "Replayable embeddings" with its own fields. Without the
entry point (``include/`` on PYTHONPATH only) everything works except that form.

It imports nothing: Airflow loads it while discovering providers, which may happen in the
middle of importing Airflow itself (from this package's own hook, for one), so an import of
Airflow here would be circular. The hook takes its type, name and form from here.
"""

from __future__ import annotations

from typing import Any

# The distribution's name: Airflow refuses provider info whose package-name differs from it.
PACKAGE_NAME = "replayable"
CONN_TYPE = "replayable_embeddings"
HOOK_NAME = "Replayable embeddings (OpenAI-compatible)"

# Airflow's declarative connection form (provider info "conn-fields"): stored in extra.
CONNECTION_FIELDS: dict[str, dict[str, Any]] = {
    "model": {
        "label": "Model",
        "description": "Embedding model sent with each request, unless a run's params name one.",
        "schema": {"type": ["string", "null"]},
    },
    "dimensions": {
        "label": "Dimensions",
        "description": "Output size, for models that accept one; empty for the model's own.",
        "schema": {"type": ["integer", "null"], "minimum": 1},
    },
    "timeout_s": {
        "label": "Timeout (seconds)",
        "description": "Deadline of one request, from sending to the last byte.",
        "schema": {"type": ["number", "null"], "exclusiveMinimum": 0},
    },
    "max_in_flight": {
        "label": "Max requests in flight",
        "description": "The provider's budget of concurrent requests, shared by every worker.",
        "schema": {"type": ["integer", "null"], "minimum": 1},
    },
}
UI_FIELD_BEHAVIOUR: dict[str, Any] = {
    "hidden-fields": ["login", "schema", "port"],
    "relabeling": {"host": "API root URL", "password": "API key"},
    "placeholders": {
        "host": "https://api.openai.com/v1 (the root that /embeddings is under)",
        "password": "sk-… (sent as a bearer token; leave empty for a local server)",
    },
}


def get_provider_info() -> dict[str, Any]:
    """The provider info dict Airflow's ProvidersManager validates and reads."""
    return {
        "package-name": PACKAGE_NAME,
        "name": "Replayable",
        "description": "Idempotent, replayable AI document pipelines: the embeddings "
        "connection, its hook and the dead-letter alert notifier.",
        "connection-types": [
            {
                "connection-type": CONN_TYPE,
                "hook-class-name": "replayable.airflow.hooks.ModelHook",
                "hook-name": HOOK_NAME,
                "conn-fields": CONNECTION_FIELDS,
                "ui-field-behaviour": UI_FIELD_BEHAVIOUR,
            }
        ],
        "notifications": ["replayable.airflow.notifications.WebhookNotifier"],
    }
