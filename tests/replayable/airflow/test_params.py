"""document_pipeline's params as Airflow checks them when a run is created.

The params go through the DAG's serialization, as the API server holds them: what a refusal
says here is the ``detail`` of the REST 400, which the trigger form and ``airflow dags
trigger`` show too.
"""

from typing import Any

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import ParamValidationError
from airflow.serialization.serialized_objects import DagSerialization

from replayable.airflow.params import pipeline_params
from replayable.settings import REDRIVE_KEYS, RERUN_KEYS, PipelineSettings, conf_keys

ROOTS = ("/srv/pdfs", "/mnt/scans")


@pytest.fixture(scope="module")
def params() -> Any:
    dag = DAG("params_under_test", schedule=None, params=pipeline_params(ROOTS[0], ROOTS))
    return DagSerialization.from_dict(DagSerialization.to_dict(dag)).params


def refusal(params: Any, conf: dict[str, Any]) -> str:
    with pytest.raises(ParamValidationError) as refused:
        params.deep_merge(conf).validate()
    return str(refused.value)


@pytest.mark.parametrize("source", ["/etc", "/srv/pdfs2", "/srv/pdfs/../etc", "/srv/pdfs/a\x1b"])
def test_a_source_outside_the_roots_is_refused_with_a_sentence_naming_roots_and_variable(
    params, source
):
    message = refusal(params, {"source": source})
    first_line = message.splitlines()[0]
    assert first_line.startswith("Invalid input for param source:")
    assert "/srv/pdfs, /mnt/scans" in first_line
    assert "REPLAYABLE_SOURCE_ROOTS" in first_line
    assert "does not match" not in message and "(?!" not in message


@pytest.mark.parametrize("source", ["/srv/pdfs", "/mnt/scans/2024/**/*.pdf", "/srv/pdfs/a.pdf"])
def test_a_source_inside_the_roots_is_accepted(params, source):
    assert params.deep_merge({"source": source}).validate()["source"] == source


def test_the_refusal_sentence_itself_is_no_valid_source(params):
    """The schema names its sentence as the one allowed value of the refusing branch."""
    sentence = params.get_param("source").schema["else"]["enum"][0]
    assert refusal(params, {"source": sentence}).startswith("Invalid input for param source:")


def test_the_trigger_form_describes_the_roots_and_how_to_add_one(params):
    description = params.get_param("source").description
    assert "/srv/pdfs, /mnt/scans" in description and "REPLAYABLE_SOURCE_ROOTS" in description


def test_every_param_is_a_setting_and_a_known_conf_key():
    names = set(pipeline_params("/data"))
    assert names == set(conf_keys())
    assert names <= {f for f in PipelineSettings.__dataclass_fields__}


def test_rerun_and_redrive_accept_exactly_the_keys_the_plan_check_knows():
    schema = {name: param.schema for name, param in pipeline_params("/data").items()}
    assert set(schema["rerun"]["properties"]) == set(RERUN_KEYS)
    assert set(schema["redrive"]["properties"]) == set(REDRIVE_KEYS)


@pytest.mark.parametrize(
    ("name", "value"),
    [("max_text_chars", 0), ("max_text_chars", 10**12), ("max_chunks_per_doc", 0)],
)
def test_a_text_or_chunk_limit_out_of_bounds_is_refused_at_trigger_time(params, name, value):
    assert refusal(params, {name: value}).startswith(f"Invalid input for param {name}:")


def test_the_defaults_reach_the_settings_with_the_text_and_chunk_limits(params):
    settings = PipelineSettings.from_params(params.deep_merge({}).validate())
    defaults = PipelineSettings()
    assert settings.max_text_chars == defaults.max_text_chars
    assert settings.max_chunks_per_doc == defaults.max_chunks_per_doc


def test_redrive_by_is_a_free_text_note_not_the_actor():
    by = pipeline_params("/data")["redrive"].schema["properties"]["by"]
    assert "note" in by["description"] and "triggering user" in by["description"]
