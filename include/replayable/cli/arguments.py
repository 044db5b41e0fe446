"""Argument types of the command line: each converts one value or names what is wrong.

argparse turns an :class:`argparse.ArgumentTypeError` into a usage message naming the
option, and exit code 2.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

from replayable.vocabulary import STAGES, is_stage_name

# The same pattern as replayable.airflow.params (the CLI tests check that they agree); importing
# params here would load Airflow, which costs seconds on every command.
VERSION_PATTERN = r"^[0-9]{1,9}(\.[0-9]{1,9})*$"

_DOC_PREFIX = re.compile(r"[0-9a-f]{6,64}")


def stage(value: str) -> str:
    """A stage's name: a shipped one (extract, chunk, embed, summarize) or one of your own."""
    if not is_stage_name(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a stage name (lowercase letters, digits and _), e.g. "
            + ", ".join(STAGES)
        )
    return value


def dag_id(value: str) -> str:
    """A DAG id as Airflow allows it: letters, digits, ``_``, ``.`` and ``-``."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,250}", value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a DAG id")
    return value


def letter_id(value: str) -> int:
    """A dead-letter id: a positive bigint."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 0 < number < 2**63:
        raise argparse.ArgumentTypeError(f"{value!r} is not a dead-letter id")
    return number


def reason(value: str) -> str:
    """A redrive's reason: one line of 3 or more characters, stripped."""
    text = value.strip()
    if len(text) < 3 or re.search(r"[\x00-\x1f\x7f-\x9f]", text):
        raise argparse.ArgumentTypeError("give a reason of 3 or more characters on one line")
    return text


def version(value: str) -> str:
    """A code version such as 1.2 or 1.10.3."""
    if not re.fullmatch(VERSION_PATTERN, value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a version such as 1.2 or 1.10.3")
    return value


def since(value: str) -> str:
    """An ISO 8601 time, given back with its zone (no zone given = local time)."""
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an ISO 8601 time such as 2024-05-01 or 2024-05-01T12:00:00Z"
        ) from None
    # The conf must name its zone to mean the same on every worker.
    return moment.astimezone().isoformat()


def doc_prefix(value: str) -> str:
    """A document id (sha256 hex), or a prefix of 6 or more of its digits, in lower case."""
    value = value.strip().lower()
    if not _DOC_PREFIX.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a document id (sha256 hex) or a prefix of 6 or more of its digits"
        )
    return value


def non_empty(value: str) -> str:
    """Any text but blank."""
    if not value.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return value


def positive(kind: Callable[[str], float]) -> Callable[[str], Any]:
    """A converter to a positive number of ``kind`` (``int`` or ``float``)."""

    def convert(value: str) -> Any:
        try:
            number = kind(value)
        except ValueError:
            number = 0
        if number <= 0:
            raise argparse.ArgumentTypeError(f"{value!r} is not a positive number")
        return number

    convert.__name__ = kind.__name__  # argparse names the type in its messages
    return convert


def dimensions(value: str) -> int:
    """A search's dimensions: as a run asks the model, or 0 for its own size (ADR 0151)."""
    from replayable.search.model import SearchError, check_dimensions, dimensions_refused

    try:
        return check_dimensions(int(value))
    except ValueError as error:
        message = str(error) if isinstance(error, SearchError) else dimensions_refused(value)
        raise argparse.ArgumentTypeError(message.removeprefix("dimensions: ")) from None
