"""The document pipeline's Params: JSON schema that Airflow checks when a run is triggered."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from airflow.sdk import Param

from replayable.config import SOURCE_ROOTS_ENV
from replayable.knobs import DEFAULT_CHAT_MODEL
from replayable.settings import (
    AUTO,
    BOUNDS,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MODEL,
    EMBED_MODES,
    REDRIVE_KEYS,
    RERUN_KEYS,
    STAGES,
    PipelineSettings,
)
from replayable.stages import extract
from replayable.vocabulary import DEFAULT_STAGES, ITEM_STATUSES

_DEFAULTS = PipelineSettings()
# The name the CLI's and the fuzz tests import; the statuses themselves are the vocabulary's.
STATUSES = ITEM_STATUSES
# The end of the text in Python's re (which jsonschema uses) and ECMA-262 alike: Python's `$`
# also matches before a final newline.
_END = r"(?![\s\S])"
# Each component fits the int that replayable.version_key compares in SQL.
_VERSION = r"^[0-9]{1,9}(\.[0-9]{1,9})*$"
_SHA256 = "^[0-9a-f]{64}$"
# Strings that reach SQL, keys or logs: no control characters (Postgres refuses NUL, and a
# terminal acts on the rest); jsonschema does not check "format" without extra packages, so
# a time is a pattern too.
_TEXT = r"^(?![\s\S]*[\x00-\x1f\x7f])"
# Text people write at length (a prompt): line breaks and tabs, no other control characters.
_PROSE = r"^(?![\s\S]*[\x00-\x08\x0b-\x1f\x7f])"
_DATE_TIME = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}"
    r"([T ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,6})?)?(Z|[+-][0-9]{2}:?[0-9]{2})?)?" + _END
)
_names: dict[str, Any] = {
    "type": "array",
    "items": {"type": "string", "minLength": 1, "maxLength": 200, "pattern": r"^[\w.:-]+" + _END},
    "minItems": 1,
}


def _bounded(name: str, **schema: Any) -> dict[str, Any]:
    low, high = BOUNDS[name]
    number = int if schema.get("type") in ("integer", ["null", "integer"]) else float
    return {"minimum": number(low), "maximum": number(high), **schema}


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
    is rejected at trigger time, naming it."""
    inside_roots = source_schema(roots) if roots else {}
    where = f"; it must be {roots_sentence(roots)}" if roots else ""
    stage_list: dict[str, Any] = {
        "type": "array",
        "items": {"type": "string", "enum": list(stages)},
        "minItems": 1,
        "uniqueItems": True,
    }
    return {
        "source": Param(
            default_source,
            type="string",
            minLength=1,
            maxLength=4096,
            **inside_roots,
            description=f"Folder (searched recursively), file or glob of PDFs{where}.",
        ),
        "batch_size": Param(
            _DEFAULTS.batch_size,
            anyOf=[_bounded("batch_size", type="integer"), {"type": "string", "enum": [AUTO]}],
            description='Documents per mapped batch, or "auto": a few batches per parallel '
            "slot ([core] parallelism and the planner's cores, or [replayable] batch_slots). "
            "Bigger batches start fewer task instances; clearing one redoes more items.",
        ),
        "stages": Param(
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
        ),
        "model": Param(
            None,
            type=["null", "string"],
            minLength=1,
            maxLength=200,
            pattern=_TEXT,
            description="Embedding model sent to the provider; default: the connection's "
            f'extra "model", else {DEFAULT_MODEL}.',
        ),
        "dimensions": Param(
            None,
            **_bounded("dimensions", type=["null", "integer"]),
            description="Embedding size, for models that accept one.",
        ),
        "chunk_size": Param(_DEFAULTS.chunk_size, **_bounded("chunk_size", type="integer")),
        "chunk_overlap": Param(
            _DEFAULTS.chunk_overlap, **_bounded("chunk_overlap", type="integer")
        ),
        "embed_inputs_per_call": Param(
            _DEFAULTS.embed_inputs_per_call,
            **_bounded("embed_inputs_per_call", type="integer"),
            description="Chunks per provider request; chunks of several documents share one.",
        ),
        "embed_mode": Param(
            _DEFAULTS.embed_mode,
            type="string",
            enum=list(EMBED_MODES),
            description="sync: each embeddings request answered at once; batch: the "
            "provider's Batch API, half the price, done within 24 h while the task waits "
            "on the triggerer without a worker slot.",
        ),
        "batch_poll_s": Param(
            _DEFAULTS.batch_poll_s,
            **_bounded("batch_poll_s", type="number"),
            description="In batch mode, how often the triggerer reads the provider's "
            "batches while the task waits for them.",
        ),
        "max_in_flight": Param(
            None,
            **_bounded("max_in_flight", type=["null", "integer"]),
            description="Provider requests in flight at once, across every task and worker; "
            f'default: the connection\'s extra "max_in_flight", else {DEFAULT_MAX_IN_FLIGHT}.',
        ),
        "max_rps": Param(
            None,
            **_bounded("max_rps", type=["null", "number"]),
            description="Provider requests per second, across every task and worker; "
            'default: the connection\'s extra "max_rps", else no limit.',
        ),
        "max_dead_fraction": Param(
            None,
            **_bounded("max_dead_fraction", type=["null", "number"]),
            description="Fail the run when the documents it dead-letters are more than this "
            "share (0 to 1) of the documents it had work for; default: dead letters never "
            "fail a run, its report lists them.",
        ),
        "max_retract_fraction": Param(
            _DEFAULTS.max_retract_fraction,
            **_bounded("max_retract_fraction", type="number"),
            description="A run over a whole source retracts the documents its listing lost "
            "(deleted or changed files) only up to this share of the documents its last "
            "listing held; over it, or from an empty listing, it retracts nothing and says "
            "why. At most 0.2: a run can only lower it.",
        ),
        "confirm_retract": Param(
            None,
            **_bounded("confirm_retract", type=["null", "integer"]),
            description="Retract past max_retract_fraction: the exact number of documents "
            "a refused run said it would retract (an empty listing never retracts).",
        ),
        "max_bytes": Param(
            _DEFAULTS.max_bytes,
            **_bounded("max_bytes", type="integer"),
            description="Larger documents are dead-lettered unread (at most 1 GiB).",
        ),
        "extractor": Param(
            _DEFAULTS.extractor,
            type="string",
            enum=list(extract.ENGINES),
            description="PDF reader: pdfium (fast, native), pypdf (pure Python), or auto "
            "(pdfium, then pypdf where pdfium refuses a file or finds no text).",
        ),
        "max_text_chars": Param(
            _DEFAULTS.max_text_chars,
            **_bounded("max_text_chars", type="integer"),
            description="A document whose text is longer is dead-lettered as oversize_text "
            "(the default fits a 1,000-page book).",
        ),
        "max_chunks_per_doc": Param(
            _DEFAULTS.max_chunks_per_doc,
            **_bounded("max_chunks_per_doc", type="integer"),
            description="A document cut into more chunks is dead-lettered as oversize_text.",
        ),
        "item_timeout_s": Param(
            _DEFAULTS.item_timeout_s, **_bounded("item_timeout_s", type="number")
        ),
        "memory_mb": Param(_DEFAULTS.memory_mb, **_bounded("memory_mb", type="integer")),
        "max_attempts": Param(_DEFAULTS.max_attempts, **_bounded("max_attempts", type="integer")),
        "lease_s": Param(_DEFAULTS.lease_s, **_bounded("lease_s", type="number")),
        "max_retry_after_s": Param(
            _DEFAULTS.max_retry_after_s,
            **_bounded("max_retry_after_s", type="number"),
            description="The longest wait a provider's Retry-After can impose on a task retry.",
        ),
        "summary_model": Param(
            None,
            type=["null", "string"],
            minLength=1,
            maxLength=200,
            pattern=_TEXT,
            description="Chat model of the summarize stage; default: the connection's extra "
            f'"chat_model", else {DEFAULT_CHAT_MODEL}.',
        ),
        "summary_prompt": Param(
            _DEFAULTS.summary_prompt,
            type="string",
            minLength=1,
            maxLength=20_000,
            pattern=_PROSE,
            description="The summarize stage's instruction, sent before the document's text. "
            "It is part of the stage's key: editing it redoes every summary, and nothing else.",
        ),
        "summary_input_chars": Param(
            _DEFAULTS.summary_input_chars,
            **_bounded("summary_input_chars", type="integer"),
            description="How much of a document's text (from its start) a summary reads.",
        ),
        "summary_max_tokens": Param(
            _DEFAULTS.summary_max_tokens,
            **_bounded("summary_max_tokens", type="integer"),
            description="The longest summary, in tokens (the request's max_tokens).",
        ),
        "summary_keep_truncated": Param(
            _DEFAULTS.summary_keep_truncated,
            type="boolean",
            description="Keep a summary cut off at summary_max_tokens, marked truncated, "
            "instead of dead-lettering its document as truncated.",
        ),
        "rerun": Param(
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
        ),
        "redrive": Param(
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
        ),
    }
