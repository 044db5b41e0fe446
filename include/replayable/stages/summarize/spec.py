"""The summarize stage as a :class:`~replayable.runner.StageSpec`: keys, input and output.

An item is one document's extracted text, keyed by the document, the extractor and the
text's hash plus the summarizer's version, chat model, prompt, the text it reads and the
answer's length (:class:`~replayable.stages.summarize.config.SummaryConfig`). Its output is
an ``artifacts`` row addressed by content (the same text under the same config is one
answer, whichever documents hold it) and the item's ``item_artifacts`` row.

Each request is made in a transaction of its own, under an advisory lock on its artifact
key, and its answer and call records are committed with it, so an answer is paid for once
and never lost to a later failure: a peer that wants the same answer waits for the lock,
then finds it stored (ADR 0107).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from replayable.budget import RequestBudget
from replayable.db import Connection, Database, execute, fetch_all
from replayable.keys import canonical_json, sha256_bytes
from replayable.retry import ErrorKind, ItemError, classify
from replayable.runner import BatchIO, StageSpec, WorkItem, Write
from replayable.stages import extract, summarize
from replayable.stages.embed.packing import estimate_tokens
from replayable.stages.lineage import summary_lineage
from replayable.stages.model_calls import FailureStreak, Sessions, correct_tokens, record_calls
from replayable.stages.model_http import CallRecord, Gate
from replayable.stages.summarize.client import ChatResult
from replayable.stages.summarize.config import SummaryConfig
from replayable.stages.texts import text_items


class ChatProvider(Protocol):
    """What the stage needs of a chat client (:class:`HttpChatClient` is one)."""

    def complete(
        self,
        messages: Sequence[dict[str, str]],
        *,
        idempotency_key: str,
        on_call: Callable[[CallRecord], None] | None = None,
        gate: Gate | None = None,
    ) -> ChatResult: ...


@dataclass
class SummarizeSpec(StageSpec):
    """Summarise each document's extracted text with one chat completion."""

    provider: ChatProvider
    config: SummaryConfig
    connect: Callable[[], Database]
    budget: RequestBudget
    run_id: str | None = None
    max_in_flight: int = 4
    # Read when the stage is built, as the planner reads them (stages.lineage.spec_hashes).
    extractor_version: str = field(default_factory=extract.extractor_id)
    code_version: str = field(default_factory=lambda: summarize.VERSION)
    name: str = "summarize"
    # How long a request's transaction may sit idle (its call, retries and waits included)
    # before Postgres ends its session and frees its lock; None: no limit (see EmbedSpec).
    max_call_s: float | None = None
    systemic_after: int = 5

    def __post_init__(self) -> None:
        if not self.config.model:
            raise ValueError("summary_model: a chat model is required (a param or the connection)")
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")

    def key_config(self) -> dict[str, Any]:
        return self.config.key()

    def lineage(self) -> dict[str, Any]:
        return summary_lineage(self.config, self.extractor_version)

    def artifact_key(self, text_sha256: str) -> str:
        """The answer's content address: this version and config over this text."""
        what = {"version": self.code_version, **self.key_config(), "text": text_sha256}
        return sha256_bytes(canonical_json(what).encode())

    def plan(self, conn: Connection, doc_ids: Sequence[str]) -> list[WorkItem]:
        return text_items(
            conn,
            self,
            doc_ids,
            extractor_version=self.extractor_version,
            payload=lambda row: self.artifact_key(row["text_sha256"]),
        )

    def process(self, items: Sequence[WorkItem], io: BatchIO) -> None:
        _SummarizeBatch(self, io).run(items)


class _SummarizeBatch:
    """One batch: answers already stored are linked, the rest asked for in parallel."""

    def __init__(self, spec: SummarizeSpec, io: BatchIO) -> None:
        self.spec = spec
        self.io = io
        self.streak = FailureStreak(spec.systemic_after)
        self.sessions = Sessions(spec.connect)
        # Answers that came back but are not committed yet, by artifact key: kept across a
        # lost database connection so that storing them again never pays again.
        self._answered: dict[str, tuple[ChatResult, list[CallRecord]]] = {}

    def run(self, items: Sequence[WorkItem]) -> None:
        try:
            stored = self._stored([item.payload for item in items])
            todo = []
            for item in items:
                if item.payload in stored:
                    self.io.done(item, [_link(self.spec, item)])  # paid for already
                else:
                    todo.append(item)
            workers = max(1, min(self.spec.max_in_flight, len(todo)))
            with ThreadPoolExecutor(workers, thread_name_prefix="summarize") as threads:
                list(threads.map(self._one, todo))
        finally:
            self.sessions.close()

    def _stored(self, keys: list[str]) -> set[str]:
        rows = self.sessions.get().transaction(
            lambda conn: fetch_all(
                conn, "stages/artifacts_stored", {"stage": self.spec.name, "keys": keys}
            ),
            describe="summarize: check",
        )
        return {row["artifact_key"] for row in rows}

    def _one(self, item: WorkItem) -> None:
        if self.io.stopping:
            return  # the runner releases it without spending an attempt
        try:
            if not self.io.holds(item):
                raise ItemError("lease_lost", "another worker took the item over")
            self.sessions.get().transaction(
                lambda conn: self._summarize_in(conn, item), describe="summarize: request"
            )
        except Exception as error:
            stop = self.streak.failed(error)
            if stop is not None:
                self.io.stop(stop)
            if classify(error).kind is not ErrorKind.SYSTEMIC:
                self.io.failed(item, error)  # a systemic stop releases it, spending nothing
            return
        self.streak.succeeded()
        self.io.done(item, [_link(self.spec, item)])

    def _summarize_in(self, conn: Connection, item: WorkItem) -> None:
        """Lock, re-check, call and store one answer, all in one transaction."""
        spec = self.spec
        key = item.payload
        answered = self._answered.get(key)
        if answered is None:
            if spec.max_call_s is not None:
                ms = str(round(spec.max_call_s * 1000))
                fetch_all(conn, "ledger/limit_idle_transaction", {"ms": ms})
            # Waits while a peer asks for the same answer; then finds it stored.
            fetch_all(conn, "stages/lock_artifact", {"stage": spec.name, "key": key})
            if fetch_all(conn, "stages/artifacts_stored", {"stage": spec.name, "keys": [key]}):
                return
            text = self._text(conn, item)
            messages = [
                {"role": "system", "content": spec.config.prompt},
                {"role": "user", "content": text},
            ]
            size = len(spec.config.prompt.encode()) + len(text.encode())
            estimate = estimate_tokens(size) + spec.config.max_tokens
            calls: list[CallRecord] = []
            try:
                result = spec.provider.complete(
                    messages,
                    idempotency_key=self._request_key(conn, item),
                    on_call=calls.append,
                    gate=lambda: spec.budget.slot(conn, estimate),
                )
            except Exception:
                # The failed tries are billable records too; commit them, then report.
                correct_tokens(spec.budget, estimate, calls, spec.name)
                self._record(conn, item, calls)
                conn.commit()
                raise
            answered = (result, calls)
            self._answered[key] = answered  # kept before anything else can fail
            correct_tokens(spec.budget, estimate, calls, spec.name)
        result, calls = answered
        execute(
            conn,
            "stages/insert_artifact",
            {
                "stage": spec.name,
                "key": key,
                "data": canonical_json(
                    {
                        "summary": result.text,
                        "model": spec.config.model,
                        "finish_reason": result.finish_reason,
                        "tokens": result.tokens,
                    }
                ),
            },
        )
        self._record(conn, item, calls)
        self._answered.pop(key, None)

    def _request_key(self, conn: Connection, item: WorkItem) -> str:
        """The Idempotency-Key of the item's request: its answer's content address, so that
        a replay after a lost answer or a killed task is never charged again. An item revived
        from a dead letter (a refusal, an empty answer) asks anew: the key then also counts
        the letters it came back from, or the provider would replay the same refusal."""
        params = {"stage": self.spec.name, "item_key": item.item_key}
        letters = int(fetch_all(conn, "stages/item_letters", params)[0]["n"])
        key = f"replayable-summarize-{item.payload[:40]}"
        return f"{key}-revived-{letters}" if letters else key

    def _text(self, conn: Connection, item: WorkItem) -> str:
        rows = fetch_all(
            conn,
            "stages/extraction_text_head",
            {
                "doc_id": item.doc_id,
                "extractor_version": self.spec.extractor_version,
                "chars": self.spec.config.input_chars,
            },
        )
        if not rows:
            raise ItemError(
                "missing_input", "the document's extraction is gone", ErrorKind.RETRYABLE
            )
        text = str(rows[0]["text"] or "")
        if not text.strip():
            raise ItemError("empty_text", "the extracted text has no words")
        return text

    def _record(self, conn: Connection, item: WorkItem, calls: list[CallRecord]) -> None:
        record_calls(
            conn,
            calls,
            stage=self.spec.name,
            run_id=self.spec.run_id,
            attempt=self.io.attempt(item),
            share={item.item_key: 1},
        )


def _link(spec: SummarizeSpec, item: WorkItem) -> Write:
    """The item's output: which stored answer it produced."""
    return Write(
        "stages/insert_item_artifact", [(spec.name, item.item_key, item.doc_id, item.payload)]
    )
