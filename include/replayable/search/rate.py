"""Each user's searches: admitted up to a limit per minute and counted per day in the ledger
(ADR 0153), so that every API server process shares one count."""

from __future__ import annotations

import getpass

from replayable.db import Database, fetch_all

# The option that sets the UI's limit, as a refusal names it.
LIMIT_SETTING = "[replayable] searches_per_user_per_minute"


class TooManySearches(Exception):
    """``user`` has made ``limit`` searches this minute; the next minute is
    ``retry_after_s`` seconds away."""

    def __init__(self, user: str, limit: int, retry_after_s: int) -> None:
        self.user = user
        self.limit = limit
        self.retry_after_s = retry_after_s
        super().__init__(
            f"At most {limit} searches a minute per user ({LIMIT_SETTING}); "
            f"try again in {retry_after_s} s."
        )


def admit(dsn: str, user: str, limit: int | None) -> None:
    """Count a search of ``user`` in their minute and their day, through ``dsn`` (the
    ledger's own connection); :class:`TooManySearches` when their minute already holds
    ``limit`` searches, and then nothing is counted. ``limit`` None: never refused."""
    params = {"username": user, "limit": limit}
    database = Database(dsn)
    try:
        (found,) = database.transaction(
            lambda conn: fetch_all(conn, "search/admit", params), describe="search/admit"
        )
    finally:
        database.close()
    if found["searches"] is None:
        raise TooManySearches(user, limit or 0, int(found["retry_after_s"]))


def cli_user() -> str:
    """Whom ``replayable search`` counts a search under: ``cli:`` and the OS user."""
    try:
        name = getpass.getuser()
    except (KeyError, OSError):  # a uid with no name (some containers)
        name = "unknown"
    return f"cli:{name}"
