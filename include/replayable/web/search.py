"""The UI's search: the chunks nearest a question, for the search page and its JSON twin.

A search embeds the question through the model connection ``replayable_model`` and reads
the chunks nearest it (:mod:`replayable.search`, ADR 0118). Unlike a page it waits on
another service, so it keeps to ADR 0073 in its own way: it runs in a thread of its own, at
most :data:`SEARCHES_AT_ONCE` of them and refused at once beyond that, never in the worker
threads that Airflow's routes share; and it takes one of the UI's database connections only
to read, never while the provider is asked. Each logged-in user makes at most
``[replayable] searches_per_user_per_minute`` searches a minute, counted in the ledger for
every API server process, and each search is counted as theirs, its model call too (ADR
0153). What it writes (that count, its slot and send time in the shared request budget, its
model call's record, the first build of a model's index) goes through the ledger's own
connection ``replayable_db``, since the UI's role may write none of it.

A refusal names what to fix and never an address or a key:

* 400: the input; the message starts with the parameter (``q``, ``k``, ``source``, ``model``,
  ``mode``, ``run``, ``dimensions``);
* 429: the user's searches this minute reached the limit (named, with its setting), with
  Retry-After the seconds to the next minute;
* 502: the model provider failed or could not be reached (its error class);
* 503: a connection the search needs is missing or unusable (named), a database is
  unavailable, the search took too long, or every search slot is taken.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Annotated, Literal

import anyio
import httpx
import psycopg2
import psycopg2.errors
from airflow.sdk.exceptions import AirflowNotFoundException
from fastapi import HTTPException, Query, Request

from replayable import config
from replayable.db import DatabaseUnavailableError
from replayable.retry import ItemError, classify
from replayable.search import (
    DEFAULT_MODE,
    MAX_K,
    RunSettings,
    Scope,
    SearchError,
    TooManySearches,
    admit,
    check_dimensions,
    check_k,
    check_mode,
    check_query,
    described,
    dimensions_refused,
    prepare,
    ranked,
    resolve,
    scope_of,
)
from replayable.search.model import DIMENSIONS
from replayable.vocabulary import LEDGER_CONN_ID, MODEL_CONN_ID
from replayable.web.database import pooled, unavailable
from replayable.web.models import SearchAnswer
from replayable.web.pool import RETRY_AFTER_S, ConnectionPool

if TYPE_CHECKING:
    from replayable.models.choice import ModelChoice

log = logging.getLogger(__name__)

DEFAULT_K = 10
MAX_QUERY_CHARS = 2000
MAX_SOURCE_CHARS = 4096
MAX_MODEL_CHARS = 200
# Searches running at once per API server process. Each holds a thread and, while the
# provider answers, a slot of the shared request budget, which the pipeline's tasks need too.
SEARCHES_AT_ONCE = 2
# Text the inputs may hold: no control characters (Postgres refuses NUL, terminals act on the
# rest), except that a question may hold tabs and line breaks, which the search collapses.
QUESTION_PATTERN = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*$"
NAME_PATTERN = r"^[^\x00-\x1f\x7f]*$"
# replayable.search names the question "query"; the URL names it q.
_PARAMETERS = {"query": "q"}

# The JSON twin's parameters, typed for clients and the schema; the page takes each as text
# and shows what is wrong with it in the page.
Question = Annotated[str, Query(max_length=MAX_QUERY_CHARS, pattern=QUESTION_PATTERN)]
Hits = Annotated[int, Query(ge=1, le=MAX_K)]
Source = Annotated[str | None, Query(max_length=MAX_SOURCE_CHARS, pattern=NAME_PATTERN)]
ModelName = Annotated[str | None, Query(max_length=MAX_MODEL_CHARS, pattern=NAME_PATTERN)]
Mode = Annotated[Literal["vector", "text", "hybrid"], Query()]
# As a run asks the model for them, or 0: the model's own size (ADR 0151).
Dimensions = Annotated[int | None, Query(ge=0, le=int(DIMENSIONS[1]))]


@dataclass(frozen=True)
class SearchInput:
    """A search as asked, checked: the question, how many chunks, a URI prefix, a model, a
    ranking, whose settings and which dimensions."""

    q: str
    k: int = DEFAULT_K
    source: str | None = None
    model: str | None = None
    mode: str = DEFAULT_MODE
    run: str | None = None
    dimensions: int | None = None


def _refused(detail: str) -> HTTPException:
    return HTTPException(HTTPStatus.BAD_REQUEST, detail)


def _named(error: SearchError) -> str:
    """The message of ``error`` with its input named as the URL names it."""
    name, colon, rest = str(error).partition(":")
    return f"{_PARAMETERS.get(name, name)}{colon}{rest}" if colon else str(error)


def _text(name: str, value: str, limit: int, pattern: str) -> str:
    if len(value) > limit:
        raise _refused(f"{name}: at most {limit} characters, not {len(value)}")
    if not re.fullmatch(pattern, value):
        raise _refused(f"{name}: no control characters")
    return value


def search_input(
    q: str,
    k: int | str | None = None,
    source: str | None = None,
    model: str | None = None,
    mode: str | None = None,
    run: str | None = None,
    dimensions: int | str | None = None,
) -> SearchInput:
    """The search asked for, checked; 400 naming the parameter when it cannot be made.

    ``k`` and ``dimensions`` may come as the page's text (blank: :data:`DEFAULT_K`, and the
    settings' dimensions); a blank ``source`` or ``model`` means none (the model
    connection's model), a blank ``mode`` the default, a blank ``run`` the pipeline's most
    recent complete run (ADR 0152). ``dimensions`` 0 is the model's own size (ADR 0151).
    """
    _text("q", q, MAX_QUERY_CHARS, QUESTION_PATTERN)
    if k is None or (isinstance(k, str) and not k.strip()):
        k = DEFAULT_K
    try:
        count = int(k)
    except ValueError:
        raise _refused(f"k: a whole number from 1 to {MAX_K}, not {k!r}") from None
    source = _text("source", source, MAX_SOURCE_CHARS, NAME_PATTERN) if source else None
    model = _text("model", model.strip(), MAX_MODEL_CHARS, NAME_PATTERN) if model else None
    run = _text("run", run.strip(), MAX_MODEL_CHARS, NAME_PATTERN) if run else None
    if isinstance(dimensions, str):
        dimensions = dimensions.strip() or None
    try:
        size = None if dimensions is None else int(dimensions)
    except ValueError:
        raise _refused(dimensions_refused(dimensions)) from None
    try:
        return SearchInput(
            check_query(q),
            check_k(count),
            source,
            model or None,
            check_mode(mode.strip() if mode and mode.strip() else DEFAULT_MODE),
            run or None,
            None if size is None else check_dimensions(size),
        )
    except SearchError as error:
        raise _refused(_named(error)) from None


async def find(request: Request, asked: SearchInput, user: str) -> SearchAnswer:
    """Search as ``asked`` in a search thread, counted as ``user``'s (the Airflow user's
    name); 503 at once when every one is busy, 429 past the user's searches a minute."""
    limiter: anyio.CapacityLimiter = request.app.state.searches
    if limiter.available_tokens < 1:
        raise HTTPException(
            HTTPStatus.SERVICE_UNAVAILABLE,
            f"{SEARCHES_AT_ONCE} searches are running, as many as the UI runs at once; "
            "try again in a moment.",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    run = functools.partial(
        _search, request.app.state.pool, request.app.state.ledger_dsn_provider, asked, user
    )
    return await anyio.to_thread.run_sync(run, limiter=limiter)


def _search(
    pool: ConnectionPool, ledger_dsn_provider: Callable[[], str], asked: SearchInput, user: str
) -> SearchAnswer:
    """:func:`replayable.search.answer`, with a UI connection taken only to read; counted
    as ``user``'s once it is resolved, before it writes or pays for anything (ADR 0153)."""
    with pooled(pool, readonly=True) as conn:
        try:
            scope, choice = resolve(
                conn, asked.model, run_id=asked.run, dimensions=asked.dimensions, scope_for=_scope
            )
        except SearchError as error:
            raise _refused(_named(error)) from None
    dsn = _ledger_dsn(ledger_dsn_provider)
    _admit(dsn, user)
    try:
        vector = prepare(asked.q, scope, choice, dsn, mode=asked.mode, searched_by=user)
        with pooled(pool, readonly=True) as conn:
            found = ranked(
                conn, asked.q, scope, vector, mode=asked.mode, k=asked.k, source=asked.source
            )
            found = described(conn, found, scope, dsn)
    except SearchError as error:
        raise _refused(_named(error)) from None
    except (httpx.HTTPError, ItemError) as error:
        raise _provider_failed(error) from None
    except psycopg2.errors.QueryCanceled:
        raise HTTPException(
            HTTPStatus.SERVICE_UNAVAILABLE,
            f"The search took longer than {pool.statement_timeout_s:g} s and was cancelled; "
            "narrow it with source, or ask for fewer chunks (k).",
        ) from None
    except (psycopg2.OperationalError, psycopg2.InterfaceError, DatabaseUnavailableError) as error:
        # The ledger's own connection: the budget, the call's record or the index build.
        log.warning("a replayable UI search cannot reach the ledger: %s", error)
        raise unavailable() from None
    return SearchAnswer.model_validate(found.as_dict())


def _admit(dsn: str, user: str) -> None:
    """Count ``user``'s search (ADR 0153); 429 with Retry-After past their limit."""
    try:
        admit(dsn, user, config.searches_per_user_per_minute())
    except TooManySearches as refused:
        raise HTTPException(
            HTTPStatus.TOO_MANY_REQUESTS,
            str(refused),
            headers={"Retry-After": str(refused.retry_after_s)},
        ) from None
    except (psycopg2.OperationalError, psycopg2.InterfaceError, DatabaseUnavailableError) as error:
        log.warning("a replayable UI search cannot reach the ledger: %s", error)
        raise unavailable() from None


def _scope(
    model: str | None,
    dag_id: str,
    conn_id: str,
    run: RunSettings | None,
    dimensions: int | None = None,
) -> tuple[Scope, ModelChoice]:
    """What the search reads and the model choice that embeds the question; 503 naming the
    model connection when it is not defined or its fields cannot be read."""
    try:
        return scope_of(model, dag_id, conn_id, run, dimensions)
    except AirflowNotFoundException:
        raise HTTPException(
            HTTPStatus.SERVICE_UNAVAILABLE,
            f"Searching needs the Airflow connection {MODEL_CONN_ID!r}, the model provider "
            "that embeds the question; it is not defined.",
        ) from None
    except ValueError as error:
        log.warning("the model connection %r cannot be read: %s", MODEL_CONN_ID, error)
        raise HTTPException(
            HTTPStatus.SERVICE_UNAVAILABLE,
            f"The Airflow connection {MODEL_CONN_ID!r} cannot be read; the API server's log "
            "says which field is wrong.",
        ) from None


def _ledger_dsn(provider: Callable[[], str]) -> str:
    try:
        return provider()
    except AirflowNotFoundException:
        raise HTTPException(
            HTTPStatus.SERVICE_UNAVAILABLE,
            f"Searching needs the Airflow connection {LEDGER_CONN_ID!r}, where it records its "
            "model call; it is not defined.",
        ) from None


def _provider_failed(error: Exception) -> HTTPException:
    """502 with the failure's error class: its message may hold the provider's address."""
    failure = classify(error)
    log.warning("a replayable UI search failed at the model provider: %s", failure.message)
    if failure.error_class in ("http_401", "http_403"):
        hint = f"check the API key of the Airflow connection {MODEL_CONN_ID!r}"
    elif failure.error_class == "connect_error":
        hint = (
            f"it could not be reached: check the host of the Airflow connection {MODEL_CONN_ID!r}"
        )
    else:
        hint = "try again in a moment"
    return HTTPException(
        HTTPStatus.BAD_GATEWAY,
        f"The model provider failed to embed the question ({failure.error_class}); {hint}.",
    )
