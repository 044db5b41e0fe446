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

from replayable.knobs import KNOBS

# The distribution's name: Airflow refuses provider info whose package-name differs from it.
PACKAGE_NAME = "replayable"
CONN_TYPE = "replayable_embeddings"
HOOK_NAME = "Replayable embeddings (OpenAI-compatible)"

# Airflow's declarative connection form (provider info "conn-fields"): stored in extra. The
# fields a run's conf may also set are those knobs' rows (replayable.knobs); the request
# timeout is the connection's alone.
_FIELDS: dict[str, dict[str, Any]] = {
    **{
        knob.name: {
            "label": knob.connection.label,
            "description": knob.connection.description,
            "schema": dict(knob.connection.schema),
        }
        for knob in KNOBS
        if knob.connection is not None
    },
    "timeout_s": {
        "label": "Timeout (seconds)",
        "description": "Deadline of one request, from sending to the last byte.",
        "schema": {"type": ["number", "null"], "exclusiveMinimum": 0},
    },
}
# The form's order: what is sent, then how long and how many at once.
CONNECTION_FIELDS: dict[str, dict[str, Any]] = {
    name: _FIELDS[name] for name in ("model", "dimensions", "timeout_s", "max_in_flight")
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
