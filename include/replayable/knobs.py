"""The run knobs, declared once: each is a row of :data:`KNOBS`.

A row holds the knob's default, its bounds, its JSON-schema type, the description the
trigger form shows and, for the knobs the model connection also sets, its connection field.
Every surface that shows or checks a knob reads its row: :class:`~replayable.settings.
PipelineSettings` (defaults and bounds), the DAG's Params (:mod:`replayable.airflow.params`),
the connection form (:mod:`replayable.airflow.get_provider_info`) and the stage specs'
defaults (ADR 0154). Nothing here imports anything of the package but the vocabulary.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from replayable.vocabulary import ITEM_LEASE_S, ITEM_MAX_ATTEMPTS

# The embeddings model a run uses when neither its conf nor the model connection names one.
DEFAULT_MODEL = "text-embedding-3-small"
# The summarize stage's chat model, by the same chain (conf, the connection's chat_model).
DEFAULT_CHAT_MODEL = "gpt-4o-mini"
# Requests in flight to the model provider, shared by every task, when the connection
# does not say (ADR 0086).
DEFAULT_MAX_IN_FLIGHT = 4
DEFAULT_PROMPT = (
    "Summarise the following document in at most three sentences, for a reader deciding "
    "whether to open it. Answer with the summary only."
)
# batch_size's automatic value: sized by pipeline.plan_batches (ADR 0104).
AUTO = "auto"
# How the embed stage reaches the provider: a request at a time, or the Batch API.
EMBED_MODES = ("sync", "batch")
# The extract engine policies a run can choose (ADR 0103); ``auto`` is PDFium, then pypdf.
ENGINES = ("pdfium", "pypdf", "auto")
DEFAULT_ENGINE = "pdfium"

# Strings that reach SQL, keys or logs: no control characters (Postgres refuses NUL, and a
# terminal acts on the rest). The end is written so that Python's re and ECMA-262 agree.
TEXT_PATTERN = r"^(?![\s\S]*[\x00-\x1f\x7f])"
# Text people write at length (a prompt): line breaks and tabs, no other control characters.
PROSE_PATTERN = r"^(?![\s\S]*[\x00-\x08\x0b-\x1f\x7f])"


@dataclass(frozen=True)
class ConnectionField:
    """The model connection's extra field of the same name, in Airflow's connection form."""

    label: str
    description: str
    schema: Mapping[str, Any]


@dataclass(frozen=True)
class Knob:
    """One run knob: what every surface that shows or checks it reads.

    :param name: the conf key and the :class:`PipelineSettings` field.
    :param kind: its JSON-schema type (``integer``, ``number``, ``string``, ``boolean``).
    :param default: the value a run gets when its conf leaves it out.
    :param bounds: the documented range, inclusive, checked at trigger time and again where
        the value is used, so that whoever triggers a run cannot switch a guard off (ADR 0012).
    :param nullable: None is a value (each such row says what None means).
    :param description: what the trigger form says of it.
    :param schema: the rest of its JSON schema (enum, lengths, pattern).
    :param connection: its field on the model connection, where the connection sets it too.
    """

    name: str
    kind: str
    default: Any = None
    bounds: tuple[float, float] | None = None
    nullable: bool = False
    description: str | None = None
    schema: Mapping[str, Any] = field(default_factory=dict)
    connection: ConnectionField | None = None

    def json_schema(self) -> dict[str, Any]:
        """The knob's JSON schema, as the DAG's Param checks it."""
        kind: str | list[str] = ["null", self.kind] if self.nullable else self.kind
        found: dict[str, Any] = {"type": kind, **self.schema}
        if self.bounds is not None:
            number = int if self.kind == "integer" else float
            found.update(minimum=number(self.bounds[0]), maximum=number(self.bounds[1]))
        return found


_MODEL_NAME = {"minLength": 1, "maxLength": 200, "pattern": TEXT_PATTERN}

KNOBS: tuple[Knob, ...] = (
    Knob("batch_size", "integer", AUTO, (1, 10_000)),
    Knob(
        "model",
        "string",
        None,
        nullable=True,
        schema=_MODEL_NAME,
        description="Embedding model sent to the provider; default: the connection's "
        f'extra "model", else {DEFAULT_MODEL}.',
        connection=ConnectionField(
            "Model",
            "Embedding model sent with each request, unless a run's params name one.",
            {"type": ["string", "null"]},
        ),
    ),
    Knob(
        "dimensions",
        "integer",
        None,
        (1, 8192),
        nullable=True,
        description="Embedding size, for models that accept one.",
        connection=ConnectionField(
            "Dimensions",
            "Output size, for models that accept one; empty for the model's own.",
            {"type": ["integer", "null"], "minimum": 1},
        ),
    ),
    Knob("chunk_size", "integer", 800, (50, 100_000)),
    Knob("chunk_overlap", "integer", 100, (0, 50_000)),
    Knob(
        "embed_inputs_per_call",
        "integer",
        32,
        (1, 2048),
        description="Chunks per provider request; chunks of several documents share one.",
    ),
    Knob(
        "embed_mode",
        "string",
        "sync",
        schema={"enum": list(EMBED_MODES)},
        description="sync: each embeddings request answered at once; batch: the "
        "provider's Batch API, half the price, done within 24 h while the task waits "
        "on the triggerer without a worker slot.",
    ),
    # How often a task in batch mode reads its provider batches while it waits (ADR 0117).
    Knob(
        "batch_poll_s",
        "number",
        60.0,
        (0.1, 3600),
        description="In batch mode, how often the triggerer reads the provider's "
        "batches while the task waits for them.",
    ),
    Knob(
        "max_in_flight",
        "integer",
        None,
        (1, 256),
        nullable=True,
        description="Provider requests in flight at once, across every task and worker; "
        f'default: the connection\'s extra "max_in_flight", else {DEFAULT_MAX_IN_FLIGHT}.',
        connection=ConnectionField(
            "Max requests in flight",
            "The provider's budget of concurrent requests, shared by every worker.",
            {"type": ["integer", "null"], "minimum": 1},
        ),
    ),
    Knob(
        "max_rps",
        "number",
        None,
        (0.01, 100_000),
        nullable=True,
        description="Provider requests per second, across every task and worker; "
        'default: the connection\'s extra "max_rps", else no limit.',
    ),
    # A share of the documents a run had work for (ADR 0116).
    Knob(
        "max_dead_fraction",
        "number",
        None,
        (0, 1),
        nullable=True,
        description="Fail the run when the documents it dead-letters are more than this "
        "share (0 to 1) of the documents it had work for; default: dead letters never "
        "fail a run, its report lists them.",
    ),
    # A share of the documents a source's last listing held (ADR 0138): 0.2 at most, so a
    # run's conf can only lower it; confirm_retract is the override for a larger removal.
    Knob(
        "max_retract_fraction",
        "number",
        0.2,
        (0, 0.2),
        description="A run over a whole source retracts the documents its listing lost "
        "(deleted or changed files) only up to this share of the documents its last "
        "listing held; over it, or from an empty listing, it retracts nothing and says "
        "why. At most 0.2: a run can only lower it.",
    ),
    Knob(
        "confirm_retract",
        "integer",
        None,
        (1, 1_000_000_000),
        nullable=True,
        description="Retract past max_retract_fraction: the exact number of documents "
        "a refused run said it would retract (an empty listing never retracts).",
    ),
    Knob(
        "max_bytes",
        "integer",
        20 * 2**20,
        (1, 2**30),
        description="Larger documents are dead-lettered unread (at most 1 GiB).",
    ),
    Knob(
        "extractor",
        "string",
        DEFAULT_ENGINE,
        schema={"enum": list(ENGINES)},
        description="PDF reader: pdfium (fast, native), pypdf (pure Python), or auto "
        "(pdfium, then pypdf where pdfium refuses a file or finds no text).",
    ),
    # A 1,000-page book at 20,000 characters a page: four times a dense page of print, and
    # at most 80 MB as a Python str, well inside the default memory_mb (ADR 0077). Text past
    # it is a poison document, dead-lettered as oversize_text. At most 250 M characters: even
    # at 4 UTF-8 bytes each that fits a Postgres field (1 GiB).
    Knob(
        "max_text_chars",
        "integer",
        20_000_000,
        (1, 250_000_000),
        description="A document whose text is longer is dead-lettered as oversize_text "
        "(the default fits a 1,000-page book).",
    ),
    # The longest default text in default chunks (800, overlap 100) is about 28,600 of them.
    # The top fits the longest text above in default chunks (about 357,000) and keeps one
    # document within a million rows.
    Knob(
        "max_chunks_per_doc",
        "integer",
        50_000,
        (1, 1_000_000),
        description="A document cut into more chunks is dead-lettered as oversize_text.",
    ),
    Knob("item_timeout_s", "number", 60.0, (0.1, 3600)),
    Knob("memory_mb", "integer", 1024, (64, 16_384)),
    Knob("max_attempts", "integer", ITEM_MAX_ATTEMPTS, (1, 20)),
    Knob("lease_s", "number", ITEM_LEASE_S, (1, 86_400)),
    Knob(
        "max_retry_after_s",
        "number",
        300.0,
        (0, 3600),
        description="The longest wait a provider's Retry-After can impose on a task retry.",
    ),
    Knob(
        "summary_model",
        "string",
        None,
        nullable=True,
        schema=_MODEL_NAME,
        description="Chat model of the summarize stage; default: the connection's extra "
        f'"chat_model", else {DEFAULT_CHAT_MODEL}.',
    ),
    Knob(
        "summary_prompt",
        "string",
        DEFAULT_PROMPT,
        schema={"minLength": 1, "maxLength": 20_000, "pattern": PROSE_PATTERN},
        description="The summarize stage's instruction, sent before the document's text. "
        "It is part of the stage's key: editing it redoes every summary, and nothing else.",
    ),
    # A summary reads at most this much of a document's text (a long book's first pages).
    Knob(
        "summary_input_chars",
        "integer",
        12_000,
        (100, 1_000_000),
        description="How much of a document's text (from its start) a summary reads.",
    ),
    Knob(
        "summary_max_tokens",
        "integer",
        200,
        (1, 16_384),
        description="The longest summary, in tokens (the request's max_tokens).",
    ),
    Knob(
        "summary_keep_truncated",
        "boolean",
        False,
        description="Keep a summary cut off at summary_max_tokens, marked truncated, "
        "instead of dead-lettering its document as truncated.",
    ),
)

KNOB: dict[str, Knob] = {knob.name: knob for knob in KNOBS}
# Each knob's default, by name: PipelineSettings' fields take theirs from here.
DEFAULTS: dict[str, Any] = {knob.name: knob.default for knob in KNOBS}
# Every numeric knob's documented range (the DAG's params use the same numbers).
BOUNDS: dict[str, tuple[float, float]] = {
    knob.name: knob.bounds for knob in KNOBS if knob.bounds is not None
}
# The numeric knobs that may be None (each row's description says what None means).
OPTIONAL: tuple[str, ...] = tuple(
    knob.name for knob in KNOBS if knob.nullable and knob.kind in ("integer", "number")
)


def check_engine(engine: str) -> None:
    """Refuse an extract engine policy that is not one of :data:`ENGINES`, naming the knob."""
    if engine not in ENGINES:
        raise ValueError(f"extractor: {engine!r} is not one of {list(ENGINES)}")


def check_chunking(size: int, overlap: int) -> None:
    """Refuse a chunk size and overlap the chunker cannot cut by (overlap under half the size)."""
    if size < 50:
        raise ValueError(f"chunk size must be at least 50 characters, got {size}")
    if not 0 <= overlap < size // 2:
        raise ValueError(f"chunk overlap must be in [0, size/2), got {overlap} for size {size}")
