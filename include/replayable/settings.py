"""The pipeline's run settings: one typed object built from DAG params (or a dict).

The DAG's Param JSON schema rejects bad conf at trigger time; this class checks again
where the values are used, so that a task run outside a DAG fails with the same clarity.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any

from replayable.knobs import AUTO as AUTO
from replayable.knobs import BOUNDS as BOUNDS
from replayable.knobs import DEFAULT_MAX_IN_FLIGHT as DEFAULT_MAX_IN_FLIGHT
from replayable.knobs import DEFAULT_MODEL as DEFAULT_MODEL
from replayable.knobs import DEFAULTS, OPTIONAL, check_chunking, check_engine
from replayable.knobs import EMBED_MODES as EMBED_MODES

# Re-exported: the CLI, the UI, the operator, bench and many tests import it from here.
from replayable.vocabulary import STAGES as STAGES
from replayable.vocabulary import is_stage_name

# Airflow fixes a task's execution_timeout when it parses the DAG, before any run's params
# are known, so each one is a backstop derived from the params' maxima; a stage task also
# keeps its own run's deadline (PipelineSettings.batch_deadline_s), which always comes first
# (ADR 0012). A batch's deadline is at most the longest lease plus the longest Retry-After
# any run may set; the items in flight then need at most one item timeout more.
BATCH_DEADLINE_CAP_S = BOUNDS["lease_s"][1] + BOUNDS["max_retry_after_s"][1]
TASK_TIMEOUTS: dict[str, timedelta] = {
    # Discovers (hashing only new or changed files: 6 h is hundreds of GB at disk speed),
    # then plans with a few indexed queries (ADR 0009): seconds at a million documents.
    "plan": timedelta(hours=6, minutes=30),
    "report": timedelta(minutes=30),
    "stage": timedelta(seconds=BATCH_DEADLINE_CAP_S + BOUNDS["item_timeout_s"][1]),
}


@dataclass(frozen=True)
class PipelineSettings:
    """Everything one run of the pipeline needs to know, validated."""

    source: str = ""
    # Documents per mapped batch, or "auto": a few batches per parallel slot (ADR 0104).
    batch_size: int | str = DEFAULTS["batch_size"]
    # None: the pipeline's default stages, and for a re-run or a redrive its own stage too
    # (stage.Pipeline.effective_stages, ADR 0107).
    stages: tuple[str, ...] | None = None
    model: str | None = None  # None: the connection's extra "model", else DEFAULT_MODEL
    dimensions: int | None = None
    chunk_size: int = DEFAULTS["chunk_size"]
    chunk_overlap: int = DEFAULTS["chunk_overlap"]
    embed_inputs_per_call: int = DEFAULTS["embed_inputs_per_call"]
    # "sync" (each request answered at once) or "batch": the provider's Batch API, at half
    # the price, collected within 24 h while the task waits on the triggerer (ADR 0117).
    embed_mode: str = DEFAULTS["embed_mode"]
    batch_poll_s: float = DEFAULTS["batch_poll_s"]
    max_in_flight: int | None = None  # None: the connection's extra, else DEFAULT_MAX_IN_FLIGHT
    max_rps: float | None = None  # None: the connection's extra, else no rate limit
    max_bytes: int = DEFAULTS["max_bytes"]
    # The engine policy: pdfium, pypdf, or auto (PDFium, then pypdf); ADR 0103.
    extractor: str = DEFAULTS["extractor"]
    # A 1,000-page book at 20,000 characters a page: four times a dense page of print, and
    # at most 80 MB as a Python str, well inside the default memory_mb (ADR 0077).
    max_text_chars: int = DEFAULTS["max_text_chars"]
    # The longest text above in default chunks (800, overlap 100) is about 28,600 of them.
    max_chunks_per_doc: int = DEFAULTS["max_chunks_per_doc"]
    item_timeout_s: float = DEFAULTS["item_timeout_s"]
    memory_mb: int = DEFAULTS["memory_mb"]
    max_attempts: int = DEFAULTS["max_attempts"]
    lease_s: float = DEFAULTS["lease_s"]
    max_retry_after_s: float = DEFAULTS["max_retry_after_s"]
    # The summarize stage (ADR 0107): its chat model (None: the connection's extra
    # "chat_model", else DEFAULT_CHAT_MODEL), its instruction, how much text it reads, and
    # the answer's length limit. All four are in its key: editing one redoes the summaries.
    summary_model: str | None = None
    summary_prompt: str = DEFAULTS["summary_prompt"]
    summary_input_chars: int = DEFAULTS["summary_input_chars"]
    summary_max_tokens: int = DEFAULTS["summary_max_tokens"]
    # Keep an answer cut off at summary_max_tokens (marked truncated) instead of failing its
    # document as truncated (ADR 0134); part of the key when set.
    summary_keep_truncated: bool = DEFAULTS["summary_keep_truncated"]
    # The run fails when the documents it dead-lettered are more than this share of those it
    # had work for; None: dead letters never fail a run (ADR 0116).
    max_dead_fraction: float | None = None
    # A run over a whole source retracts what its listing lost only up to this share of the
    # documents the last listing held, or exactly confirm_retract documents (ADR 0138).
    max_retract_fraction: float = DEFAULTS["max_retract_fraction"]
    confirm_retract: int | None = None
    rerun: Mapping[str, Any] | None = None
    redrive: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        for name, (low, high) in BOUNDS.items():
            value = getattr(self, name)
            if name == "batch_size" and isinstance(value, str):
                if value != AUTO:
                    raise ValueError(
                        f"batch_size: must be {AUTO!r} or a number from {low:g} to {high:g}, "
                        f"got {value!r}"
                    )
            elif value is not None or name not in OPTIONAL:
                _within(name, value, low, high)
        check_engine(self.extractor)
        if self.embed_mode not in EMBED_MODES:
            raise ValueError(
                f"embed_mode: must be one of {list(EMBED_MODES)}, got {self.embed_mode!r}"
            )
        # Which names a pipeline has is its own check (stage.Pipeline.check, in plan).
        unnamed = [s for s in self.stages or () if not is_stage_name(s)]
        if unnamed or self.stages == ():
            raise ValueError(f"stages: {unnamed or 'empty'} is not a list of stage names")
        if self.item_timeout_s >= self.lease_s:
            raise ValueError(
                f"item_timeout_s ({self.item_timeout_s}) must be below lease_s ({self.lease_s}), "
                "or a slow item would lose its lease while still running"
            )
        try:
            check_chunking(self.chunk_size, self.chunk_overlap)  # now, not mid-batch
        except ValueError as error:
            raise ValueError(f"chunk_size and chunk_overlap: {error}") from None
        if not isinstance(self.summary_keep_truncated, bool):
            keep = self.summary_keep_truncated
            raise ValueError(f"summary_keep_truncated: must be true or false, got {keep!r}")
        if not isinstance(self.summary_prompt, str) or not self.summary_prompt.strip():
            raise ValueError("summary_prompt: must be a text with words in it")
        if self.rerun and self.redrive:
            raise ValueError("rerun and redrive: give one or the other, not both")
        for name, value in (("rerun", self.rerun), ("redrive", self.redrive)):
            if value and not is_stage_name(value.get("stage")):
                raise ValueError(f"{name}.stage: {value.get('stage')!r} is not a stage name")
        times = [
            (f"{name}.{key}", selection.get(key))
            for name, selection in (("rerun", self.rerun), ("redrive", self.redrive))
            for key in ("since", "until")
            if selection
        ]
        for name, moment in times:
            if moment is None:
                continue
            try:
                datetime.fromisoformat(moment)
            except (TypeError, ValueError):
                raise ValueError(f"{name}: {moment!r} is not an ISO 8601 time") from None

    @property
    def first_stage(self) -> str | None:
        """The stage a re-run or redrive starts from, if this run is one."""
        selection = self.rerun or self.redrive
        return str(selection["stage"]) if selection else None

    @property
    def revives_dead(self) -> bool:
        """Whether this run reopens dead items of its first stage (a re-run that asks for them)."""
        if not self.rerun:
            return False
        statuses = self.rerun.get("status")
        return statuses is None or "dead" in statuses

    def batch_deadline_s(self, documents: int) -> float:
        """How long one try of a stage task may take over ``documents`` under these settings.

        Every document may use its whole item timeout, one after another; the batch may wait
        out one lease of a worker that died holding its items, and one provider Retry-After.
        Capped at :data:`BATCH_DEADLINE_CAP_S`, so that it ends before the task's
        execution_timeout.
        """
        budget = documents * self.item_timeout_s + self.lease_s + self.max_retry_after_s
        return min(budget, BATCH_DEADLINE_CAP_S)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> PipelineSettings:
        """Build settings from DAG params, ignoring keys that other tasks use."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in params.items() if k in known and v is not None}
        if "stages" in values:
            values["stages"] = tuple(values["stages"])
        return cls(**values)


# The keys a run's conf may hold beside the settings' own: those of its nested selections
# (params.py's schema allows exactly these, test_params checks it).
RERUN_KEYS = ("stage", "status", "error_class", "code_version_lt", "since", "doc_ids")
REDRIVE_KEYS = ("stage", "error_class", "ids", "since", "until", "reason", "by")


def conf_keys() -> tuple[str, ...]:
    """The top-level keys a DAG-run conf of ``document_pipeline`` may hold: its params."""
    return tuple(f.name for f in fields(PipelineSettings))


def check_conf_keys(conf: Mapping[str, Any]) -> None:
    """Refuse every key of ``conf`` that no param has, naming it and the nearest known one.

    Airflow validates each param's value, but takes any other key into a run's conf without
    a word, so a typo would run on the defaults (ADR 0077). The nested ``rerun`` and
    ``redrive`` selections are checked by their own keys, named ``rerun.since`` and so on.
    """
    problems = _unknown(conf, conf_keys(), "")
    for name, keys in (("rerun", RERUN_KEYS), ("redrive", REDRIVE_KEYS)):
        if isinstance(selection := conf.get(name), Mapping):
            problems += _unknown(selection, keys, f"{name}.")
    if problems:
        raise ValueError(f"conf: {'; '.join(problems)}")


def _unknown(given: Mapping[str, Any], known: tuple[str, ...], prefix: str) -> list[str]:
    problems = []
    for key in given:
        if key in known:
            continue
        nearest = difflib.get_close_matches(str(key), known, n=1)
        if nearest:
            problems.append(
                f"unknown key {prefix + str(key)!r} (did you mean {prefix + nearest[0]!r}?)"
            )
        else:
            listed = ", ".join(prefix + k for k in known)
            problems.append(f"unknown key {prefix + str(key)!r}; the known keys are {listed}")
    return problems


def _within(name: str, value: Any, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ValueError(f"{name}: must be a number from {low:g} to {high:g}, got {value!r}")
