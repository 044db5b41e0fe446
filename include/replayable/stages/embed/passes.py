"""What a pass of either embed mode keeps of its items: which items use each chunk, and the
error each item ends with."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from replayable.db import Database, fetch_all
from replayable.runner import BatchIO, WorkItem
from replayable.stages.embed.config import EmbedConfig, scope
from replayable.stages.embed.store import too_long


class EmbedPass:
    """The items of one pass over claimed items, by chunk, and the errors they end with."""

    def __init__(self, spec: EmbedConfig, items: Sequence[WorkItem], io: BatchIO) -> None:
        self.spec = spec
        self.io = io
        self.items = list(items)
        self.users: dict[str, list[WorkItem]] = defaultdict(list)
        for item in items:
            for cid in dict.fromkeys(item.payload):
                self.users[cid].append(item)
        self.errors: dict[str, BaseException] = {}
        self.tokens: dict[str, int] = {}  # estimated, by chunk still to buy

    def blame(self, chunk_id: str, error: BaseException) -> None:
        """Fail every item of this pass that uses ``chunk_id`` (unless it failed already)."""
        for item in self.users.get(chunk_id, ()):
            self.errors.setdefault(item.item_key, error)

    def _refuse_too_long(self) -> set[str]:
        """Fail the documents of chunks past the per-input limit, before anything is sent;
        return those chunks."""
        refused = too_long(self.tokens, self.spec.max_input_tokens)
        for cid, error in refused.items():
            self.blame(cid, error)
        return set(refused)

    def _of_chunks(
        self,
        database: Database,
        query: str,
        chunk_ids: Iterable[str],
        describe: str,
        **params: Any,
    ) -> list[dict[str, Any]]:
        """The rows of ``query`` for ``chunk_ids`` under the spec's model and dimensions."""
        scoped = {**scope(self.spec), "chunk_ids": sorted(chunk_ids), **params}
        return database.transaction(lambda conn: fetch_all(conn, query, scoped), describe=describe)
