"""The Replayable UI: a FastAPI app that the Airflow plugin mounts (see :mod:`.app`)."""

from replayable.web.app import create_app

__all__ = ["create_app"]
