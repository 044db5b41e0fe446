"""Airflow plugin: mounts the Replayable UI at /replayable and adds it to the Browse menu."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from replayable.web import create_app

# RUF012 below: AirflowPlugin declares these as plain class-level lists and reads them from
# the class; ClassVar would clash with that declaration under mypy.


class ReplayablePlugin(AirflowPlugin):
    """Registers :func:`replayable.web.create_app` and its nav entry; nothing else."""

    name = "replayable"
    fastapi_apps = [  # noqa: RUF012
        {"app": create_app(), "url_prefix": "/replayable", "name": "Replayable"}
    ]
    # With url_route the UI shows href in an iframe at /plugin/replayable.
    external_views = [  # noqa: RUF012
        {
            "name": "Replayable",
            "href": "/replayable/",
            "url_route": "replayable",
            "destination": "nav",
            "category": "browse",
        }
    ]
