"""Replayable as an Airflow provider: its connection type, form fields and notifier.

Airflow finds this through the ``apache_airflow_provider`` entry point of an installed
distribution (``provider_info = "replayable.get_provider_info:get_provider_info"``); with it,
the connection form offers "Replayable embeddings" with its own fields. Without the
entry point (``include/`` on PYTHONPATH only) everything works except that form.
"""

from __future__ import annotations

from typing import Any

from replayable.hooks import CONNECTION_FIELDS, UI_FIELD_BEHAVIOUR, EmbeddingsHook

# The distribution's name: Airflow refuses provider info whose package-name differs from it.
PACKAGE_NAME = "replayable"


def get_provider_info() -> dict[str, Any]:
    """The provider info dict Airflow's ProvidersManager validates and reads."""
    return {
        "package-name": PACKAGE_NAME,
        "name": "Replayable",
        "description": "Idempotent, replayable AI document pipelines: the embeddings "
        "connection, its hook and the dead-letter alert notifier.",
        "connection-types": [
            {
                "connection-type": EmbeddingsHook.conn_type,
                "hook-class-name": "replayable.hooks.EmbeddingsHook",
                "hook-name": EmbeddingsHook.hook_name,
                "conn-fields": CONNECTION_FIELDS,
                "ui-field-behaviour": UI_FIELD_BEHAVIOUR,
            }
        ],
        "notifications": ["replayable.notifications.WebhookNotifier"],
    }
