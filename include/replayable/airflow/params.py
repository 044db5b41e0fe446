"""The document pipeline's Params: JSON schema that Airflow checks when a run is triggered."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from airflow.sdk import Param

from replayable.config import SOURCE_ROOTS_ENV
from replayable.knobs import AUTO, KNOBS, TEXT_PATTERN, Knob
from replayable.settings import REDRIVE_KEYS, RERUN_KEYS, STAGES
from replayable.vocabulary import DEFAULT_STAGES, ITEM_STATUSES

# The name the CLI's and the fuzz tests import; the statuses themselves are the vocabulary's.
STATUSES = ITEM_STATUSES
# The end of the text in Python's re (which jsonschema uses) and ECMA-262 alike: Python's `$`
# also matches before a final newline.
_END = r"(?![\s\S])"
# Each component fits the int that replayable.version_key compares in SQL.
_VERSION = r"^[0-9]{1,9}(\.[0-9]{1,9})*$"
_SHA256 = "^[0-9a-f]{64}$"
_TEXT = TEXT_PATTERN
_DATE_TIME = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}"
    r"([T ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,6})?)?(Z|[+-][0-9]{2}:?[0-9]{2})?)?" + _END
)
_names: dict[str, Any] = {
    "type": "array",
    "items": {"type": "string", "minLength": 1, "maxLength": 200, "pattern": r"^[\w.:-]+" + _END},
    "minItems": 1,
}


def _keyed(keys: Sequence[str], **properties: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``properties``, which must be exactly ``keys``: the plan-time check knows the same."""
    if set(properties) != set(keys):
        raise ValueError(f"properties {sorted(properties)} are not the keys {sorted(keys)}")
    return properties


def source_pattern(roots: Sequence[str]) -> str:
    """A JSON-schema pattern for paths and globs inside ``roots``: no ``..``, no control chars.

    It is checked when a run is triggered; discover and extract check the resolved path
    again (symlinks cannot be judged from the text).
    """
    alternatives = "|".join(re.escape(root.rstrip("/")) for root in roots)
    return rf"{_TEXT}(?!.*(^|/)\.\.(/|$))(?:{alternatives})(?:/.*)?{_END}"


def roots_sentence(roots: Sequence[str]) -> str:
    """What a ``source`` must be, naming ``roots`` and how to add one, for people to read."""
    return (
        f"an absolute path or glob inside an allowed source root ({', '.join(roots)}), without "
        f"'..' or control characters; to allow another folder, add it to {SOURCE_ROOTS_ENV} "
        "(separated by ':') where Airflow parses and runs the DAG"
    )


def source_schema(roots: Sequence[str]) -> dict[str, Any]:
    """The JSON schema of ``source`` inside ``roots``: the pattern, refused with a sentence.

    Airflow's refusal quotes what jsonschema says, and for a pattern that is the regex. So
    the pattern is the condition of an ``if``, and its ``else`` allows only the sentence:
    a source outside the roots is refused as "'/etc' is not one of ['an absolute path …']".
    The ``not`` keeps the sentence itself from passing as a source.
    """
    sentence = roots_sentence(roots)
    return {
        "if": {"pattern": source_pattern(roots)},
        "else": {"enum": [sentence], "not": {"const": sentence}},
    }


def pipeline_params(
    default_source: str,
    roots: Sequence[str] | None = None,
    *,
    stages: Sequence[str] = STAGES,
    default_stages: Sequence[str] = DEFAULT_STAGES,
) -> dict[str, Param]:
    """Params of a pipeline of ``stages`` (``document_pipeline``'s by default); a bad value
    is rejected at trigger time, naming it. Each knob's Param is its row of
    :data:`replayable.knobs.KNOBS`; ``source``, ``stages``, ``rerun`` and ``redrive`` depend
    on the pipeline."""
    params = {
        "source": _source_param(default_source, roots),
        "stages": _stages_param(stages, default_stages),
        **{knob.name: _knob_param(knob) for knob in KNOBS},
        "rerun": _rerun_param(stages),
        "redrive": _redrive_param(stages),
    }
    # The form's order: where the documents are, how they are batched, what runs.
    order = ["source", "batch_size", "stages"]
    return {name: params[name] for name in [*order, *(n for n in params if n not in order)]}


def _knob_param(knob: Knob) -> Param:
    if knob.name == "batch_size":
        # An integer in its bounds, or "auto".
        schema = dict(knob.json_schema(), type="integer")
        return Param(
            knob.default,
            anyOf=[schema, {"type": "string", "enum": [AUTO]}],
            description='Documents per mapped batch, or "auto": a few batches per parallel '
            "slot ([core] parallelism and the planner's cores, or [replayable] batch_slots). "
            "Bigger batches start fewer task instances; clearing one redoes more items.",
        )
    return Param(knob.default, description=knob.description, **knob.json_schema())


def _source_param(default_source: str, roots: Sequence[str] | None) -> Param:
    inside_roots = source_schema(roots) if roots else {}
    where = f"; it must be {roots_sentence(roots)}" if roots else ""
    return Param(
        default_source,
        type="string",
        minLength=1,
        maxLength=4096,
        **inside_roots,
        description=f"Folder (searched recursively), file or glob of PDFs{where}.",
    )


def _stages_param(stages: Sequence[str], default_stages: Sequence[str]) -> Param:
    stage_list: dict[str, Any] = {
        "type": "array",
        "items": {"type": "string", "enum": list(stages)},
        "minItems": 1,
        "uniqueItems": True,
    }
    return Param(
        None,
        anyOf=[{"type": "null"}, stage_list],
        description="Stages to run; the others are skipped. Default: "
        f"{', '.join(default_stages)} (a re-run or redrive: its own stage and what reads "
        "it)."
        + (
            " summarize, a chat completion per document at many times the price of its "
            "embeddings, runs when named here."
            if "summarize" in stages and "summarize" not in default_stages
            else ""
        ),
    )


def _rerun_param(stages: Sequence[str]) -> Param:
    return Param(
        None,
        type=["null", "object"],
        description="Re-run a stage (and what follows it) for the documents the ledger "
        'matches, e.g. {"stage": "extract", "status": ["failed", "dead"]}.',
        additionalProperties=False,
        required=["stage"],
        properties=_keyed(
            RERUN_KEYS,
            stage={"type": "string", "enum": list(stages)},
            status={
                "type": "array",
                "items": {"type": "string", "enum": list(STATUSES)},
                "minItems": 1,
            },
            error_class=_names,
            code_version_lt={"type": "string", "pattern": _VERSION},
            since={"type": "string", "format": "date-time", "pattern": _DATE_TIME},
            doc_ids={"type": "array", "items": {"type": "string", "pattern": _SHA256}},
        ),
    )


def _redrive_param(stages: Sequence[str]) -> Param:
    return Param(
        None,
        type=["null", "object"],
        description="Move open dead letters back to work with a fresh attempt budget, "
        'e.g. {"stage": "embed", "ids": [3, 4], "reason": "provider fixed"}.',
        additionalProperties=False,
        required=["stage", "reason"],
        properties=_keyed(
            REDRIVE_KEYS,
            stage={"type": "string", "enum": list(stages)},
            error_class=_names,
            ids={
                "type": "array",
                "items": {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
                "minItems": 1,
            },
            # Letters created in [since, until), as the dead-letter page filters them.
            since={"type": "string", "format": "date-time", "pattern": _DATE_TIME},
            until={"type": "string", "format": "date-time", "pattern": _DATE_TIME},
            reason={"type": "string", "minLength": 3, "maxLength": 2000, "pattern": _TEXT},
            by={
                "type": "string",
                "minLength": 1,
                "maxLength": 200,
                "pattern": _TEXT,
                "description": "A free-text note kept with the redrive (a ticket, a team); "
                "the actor recorded is always the run's triggering user.",
            },
        ),
    )
