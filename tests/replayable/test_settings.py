"""The run settings: conf keys are checked by name, and every limit is bounded."""

import dataclasses

import pytest

from replayable.ledger import Ledger
from replayable.settings import BOUNDS, PipelineSettings, check_conf_keys


def test_an_unknown_conf_key_is_refused_naming_the_nearest_known_one():
    with pytest.raises(ValueError, match="batch_szie") as refused:
        check_conf_keys({"batch_szie": 5})
    assert "did you mean 'batch_size'?" in str(refused.value)


def test_every_unknown_key_is_named_not_only_the_first():
    with pytest.raises(ValueError) as refused:
        check_conf_keys({"batch_szie": 5, "sorce": "/data", "source": "/data"})
    message = str(refused.value)
    assert "'batch_szie'" in message and "'sorce'" in message and "'source'?" in message


def test_an_unknown_key_far_from_every_known_one_is_refused_listing_the_known_keys():
    with pytest.raises(ValueError, match="'zzz'") as refused:
        check_conf_keys({"zzz": 1})
    assert "did you mean" not in str(refused.value)
    assert "batch_size" in str(refused.value) and "redrive" in str(refused.value)


@pytest.mark.parametrize(
    ("conf", "unknown", "nearest"),
    [
        ({"rerun": {"stage": "extract", "sinse": "2024-05-01"}}, "rerun.sinse", "rerun.since"),
        (
            {"redrive": {"stage": "embed", "reason": "fixed", "error_clas": ["x"]}},
            "redrive.error_clas",
            "redrive.error_class",
        ),
    ],
)
def test_an_unknown_key_inside_rerun_or_redrive_is_refused_naming_the_nearest(
    conf, unknown, nearest
):
    with pytest.raises(ValueError, match=unknown.replace(".", r"\.")) as refused:
        check_conf_keys(conf)
    assert f"did you mean {nearest!r}?" in str(refused.value)


@pytest.mark.parametrize(
    "conf",
    [
        {},
        {"source": "/data", "batch_size": 5, "max_text_chars": 10, "max_chunks_per_doc": 10},
        {"rerun": {"stage": "chunk", "status": ["dead"], "doc_ids": []}},
        {"redrive": {"stage": "embed", "ids": [1], "reason": "fixed", "by": "ticket 42"}},
        {"rerun": None, "redrive": None},
    ],
)
def test_a_conf_of_known_keys_passes(conf):
    check_conf_keys(conf)


def test_text_and_chunk_limits_default_to_a_thousand_page_book():
    """A dense page holds about 5,000 characters; the defaults leave room to spare."""
    defaults = PipelineSettings()
    assert defaults.max_text_chars >= 1_000 * 5_000 * 2
    chunks_of_the_longest_text = defaults.max_text_chars / (
        defaults.chunk_size - defaults.chunk_overlap
    )
    assert defaults.max_chunks_per_doc >= chunks_of_the_longest_text


@pytest.mark.parametrize("name", ["max_text_chars", "max_chunks_per_doc"])
def test_a_text_or_chunk_limit_outside_its_bounds_is_refused_naming_it(name):
    low, high = BOUNDS[name]
    for value in (low - 1, high + 1):
        with pytest.raises(ValueError, match=name):
            PipelineSettings(**{name: int(value)})


def test_text_and_chunk_limits_reach_the_settings_from_the_params():
    settings = PipelineSettings.from_params({"max_text_chars": 1234, "max_chunks_per_doc": 56})
    assert (settings.max_text_chars, settings.max_chunks_per_doc) == (1234, 56)


def test_a_run_and_a_bare_ledger_lease_items_for_as_long_and_cap_attempts_alike():
    """The item lease (600 s) and attempt cap (3) have one default, not one per module."""
    ledger = {f.name: f.default for f in dataclasses.fields(Ledger)}
    settings = PipelineSettings()
    assert (ledger["lease_s"], ledger["max_attempts"]) == (settings.lease_s, settings.max_attempts)
    assert (settings.lease_s, settings.max_attempts) == (600.0, 3)
