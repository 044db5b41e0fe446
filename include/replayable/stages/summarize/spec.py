"""The summarize stage as a :class:`~replayable.runner.StageSpec`: keys, input and output.

An item is one document's extracted text, keyed by the document, the extractor and the
text's hash plus the summarizer's version, chat model, prompt, the text it reads and the
answer's length (:class:`~replayable.stages.summarize.config.SummaryConfig`). It is an
artifact stage (:mod:`replayable.stages.artifact`), as a stage of your own would be: its
output is an ``artifacts`` row addressed by content (the same text under the same config is
one answer, whichever documents hold it) and the item's ``item_artifacts`` row; each answer
is asked for under an advisory lock on that address and committed with its call records in
the transaction that paid for it (ADR 0107). What is its own is the call: the chat client,
the shared budget, the Idempotency-Key and the call records.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from replayable.budget import RequestBudget
from replayable.db import Connection, Database, fetch_all
from replayable.knobs import DEFAULT_MAX_IN_FLIGHT
from replayable.models.chat import ChatResult
from replayable.models.http import CallRecord, Gate
from replayable.retry import ErrorKind, ItemError
from replayable.runner import BatchIO, StageSpec, WorkItem
from replayable.stages import extract, summarize
from replayable.stages.artifact import TEXT_STAGE, ArtifactBatch, ArtifactSpec, Document, Produced
from replayable.stages.embed.packing import estimate_tokens
from replayable.stages.lineage import summary_lineage
from replayable.stages.model_calls import correct_tokens, record_calls
from replayable.stages.summarize.config import SummaryConfig


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
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    # Read when the stage is built, as the planner reads them (stages.lineage.spec_hashes).
    extractor_version: str = field(default_factory=extract.extractor_id)
    code_version: str = field(default_factory=lambda: summarize.VERSION)
    name: str = "summarize"
    # How long a request's transaction may sit idle (its call, retries and waits included)
    # before Postgres ends its session and frees its lock; None: no limit (see EmbedSpec).
    max_call_s: float | None = None
    systemic_after: int = 5
    # Whether it announces its documents: an instance field, as an ArtifactSpec's is, set
    # from the pipeline it runs in (``Pipeline.announces``).
    last_stage: bool = False  # type: ignore[misc]

    def __post_init__(self) -> None:
        if not self.config.model:
            raise ValueError("summary_model: a chat model is required (a param or the connection)")
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")

    def key_config(self) -> dict[str, Any]:
        return self.config.key()

    def lineage(self) -> dict[str, Any]:
        return summary_lineage(self.config, self.extractor_version)

    def artifacts(self) -> ArtifactSpec:
        """The artifact stage this one is, with the chat call as what produces an output."""
        return ArtifactSpec(
            name=self.name,
            code_version=self.code_version,
            key=self.key_config(),
            reads=TEXT_STAGE,
            input_hash=self.extractor_version,
            connect=self.connect,
            produce=self._ask,
            extractor_version=self.extractor_version,
            input_chars=self.config.input_chars,
            workers=self.max_in_flight,
            max_call_s=self.max_call_s,
            systemic_after=self.systemic_after,
        )

    def plan(self, conn: Connection, doc_ids: Sequence[str]) -> list[WorkItem]:
        return self.artifacts().plan(conn, doc_ids)

    def process(self, items: Sequence[WorkItem], io: BatchIO) -> None:
        ArtifactBatch(self.artifacts(), io).run(items)

    def _ask(self, conn: Connection, item: WorkItem, document: Document) -> Produced:
        """One chat completion for ``document``, inside the item's transaction ``conn``."""
        text = document.text or ""
        if not text.strip():
            raise ItemError("empty_text", "the extracted text has no words")
        prompt = self.config.prompt
        messages = [{"role": "system", "content": prompt}, {"role": "user", "content": text}]
        estimate = estimate_tokens(len(prompt.encode()) + len(text.encode()))
        estimate += self.config.max_tokens
        calls: list[CallRecord] = []

        def record(on: Connection) -> None:
            share = {item.item_key: 1}
            attempt = document.attempt
            record_calls(
                on, calls, stage=self.name, run_id=self.run_id, attempt=attempt, share=share
            )

        try:
            result = self.provider.complete(
                messages,
                idempotency_key=self._request_key(conn, item),
                on_call=calls.append,
                gate=lambda: self.budget.slot(conn, estimate),
            )
        except Exception:
            # The failed tries are billable records too; commit them, then report.
            correct_tokens(self.budget, estimate, calls, self.name)
            record(conn)
            conn.commit()
            raise
        correct_tokens(self.budget, estimate, calls, self.name)
        if result.truncated and not self.config.keep_truncated:
            # The client was told to keep it but this key was not: never a full summary.
            record(conn)
            conn.commit()
            raise ItemError(
                "truncated", f"the answer was cut off ({result.finish_reason})", ErrorKind.TERMINAL
            )
        data: dict[str, Any] = {
            "summary": result.text,
            "model": self.config.model,
            "finish_reason": result.finish_reason,
            "tokens": result.tokens,
        }
        if result.truncated:
            data["truncated"] = True
        return Produced(data, record)

    def _request_key(self, conn: Connection, item: WorkItem) -> str:
        """The Idempotency-Key of the item's request: its answer's content address, so that
        a replay after a lost answer or a killed task is never charged again. An item revived
        from a dead letter (a refusal, an empty answer) asks anew: the key then also counts
        the letters it came back from, or the provider would replay the same refusal."""
        params = {"stage": self.name, "item_key": item.item_key}
        letters = int(fetch_all(conn, "stages/item_letters", params)[0]["n"])
        key = f"replayable-summarize-{str(item.payload[0])[:40]}"
        return f"{key}-revived-{letters}" if letters else key
