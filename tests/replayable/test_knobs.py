"""Each run knob is declared once: its row of ``replayable.knobs.KNOBS`` is what the settings,
the DAG's Params and the model connection's form show and check (ADR 0154)."""

from __future__ import annotations

import inspect

import pytest

from replayable.airflow.get_provider_info import CONNECTION_FIELDS
from replayable.airflow.params import pipeline_params
from replayable.knobs import BOUNDS, KNOBS
from replayable.settings import PipelineSettings

PARAMS = pipeline_params("/data")


@pytest.mark.parametrize("knob", KNOBS, ids=lambda knob: knob.name)
def test_a_knobs_default_is_its_rows_in_the_settings_and_the_params(knob):
    assert getattr(PipelineSettings(), knob.name) == knob.default
    assert PARAMS[knob.name].value == knob.default


@pytest.mark.parametrize("knob", [k for k in KNOBS if k.bounds], ids=lambda knob: knob.name)
def test_a_knobs_bounds_are_its_rows_in_the_params_and_the_settings(knob):
    schema = PARAMS[knob.name].schema
    bounded = schema["anyOf"][0] if "anyOf" in schema else schema
    assert (bounded["minimum"], bounded["maximum"]) == knob.bounds == BOUNDS[knob.name]
    high = knob.bounds[1]
    over = high + 1 if knob.kind == "integer" else high * 2 + 1
    with pytest.raises(ValueError, match=knob.name):
        PipelineSettings(**{knob.name: over})


@pytest.mark.parametrize("knob", KNOBS, ids=lambda knob: knob.name)
def test_a_knobs_description_and_connection_field_are_its_rows(knob):
    if knob.description is not None and knob.name != "batch_size":
        assert PARAMS[knob.name].description == knob.description
    if knob.connection is not None:
        field = CONNECTION_FIELDS[knob.name]
        assert field["label"] == knob.connection.label
        assert field["description"] == knob.connection.description


def test_the_settings_declare_no_default_of_their_own_for_a_knob():
    """A knob's default is written once, in its row: the settings field reads it there."""
    source = inspect.getsource(PipelineSettings)
    for knob in KNOBS:
        if knob.default is not None:
            assert f"{knob.name}: " in source
            line = next(ln for ln in source.splitlines() if ln.strip().startswith(f"{knob.name}:"))
            assert f'DEFAULTS["{knob.name}"]' in line, line
