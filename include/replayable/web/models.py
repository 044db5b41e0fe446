"""The UI's data shapes: what the JSON API returns and the pages render, and its refusals.

Each model is a response schema of the API (``api/...``); the pages render the same objects,
so a page and its JSON twin cannot disagree. The rows of the read model
(:mod:`replayable.views`) and of a search are schemas as they are (:class:`StageSummary`,
:class:`UserSearches`) or the base of one (:class:`ModelCostSummary`, :class:`SearchHit`,
:class:`RunSummary` and its link), never copied field by field. :data:`ANY_ROUTE` and its
kin document every refusal a route can answer with, for clients and the schema fuzzer.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

import pydantic
from pydantic import BaseModel, computed_field

from replayable import airflow_http, views
from replayable.search.model import Hit
from replayable.views import StageSummary, UserSearches
from replayable.vocabulary import PIPELINE_DAG_ID


class OutboxSummary(BaseModel):
    """The event outbox (ADR 0072): events waiting (the backlog), published and dead.

    ``oldest_pending_age_s`` is how long the oldest waiting event has waited (None: none).
    """

    pending: int = 0
    published: int = 0
    dead: int = 0
    oldest_pending_age_s: float | None = None

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented pattern
    @property
    def oldest_wait(self) -> str | None:
        """The oldest wait for people: "2 h 5 min", "12 min"."""
        if self.oldest_pending_age_s is None:
            return None
        minutes = int(self.oldest_pending_age_s // 60)
        return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


@pydantic.dataclasses.dataclass(frozen=True)
class ModelCostSummary(views.ModelCost):
    """Answered calls of one model and mode, their tokens and cost (ADR 0110)."""


class CostSummary(BaseModel):
    """What model calls cost in the last ``days`` days, in USD at the connection's prices;
    ``unpriced_calls`` had no price and count 0."""

    days: int
    usd: float = 0.0
    unpriced_calls: int = 0
    by_model: list[ModelCostSummary] = []


class SearchSummary(BaseModel):
    """Searches per user in the last ``days`` days (UTC), the costliest first (ADR 0153)."""

    days: int
    by_user: list[UserSearches] = []


@pydantic.dataclasses.dataclass(frozen=True)
class RunSummary(views.RunCost):
    """A recent run and what its model calls cost: reported, or so far while it runs."""

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented pattern
    @property
    def link(self) -> str:
        """The run in Airflow's UI, relative to Airflow's base URL."""
        return airflow_http.run_path(self.dag_id, self.run_id)


class IndexSummary(BaseModel):
    """Documents out of search because their sources lost them (ADR 0138), and how many of
    those the sweep has purged after the retention."""

    retracted: int = 0
    purged: int = 0


class Summary(BaseModel):
    """Every stage (in pipeline order, empty ones too), the open dead letters in all, the
    outbox, the retracted documents, what model calls cost lately, each user's searches and
    what they cost, and the newest runs with their cost."""

    stages: list[StageSummary]
    open_dead_letters: int
    outbox: OutboxSummary = OutboxSummary()
    index: IndexSummary = IndexSummary()
    cost: CostSummary | None = None
    searches: SearchSummary | None = None
    runs: list[RunSummary] = []


class AirflowLinks(BaseModel):
    """Where a row's work happened in Airflow's UI, relative to Airflow's base URL (ADR 0060).

    ``run`` is the DAG run, ``task_instance`` the ``batch.<stage>`` task instance (its details)
    and ``log`` its log, of the recorded try when there is one.
    """

    run: str
    task_instance: str
    log: str


def _links(
    dag_id: str | None,
    run_id: str | None,
    stage: str,
    map_index: int | None,
    try_number: int | None,
) -> AirflowLinks | None:
    found = airflow_http.task_links(
        dag_id=dag_id, run_id=run_id, stage=stage, map_index=map_index, try_number=try_number
    )
    return AirflowLinks(**dataclasses.asdict(found)) if found else None


class FailedItem(BaseModel):
    """An item whose current status in a stage is failed."""

    stage: str
    item_key: str
    doc_id: str
    uri: str | None
    attempts: int
    error_class: str | None
    last_error: str | None
    code_version: str
    dag_id: str | None
    run_id: str | None
    map_index: int | None
    try_number: int | None = None
    updated_at: datetime

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented pattern
    @property
    def links(self) -> AirflowLinks | None:
        """The item's last task try in Airflow's UI."""
        return _links(self.dag_id, self.run_id, self.stage, self.map_index, self.try_number)


class FailedList(BaseModel):
    """Failed items, newest first; ``matched`` counts them all, ``items`` up to the limit.

    ``next_after`` is the keyset cursor of the next page (pass it as ``after``), if any.
    """

    matched: int
    items: list[FailedItem]
    next_after: str | None = None


class LetterChange(BaseModel):
    """One change to a dead letter: who, when, and what the letter became."""

    at: datetime
    actor: str
    action: str
    status: str
    owner: str | None
    note: str | None
    resolution: str | None


class DeadLetter(BaseModel):
    """One row of the dead-letter queue, with its full error, its resolution and history."""

    id: int
    stage: str
    item_key: str
    doc_id: str
    uri: str | None
    error_class: str
    error_kind: str
    error: str
    traceback: str | None
    attempts: int
    code_version: str
    dag_id: str | None
    run_id: str | None
    map_index: int | None
    try_number: int | None = None
    status: str
    owner: str | None
    note: str | None
    created_at: datetime
    resolved_at: datetime | None
    resolved_by: str | None
    resolution: str | None = None
    history: list[LetterChange] = []

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented pattern
    @property
    def links(self) -> AirflowLinks | None:
        """The task try that dead-lettered the item, in Airflow's UI."""
        return _links(self.dag_id, self.run_id, self.stage, self.map_index, self.try_number)


class DeadLetterList(BaseModel):
    """Dead letters, newest first; ``matched`` counts them all; ``next_after`` pages on."""

    matched: int
    dead_letters: list[DeadLetter]
    next_after: str | None = None


class HourCount(BaseModel):
    """Dead letters created in the hour that starts at ``hour`` (UTC)."""

    hour: datetime
    created: int


class LettersPerHour(BaseModel):
    """Dead letters created per hour over the last ``hours`` hours, the current hour last."""

    hours: int
    per_hour: list[HourCount]
    total: int
    peak: int


class RedriveRun(BaseModel):
    """One redrive run asked of Airflow: a stage's letters, and the run or Airflow's answer."""

    stage: str
    letters: int
    documents: int
    conf: dict[str, Any]
    dag_id: str = PIPELINE_DAG_ID  # the pipeline whose run made the letters
    run_id: str | None = None
    run_link: str | None = None  # relative to Airflow's base URL
    refused: str | None = None


@pydantic.dataclasses.dataclass(frozen=True)
class SearchHit(Hit):
    """A chunk a search found: its document, its place in it (``ordinal``), its cosine
    similarity to the question, and the chunk's first characters."""


class SearchCoverage(BaseModel):
    """What a search covered: the documents done under its settings, and those left out,
    by why (``other_settings``: done only under other settings; ``failed``, ``dead``,
    ``unfinished``)."""

    documents: int
    left_out: dict[str, int]
    counted_at: str | None  # when it was counted (ISO 8601), for a count kept a few minutes


class SearchAnswer(BaseModel):
    """A search's answer (:meth:`replayable.search.Answer.as_dict`): the question as searched,
    the model whose vectors were read and their dimensions as asked (null: the model's
    own), the run whose settings were searched (null: the defaults; ADR 0152), whether every
    vector was read (``exact``), how the chunks were ranked (``mode``: vector, text or
    hybrid), what the search covered, and the chunks, best first."""

    query: str
    model: str
    dimensions: int | None
    run_id: str | None
    exact: bool
    mode: str
    coverage: SearchCoverage | None
    hits: list[SearchHit]


class Problem(BaseModel):
    """Why a request was refused."""

    detail: str


# Documented so that clients (and the schema fuzzer) know every answer a route can give.
Responses = dict[int | str, dict[str, Any]]


class InvariantViolation(BaseModel):
    """One row of the ledger that breaks one invariant (``replayable.invariants``)."""

    invariant: str
    stage: str | None
    doc_id: str | None
    item_key: str | None
    detail: str


class CheckReport(BaseModel):
    """What ``replayable check`` finds: violations per invariant (all counted, at most
    ``limit`` listed each) and the items in flight (running under an expired lease)."""

    quiescent: bool
    clean: bool
    totals: dict[str, int]
    violations: list[InvariantViolation]
    in_flight_total: int
    in_flight: list[InvariantViolation]


def problem(description: str) -> dict[str, Any]:
    """A documented refusal: ``description``, with a :class:`Problem` as its JSON body."""
    # Inline and always JSON: with `model`, FastAPI would document a page's refusals as HTML.
    schema = {**Problem.model_json_schema(), "additionalProperties": False}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def page_problem(description: str, *, json_too: bool = False) -> dict[str, Any]:
    """A refusal a page shows in itself, as HTML; ``json_too`` when the route's dependencies
    may answer the same status as JSON (:data:`ANY_ROUTE`)."""
    content: dict[str, Any] = problem(description)["content"] if json_too else {}
    content["text/html"] = {"schema": {"type": "string"}}
    return {"description": description, "content": content}


ANY_ROUTE: Responses = {
    401: problem("Not logged in to Airflow"),
    403: problem("Not allowed (role), or a cross-origin post"),
    503: problem("The database is unavailable, busy, or the query took too long"),
}
PAGED: Responses = {400: problem("`after` is not a page cursor")}
ONE: Responses = {404: problem("No such dead letter")}
_SEARCH_400 = "The question, k, source or model cannot be searched; the message names which"
_SEARCH_502 = "The model provider failed or could not be reached"
_SEARCH_503 = (
    "The database is unavailable, busy, or the query took too long; a connection the search "
    "needs is missing or unusable; or as many searches as the UI runs at once are running"
)
_SEARCH_429 = (
    "The user made [replayable] searches_per_user_per_minute searches this minute; "
    "Retry-After says when the next minute begins"
)
SEARCHED: Responses = {
    400: problem(_SEARCH_400),
    429: problem(_SEARCH_429),
    502: problem(_SEARCH_502),
    503: problem(_SEARCH_503),
}
SEARCH_PAGE: Responses = {
    400: page_problem(_SEARCH_400),
    429: page_problem(_SEARCH_429),
    502: page_problem(_SEARCH_502),
    503: page_problem(_SEARCH_503, json_too=True),
}
