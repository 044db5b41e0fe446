"""The app factory: the plugin mounts it, and it serves no anonymous docs routes."""

from __future__ import annotations

import importlib.util

from airflow.api_fastapi.app import RESERVED_URL_PREFIXES
from airflow.api_fastapi.core_api.datamodels.plugins import ExternalViewResponse
from fastapi import FastAPI
from fastapi.testclient import TestClient
from ui_fixtures import (  # noqa: F401 - fixtures
    _mounted,
    anonymous_fixture,
    app_fixture,
    auth_manager_fixture,
)

from helpers import ROOT


def test_the_plugin_mounts_the_app_at_replayable_with_a_browse_view() -> None:
    spec = importlib.util.spec_from_file_location(
        "replayable_plugin", ROOT / "plugins" / "replayable_plugin.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    plugin = module.ReplayablePlugin

    [entry] = plugin.fastapi_apps
    assert isinstance(entry["app"], FastAPI)
    assert (entry["url_prefix"], entry["name"]) == ("/replayable", "Replayable")
    assert not entry["url_prefix"].startswith(tuple(RESERVED_URL_PREFIXES))

    [view] = plugin.external_views
    # Validated with the model that GET /api/v2/plugins answers with.
    parsed = ExternalViewResponse.model_validate(view)
    assert (parsed.name, parsed.href, parsed.url_route) == (
        "Replayable",
        "/replayable/",
        "replayable",
    )
    assert (parsed.destination, parsed.category) == ("nav", "browse")
    # The plugin's app is as protected as the one the tests build.
    assert TestClient(_mounted(entry["app"])).get("/replayable/").status_code == 401


def test_there_are_no_anonymous_docs_routes(anonymous: TestClient) -> None:
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert anonymous.get("/replayable" + path).status_code == 404
