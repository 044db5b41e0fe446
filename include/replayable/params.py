"""The document pipeline's Params: JSON schema that Airflow checks when a run is triggered."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Param

from replayable.settings import DEFAULT_MODEL, STAGES, PipelineSettings

_DEFAULTS = PipelineSettings()
STATUSES = ("pending", "running", "done", "failed", "dead")
_VERSION = r"^[0-9]+(\.[0-9]+)*$"
_SHA256 = "^[0-9a-f]{64}$"
_names: dict[str, Any] = {
    "type": "array",
    "items": {"type": "string", "minLength": 1},
    "minItems": 1,
}


def pipeline_params(default_source: str) -> dict[str, Param]:
    """Params of ``document_pipeline``; a bad value is rejected at trigger time, naming it."""
    stage_list: dict[str, Any] = {
        "type": "array",
        "items": {"type": "string", "enum": list(STAGES)},
        "minItems": 1,
        "uniqueItems": True,
    }
    return {
        "source": Param(
            default_source,
            type="string",
            minLength=1,
            description="Folder (searched recursively) or glob of PDFs.",
        ),
        "batch_size": Param(
            _DEFAULTS.batch_size,
            type="integer",
            minimum=1,
            maximum=100_000,
            description="Documents per mapped batch.",
        ),
        "stages": Param(
            list(STAGES), **stage_list, description="Stages to run; the others are skipped."
        ),
        "model": Param(
            None,
            type=["null", "string"],
            minLength=1,
            description="Embedding model sent to the provider; default: the connection's "
            f'extra "model", else {DEFAULT_MODEL}.',
        ),
        "dimensions": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            description="Embedding size, for models that accept one.",
        ),
        "chunk_size": Param(_DEFAULTS.chunk_size, type="integer", minimum=50),
        "chunk_overlap": Param(_DEFAULTS.chunk_overlap, type="integer", minimum=0),
        "embed_inputs_per_call": Param(
            _DEFAULTS.embed_inputs_per_call, type="integer", minimum=1, maximum=2048
        ),
        "max_bytes": Param(
            _DEFAULTS.max_bytes,
            type="integer",
            minimum=1,
            description="Larger documents are dead-lettered unread.",
        ),
        "item_timeout_s": Param(_DEFAULTS.item_timeout_s, type="number", exclusiveMinimum=0),
        "memory_mb": Param(_DEFAULTS.memory_mb, type="integer", minimum=64),
        "max_attempts": Param(_DEFAULTS.max_attempts, type="integer", minimum=1, maximum=20),
        "lease_s": Param(_DEFAULTS.lease_s, type="number", minimum=1),
        "rerun": Param(
            None,
            type=["null", "object"],
            description="Re-run a stage (and what follows it) for the documents the ledger "
            'matches, e.g. {"stage": "extract", "status": ["failed", "dead"]}.',
            additionalProperties=False,
            required=["stage"],
            properties={
                "stage": {"type": "string", "enum": list(STAGES)},
                "status": {
                    "type": "array",
                    "items": {"type": "string", "enum": list(STATUSES)},
                    "minItems": 1,
                },
                "error_class": _names,
                "code_version_lt": {"type": "string", "pattern": _VERSION},
                "since": {"type": "string", "format": "date-time"},
                "doc_ids": {"type": "array", "items": {"type": "string", "pattern": _SHA256}},
            },
        ),
        "redrive": Param(
            None,
            type=["null", "object"],
            description="Move open dead letters back to work with a fresh attempt budget, "
            'e.g. {"stage": "embed", "ids": [3, 4], "reason": "provider fixed"}.',
            additionalProperties=False,
            required=["stage", "reason"],
            properties={
                "stage": {"type": "string", "enum": list(STAGES)},
                "error_class": _names,
                "ids": {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 1},
                "reason": {"type": "string", "minLength": 3},
                "by": {"type": "string", "minLength": 1},
            },
        ),
    }
