"""The list filters, declared once: what a page, its JSON twin and the change forms take.

The failed list and the dead-letter list each have one set of filters. A FastAPI dependency
reads them from the query string (:data:`FailedQuery`, :data:`LetterQuery`) for a page and
for its API twin alike; the change forms carry the dead-letter list's filters along as form
fields (:data:`LetterForm`), so that the answer leads back to the list they came from. Each
builds the same frozen dataclass, which also says how the filter form shows the values and
how a next-page link carries them.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

from fastapi import Depends, Form, Path, Query
from pydantic import AfterValidator, BeforeValidator, StringConstraints

from replayable import views
from replayable.stage import NAME_PATTERN
from replayable.web.models import DeadLetterList, FailedList

# A stage's name: the shipped ones (replayable.vocabulary.STAGES) or one of your own.
Stage = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
# replayable.vocabulary.DEAD_LETTER_STATUSES and "all" for any; a test checks.
LetterStatus = Literal["open", "redriven", "ignored", "all"]
Limit = Annotated[int, Query(ge=1, le=500)]
After = Annotated[str | None, Query(max_length=400, pattern=r"^[A-Za-z0-9_-]+$")]
ErrorClass = Annotated[str, StringConstraints(max_length=200, pattern=r"^[A-Za-z0-9_.:, -]*$")]
ErrorClasses = Annotated[list[ErrorClass] | None, Query(max_length=50)]
LetterId = Annotated[int, Path(ge=1, le=2**63 - 1)]  # a bigserial


def _blank_is_none(value: object) -> object:
    # The filter forms' "any" choice submits an empty value.
    return None if value == "" else value


def _utc(moment: datetime | None) -> datetime | None:
    """A time without a zone is UTC, as the pages show every time."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    try:
        return moment.astimezone(UTC)
    except OverflowError:
        raise ValueError("out of the range of dates") from None


StageFilter = Annotated[Stage | None, BeforeValidator(_blank_is_none), Query()]
MomentFilter = Annotated[
    datetime | None, BeforeValidator(_blank_is_none), AfterValidator(_utc), Query()
]
# The same filters as the change forms post them back.
StageField = Annotated[Stage | None, BeforeValidator(_blank_is_none), Form()]
MomentField = Annotated[
    datetime | None, BeforeValidator(_blank_is_none), AfterValidator(_utc), Form()
]
ErrorClassField = Annotated[ErrorClass, Form(max_length=2000)]
StatusField = Annotated[LetterStatus, Form()]
LimitField = Annotated[int, Form(ge=1, le=500)]


def error_classes(values: list[str] | None) -> list[str] | None:
    """The distinct classes asked for (repeated or comma-separated), or None for any."""
    parts = (part.strip() for value in values or [] for part in value.split(","))
    # The filter form's empty text box submits "": that means any class, not class "".
    return views.unique(p for p in parts if p)


def filter_time(moment: datetime | None) -> str:
    """A time as the date filters show and take it: UTC, to the second, without a zone."""
    if moment is None:
        return ""
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="seconds")


@dataclasses.dataclass(frozen=True)
class FailedFilters:
    """The failed list's filters: stage, error classes (None: any), page size and cursor."""

    stage: str | None = None
    error_classes: list[str] | None = None
    limit: int = 100
    after: str | None = None

    def shown(self) -> dict[str, Any]:
        """The filters as the page's form shows them and its links carry them."""
        return {
            "stage": self.stage,
            "error_class": ", ".join(self.error_classes or []),
            "limit": self.limit,
        }


@dataclasses.dataclass(frozen=True)
class LetterFilters:
    """The dead-letter list's filters; ``since`` is inclusive, ``until`` exclusive (UTC)."""

    stage: str | None = None
    status: str = "open"
    error_classes: list[str] | None = None
    since: datetime | None = None
    until: datetime | None = None
    limit: int = 100
    after: str | None = None

    def shown(self) -> dict[str, Any]:
        """The filters as the list's form shows them and its links carry them."""
        return {
            "stage": self.stage,
            "status": self.status,
            "error_class": ", ".join(self.error_classes or []),
            "since": filter_time(self.since),
            "until": filter_time(self.until),
            "limit": self.limit,
        }


def failed_filters(
    stage: StageFilter = None,
    error_class: ErrorClasses = None,
    limit: Limit = 100,
    after: After = None,
) -> FailedFilters:
    """The failed list's filters from the query string."""
    return FailedFilters(stage, error_classes(error_class), limit, after)


def letter_filters(
    stage: StageFilter = None,
    status: LetterStatus = "open",
    error_class: ErrorClasses = None,
    since: MomentFilter = None,
    until: MomentFilter = None,
    limit: Limit = 100,
    after: After = None,
) -> LetterFilters:
    """The dead-letter list's filters from the query string (a time without a zone is UTC)."""
    return LetterFilters(stage, status, error_classes(error_class), since, until, limit, after)


def open_letter_form(
    stage: StageField = None,
    error_class: ErrorClassField = "",
    since: MomentField = None,
    until: MomentField = None,
    limit: LimitField = 100,
) -> LetterFilters:
    """The list's filters as a form about open letters (a redrive's) posts them back."""
    return LetterFilters(stage, "open", error_classes([error_class]), since, until, limit)


def letter_form(
    filters: Annotated[LetterFilters, Depends(open_letter_form)],
    status: StatusField = "open",
) -> LetterFilters:
    """The list's filters, its status filter too, as a letter's change form posts them back."""
    return dataclasses.replace(filters, status=status)


FailedQuery = Annotated[FailedFilters, Depends(failed_filters)]
LetterQuery = Annotated[LetterFilters, Depends(letter_filters)]
LetterForm = Annotated[LetterFilters, Depends(letter_form)]
OpenLetterForm = Annotated[LetterFilters, Depends(open_letter_form)]


def kept(shown: dict[str, Any]) -> dict[str, Any]:
    """The filters a link carries: the ones that are set."""
    return {k: v for k, v in shown.items() if v not in (None, "")}


def next_query(shown: dict[str, Any], data: FailedList | DeadLetterList) -> str | None:
    """The query string of the next page: the same filters and the cursor."""
    if data.next_after is None:
        return None
    return urlencode({**kept(shown), "after": data.next_after})
