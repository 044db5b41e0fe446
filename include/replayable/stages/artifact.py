"""Stages whose output per document is JSON the framework stores: your own, and summarize.

Subclass :class:`ArtifactStage`, set ``name`` (and ``reads``, ``version``), and write
:meth:`ArtifactStage.process`: it gets one :class:`Document` (the start of its extracted
text, or the output of the stage it reads) and returns a JSON object. Everything else is the
framework's (ADR 0107, 0108):

- the item key: the document, the input's content address, the stage's version and
  :meth:`ArtifactStage.config`;
- check-before-call: an output already stored under its content address (the same input,
  version and config, from any document) is linked, and ``process`` is not called;
- a lease-protected claim, and an advisory lock on the content address while ``process``
  runs, so two workers never compute the same output;
- the output stored in the transaction that computed it, before the item is marked done;
- classified retries, the attempt cap and dead letters: raise
  :class:`~replayable.retry.ItemError` with your own error class (terminal unless the class
  names a passing condition such as ``rate_limited``, or you pass the kind), any other
  exception is ``unexpected`` and retried up to the cap;
  raise :class:`~replayable.runner.SystemicStopError` to stop the batch without blaming any
  item.

Outputs live in ``replayable.artifacts`` (by stage and content address) and
``replayable.item_artifacts`` (which output each item produced).
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from replayable.db import Connection, Database, execute, fetch_all
from replayable.keys import canonical_json, item_key, sha256_bytes
from replayable.retry import ErrorKind, ItemError, classify
from replayable.runner import BatchIO, StageSpec, SystemicStopError, WorkItem, Write
from replayable.stage import BuildContext, Models, Stage
from replayable.stages.model_calls import FailureStreak, Sessions
from replayable.stages.texts import text_items

# The stage whose output is the document's extracted text (the only input that is not JSON).
TEXT_STAGE = "extract"


@dataclass(frozen=True)
class Document:
    """One document's input to an artifact stage.

    ``text``: the start of its extracted text (``input_chars`` of it), for a stage that
    reads ``extract``; ``data``: the JSON output of the artifact stage it reads otherwise.
    ``attempt`` is this item's attempt in the stage (1 for its first).
    """

    doc_id: str
    text: str | None = None
    data: Mapping[str, Any] | None = None
    attempt: int = 1


@dataclass(frozen=True)
class Produced:
    """An output computed for an item, and what else its transaction writes (call records)."""

    data: Mapping[str, Any]
    record: Callable[[Connection], None] | None = None


class ArtifactStage(Stage):
    """A stage that turns each document's input into a JSON object; see the module.

    Class attributes: ``name``; ``reads`` (``extract``, the default, or an artifact stage
    before it); ``version``; ``input_chars``, how much of the text a stage reading
    ``extract`` gets; ``workers``, how many documents of a batch it works on at once;
    ``max_item_s``, how long ``process`` may hold its output's lock: past it the item's
    database session ends, so that a worker frozen in ``process`` holds no peer up (its
    output, if it ever comes, is still stored, by a new session).
    """

    reads: str | None = TEXT_STAGE
    writes_artifacts = True
    input_chars: int = 100_000
    workers: int = 1
    max_item_s: float = 600.0

    def config(self) -> dict[str, Any]:
        """What shapes this stage's output besides its code: part of every item key, so
        changing a value redoes exactly this stage's items (and those of its readers)."""
        return {}

    @abstractmethod
    def process(self, document: Document) -> Mapping[str, Any]:
        """The output for one document: a JSON object (keys are strings)."""

    def check_input(self, source: Stage | None) -> str | None:
        if source is not None and (source.name == TEXT_STAGE or source.writes_artifacts):
            return None
        what = "the document itself" if source is None else f"{source.name!r}"
        why = (
            "an artifact stage never reads the document itself; the first stage of a"
            " pipeline is EXTRACT (replayable.stages.builtin)"
            if source is None
            else "its output is not a JSON artifact"
        )
        return (
            f"stage {self.name!r} reads {what}: {why}. An ArtifactStage reads {TEXT_STAGE!r}"
            " (the text) or another artifact stage (an ArtifactStage, summarize)"
        )

    def key_config(self, settings: Any, models: Models) -> dict[str, Any]:
        found = dict(self.config())
        if self.reads == TEXT_STAGE:
            found["input_chars"] = self.input_chars
        return found

    def build(self, ctx: BuildContext) -> StageSpec:
        from replayable.stages.extract import extractor_id

        if self.reads is None:
            raise ValueError(f"stage {self.name!r}: an artifact stage reads another stage")
        key = self.key_config(ctx.settings, ctx.models)
        return ArtifactSpec(
            name=self.name,
            code_version=self.version,
            key=key,
            reads=self.reads,
            input_hash=ctx.spec_hashes[self.reads],
            connect=ctx.connect,
            produce=lambda conn, item, document: Produced(_checked(self, document)),
            extractor_version=extractor_id(ctx.settings.extractor),
            input_chars=self.input_chars,
            workers=self.workers,
            max_call_s=self.max_item_s,
            last_stage=bool(self.last) if ctx.announces is None else ctx.announces,
        )


def _checked(stage: ArtifactStage, document: Document) -> Mapping[str, Any]:
    data = stage.process(document)
    if not isinstance(data, Mapping):
        raise ItemError(
            "bad_output",
            f"stage {stage.name!r} returned {type(data).__name__}, not a JSON object",
            ErrorKind.TERMINAL,
        )
    try:
        json.dumps(data, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ItemError(
            "bad_output", f"stage {stage.name!r} returned what JSON cannot hold: {error}"
        ) from error
    return data


@dataclass
class ArtifactSpec(StageSpec):
    """The spec of a stage whose outputs are artifacts: plan, check, lock, produce, store.

    ``produce(conn, item, document)`` computes one output inside the item's transaction
    (``conn``: for a budget slot and call records); ``key`` is the stage's key config,
    ``input_hash`` the spec hash of the stage it reads (its lineage).
    """

    name: str
    code_version: str
    key: dict[str, Any]
    reads: str
    input_hash: str
    connect: Callable[[], Database]
    produce: Callable[[Connection, WorkItem, Document], Produced]
    extractor_version: str = ""
    input_chars: int = 100_000
    workers: int = 1
    # How long an item's transaction may sit idle (while it produces) before Postgres ends
    # its session and frees its lock; None: no limit (see EmbedSpec.max_call_s).
    max_call_s: float | None = None
    systemic_after: int = 5
    # An instance field here: StageSpec declares it a ClassVar, as the shipped specs set it
    # per class, while an artifact stage's comes from its definition's ``last``.
    last_stage: bool = False  # type: ignore[misc]

    def key_config(self) -> dict[str, Any]:
        return dict(self.key)

    def lineage(self) -> dict[str, Any]:
        return {**self.key, "input": self.input_hash}

    def artifact_key(self, input_address: str) -> str:
        """An output's content address: this stage's version and key over this input."""
        what = {"version": self.code_version, **self.key, "input": input_address}
        return sha256_bytes(canonical_json(what).encode())

    def plan(self, conn: Connection, doc_ids: Sequence[str]) -> list[WorkItem]:
        if self.reads == TEXT_STAGE:
            return text_items(
                conn,
                self,
                doc_ids,
                extractor_version=self.extractor_version,
                payload=lambda row: (self.artifact_key(row["text_sha256"]), None),
            )
        rows = fetch_all(
            conn,
            "stages/artifact_inputs",
            {"stage": self.reads, "doc_ids": list(doc_ids), "spec_hash": self.input_hash},
        )
        cfg = self.key_config()
        return [
            WorkItem(
                row["doc_id"],
                item_key(self.name, self.code_version, cfg, [row["doc_id"], row["artifact_key"]]),
                (self.artifact_key(row["artifact_key"]), row["artifact_key"]),
            )
            for row in rows
        ]

    def process(self, items: Sequence[WorkItem], io: BatchIO) -> None:
        ArtifactBatch(self, io).run(items)


class ArtifactBatch:
    """One batch: outputs already stored are linked, the rest produced in parallel."""

    def __init__(self, spec: ArtifactSpec, io: BatchIO) -> None:
        self.spec = spec
        self.io = io
        self.streak = FailureStreak(spec.systemic_after)
        self.sessions = Sessions(spec.connect)
        # Outputs produced but not committed yet, by content address: kept across a lost
        # database connection, so that storing them again never produces (or pays) again.
        self._produced: dict[str, Produced] = {}

    def run(self, items: Sequence[WorkItem]) -> None:
        try:
            stored = self._stored([_address(item) for item in items])
            todo = []
            for item in items:
                if _address(item) in stored:
                    self.io.done(item, [self._link(item)])  # produced already
                else:
                    todo.append(item)
            workers = max(1, min(self.spec.workers, len(todo)))
            with ThreadPoolExecutor(workers, thread_name_prefix=self.spec.name) as threads:
                list(threads.map(self._one, todo))
        finally:
            self.sessions.close()

    def _stored(self, keys: list[str]) -> set[str]:
        rows = self.sessions.get().transaction(
            lambda conn: fetch_all(
                conn, "stages/artifacts_stored", {"stage": self.spec.name, "keys": keys}
            ),
            describe=f"{self.spec.name}: check",
        )
        return {row["artifact_key"] for row in rows}

    def _one(self, item: WorkItem) -> None:
        if self.io.stopping:
            return  # the runner releases it without spending an attempt
        try:
            if not self.io.holds(item):
                raise ItemError("lease_lost", "another worker took the item over")
            self.sessions.get().transaction(
                lambda conn: self._produce_in(conn, item), describe=f"{self.spec.name}: produce"
            )
        except SystemicStopError as stopped:
            self.io.stop(stopped.error)
            return
        except Exception as error:
            stop = self.streak.failed(error)
            if stop is not None:
                self.io.stop(stop)
            if classify(error).kind is not ErrorKind.SYSTEMIC:
                self.io.failed(item, error)  # a systemic stop releases it, spending nothing
            return
        self.streak.succeeded()
        self.io.done(item, [self._link(item)])

    def _produce_in(self, conn: Connection, item: WorkItem) -> None:
        """Lock, re-check, produce and store one output, all in one transaction."""
        spec = self.spec
        address = _address(item)
        produced = self._produced.get(address)
        if produced is None:
            if spec.max_call_s is not None:
                ms = str(round(spec.max_call_s * 1000))
                fetch_all(conn, "ledger/limit_idle_transaction", {"ms": ms})
            # Waits while a peer produces the same output; then finds it stored.
            fetch_all(conn, "stages/lock_artifact", {"stage": spec.name, "key": address})
            if fetch_all(conn, "stages/artifacts_stored", {"stage": spec.name, "keys": [address]}):
                return
            produced = spec.produce(conn, item, self._input(conn, item))
            self._produced[address] = produced  # kept before anything else can fail
        execute(
            conn,
            "stages/insert_artifact",
            {"stage": spec.name, "key": address, "data": canonical_json(dict(produced.data))},
        )
        if produced.record is not None:
            produced.record(conn)
        self._produced.pop(address, None)

    def _input(self, conn: Connection, item: WorkItem) -> Document:
        spec = self.spec
        attempt = self.io.attempt(item)
        if spec.reads == TEXT_STAGE:
            rows = fetch_all(
                conn,
                "stages/extraction_text_head",
                {
                    "doc_id": item.doc_id,
                    "extractor_version": spec.extractor_version,
                    "chars": spec.input_chars,
                },
            )
            if not rows:
                raise ItemError(
                    "missing_input", "the document's extraction is gone", ErrorKind.RETRYABLE
                )
            return Document(item.doc_id, text=str(rows[0]["text"] or ""), attempt=attempt)
        rows = fetch_all(
            conn, "stages/artifact_data", {"stage": spec.reads, "key": item.payload[1]}
        )
        if not rows:
            raise ItemError("missing_input", "the input's output is gone", ErrorKind.RETRYABLE)
        return Document(item.doc_id, data=rows[0]["data"], attempt=attempt)

    def _link(self, item: WorkItem) -> Write:
        """The item's output: which stored artifact it produced."""
        return Write(
            "stages/insert_item_artifact",
            [(self.spec.name, item.item_key, item.doc_id, _address(item))],
        )


def _address(item: WorkItem) -> str:
    return str(item.payload[0])
