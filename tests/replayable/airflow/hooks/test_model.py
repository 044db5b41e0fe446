"""ModelHook against the real local model server on loopback, and as Airflow sees it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from devtools.model_server import LocalModelServer
from helpers import ROOT
from replayable.airflow.get_provider_info import get_provider_info
from replayable.airflow.hooks import ModelHook, choice_of
from replayable.settings import DEFAULT_MODEL, PipelineSettings

SECRET = "sk-test-secret-key"  # noqa: S105 - a test value
AIRFLOW = Path(sys.modules["airflow"].__file__ or "").parent


def use_connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, **fields: Any) -> None:
    """Define an Airflow connection the way deployments often do: an AIRFLOW_CONN_ variable."""
    fields.setdefault("conn_type", "replayable_embeddings")
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))


def test_test_connection_makes_one_tiny_call(model: LocalModelServer, monkeypatch) -> None:
    use_connection(monkeypatch, "emb_ok", host=model.base_url, extra={"model": "m-small"})
    ok, message = ModelHook("emb_ok").test_connection()
    assert ok, message
    assert "m-small" in message and "32 dimensions" in message
    assert model.stats()["requests"] == 1


def test_a_refused_key_fails_without_showing_the_key(monkeypatch) -> None:
    with LocalModelServer(dim=8, api_key=SECRET) as server:
        use_connection(monkeypatch, "emb_wrong", host=server.base_url, password=SECRET + "-wrong")
        ok, message = ModelHook("emb_wrong").test_connection()
        assert not ok
        assert message.startswith("http_401")
        assert SECRET not in message
        use_connection(monkeypatch, "emb_right", host=server.base_url, password=SECRET)
        assert ModelHook("emb_right").test_connection()[0]


def test_a_failing_provider_is_reported_after_one_request(model, monkeypatch) -> None:
    model.set_faults(status_always=503)
    use_connection(monkeypatch, "emb_down", host=model.base_url)
    ok, message = ModelHook("emb_down").test_connection()
    assert (ok, message.split(":")[0]) == (False, "http_503")
    assert model.stats()["requests"] == 1  # no retries: the button answers at once


def test_a_connection_without_host_is_reported_naming_the_field(monkeypatch) -> None:
    use_connection(monkeypatch, "emb_nohost", password=SECRET)
    ok, message = ModelHook("emb_nohost").test_connection()
    assert not ok and "no host" in message and SECRET not in message


def test_the_client_takes_the_connection_defaults_and_arguments_win(monkeypatch) -> None:
    extra = {"model": "m1", "dimensions": 16, "timeout_s": 7, "max_in_flight": 3}
    use_connection(monkeypatch, "emb_defaults", host="http://127.0.0.1:9/v1", extra=extra)
    hook = ModelHook("emb_defaults")
    client = hook.get_conn()
    try:
        assert (client.model, client.dimensions, client.timeout_s) == ("m1", 16, 7.0)
    finally:
        client.close()
    client = hook.get_client(model="m2", dimensions=8)
    try:
        assert (client.model, client.dimensions) == ("m2", 8)
    finally:
        client.close()


def test_the_operator_resolves_its_model_through_the_hook(monkeypatch) -> None:
    use_connection(
        monkeypatch, "emb_choice", host="http://127.0.0.1:9/v1", extra={"model": "m-conn"}
    )
    choice = choice_of(PipelineSettings.from_params({}), "emb_choice")
    assert (choice.model, choice.provider.base_url) == ("m-conn", "http://127.0.0.1:9/v1")
    params = PipelineSettings.from_params({"model": "m-param", "max_in_flight": 2})
    choice = choice_of(params, ModelHook("emb_choice"))
    assert (choice.model, choice.max_in_flight) == ("m-param", 2)


@pytest.mark.parametrize("extra", [{}, {"model": "m-conn", "dimensions": 12}])
def test_the_plan_and_the_client_resolve_the_same_model(monkeypatch, extra) -> None:
    """The embed keys come from model_choice, the requests from the client: they agree."""
    use_connection(monkeypatch, "emb_same", host="http://127.0.0.1:9/v1", extra=extra)
    hook = ModelHook("emb_same")
    choice = choice_of(PipelineSettings.from_params({}), hook)
    client = hook.get_conn()
    try:
        assert (client.model, client.dimensions) == (choice.model, choice.dimensions)
        assert client.model == extra.get("model", DEFAULT_MODEL)
    finally:
        client.close()


def test_the_hook_has_the_providers_hook_shape() -> None:
    assert ModelHook.default_conn_name == "replayable_model"
    assert ModelHook().embeddings_conn_id == "replayable_model"
    assert getattr(ModelHook(), ModelHook.conn_name_attr) == "replayable_model"
    schema = json.loads((AIRFLOW / "customized_form_field_behaviours.schema.json").read_text())
    jsonschema.validate(ModelHook.get_ui_field_behaviour(), schema)


def test_the_provider_info_is_valid_for_airflow() -> None:
    schema = json.loads((AIRFLOW / "provider_info.schema.json").read_text())
    jsonschema.validate(get_provider_info(), schema)


@pytest.mark.packaging  # what an installed distribution's metadata does, in a new Airflow
def test_an_installed_entry_point_registers_the_connection_form(tmp_path: Path) -> None:
    """With the entry point a packaged Replayable declares, Airflow lists the type and fields.

    The distribution's metadata is written by hand here (the package is not installable
    yet); Airflow discovers it through importlib.metadata exactly as it would an install.
    """
    dist = tmp_path / "replayable-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: replayable\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text(
        "[apache_airflow_provider]\n"
        "provider_info = replayable.airflow.get_provider_info:get_provider_info\n"
    )
    probe = (
        "import json\n"
        "from airflow.providers_manager import ProvidersManager\n"
        "pm = ProvidersManager()\n"
        "pm.initialize_providers_hooks()\n"
        "info = pm.hooks['replayable_embeddings']\n"
        "widgets = sorted(k for k in pm.connection_form_widgets if 'replayable_embeddings' in k)\n"
        "print(json.dumps({'hook': info.hook_class_name, 'name': info.hook_name,\n"
        "    'testable': info.connection_testable, 'widgets': widgets,\n"
        "    'behaviour': pm.field_behaviours['replayable_embeddings'],\n"
        "    'notifier': 'replayable.airflow.notifications.WebhookNotifier' in pm.notification}))\n"
    )
    pm_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "include")])}
    done = subprocess.run(
        [sys.executable, "-c", probe], env=pm_env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["hook"] == "replayable.airflow.hooks.ModelHook"
    assert seen["name"] == ModelHook.hook_name
    assert seen["testable"]
    assert seen["widgets"] == [
        f"extra__replayable_embeddings__{f}"
        for f in sorted(("model", "dimensions", "timeout_s", "max_in_flight"))
    ]
    assert seen["behaviour"]["hidden_fields"] == ["login", "schema", "port"]
    assert seen["notifier"]


def test_a_poll_interval_below_the_connections_floor_is_refused_naming_both(monkeypatch) -> None:
    """A run that polls its batches faster than the connection allows is refused at plan,
    naming the param and the connection's floor (ADR 0149); at the floor it is accepted."""
    use_connection(monkeypatch, "emb_poll", host="http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match=r"batch_poll_s: 0.1 s .* \(10 s, its extra min_batch"):
        choice_of(PipelineSettings(batch_poll_s=0.1), "emb_poll")
    assert choice_of(PipelineSettings(batch_poll_s=10), "emb_poll").model
    use_connection(
        monkeypatch, "emb_fast", host="http://127.0.0.1:9/v1", extra={"min_batch_poll_s": 0.1}
    )
    assert choice_of(PipelineSettings(batch_poll_s=0.1), "emb_fast").model
