"""Items of a stage that reads each document's extracted text (chunk, summarize).

Such an item is keyed by the document, the extraction it reads (extractor version and engine
policy) and the text's hash, plus the stage's version and key config: the same text read
again under another extractor version keys to a new item, whose work may be shared by
content address.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from replayable.db import Connection, fetch_all
from replayable.keys import item_key
from replayable.runner import StageSpec, WorkItem


def text_items(
    conn: Connection,
    spec: StageSpec,
    doc_ids: Sequence[str],
    *,
    extractor_version: str,
    payload: Callable[[Mapping[str, Any]], Any],
    max_text_chars: int | None = None,
) -> list[WorkItem]:
    """The documents of ``doc_ids`` whose extraction exists, keyed for ``spec``.

    ``payload`` makes each item's payload from its extraction's row (``doc_id``,
    ``text_sha256``, ``text_bytes``, and ``text_chars`` where the bytes pass
    ``max_text_chars``).
    """
    rows = fetch_all(
        conn,
        "stages/extractions_for",
        {
            "doc_ids": list(doc_ids),
            "extractor_version": extractor_version,
            "max_text_chars": max_text_chars,
        },
    )
    cfg = spec.key_config()
    return [
        WorkItem(
            row["doc_id"],
            item_key(
                spec.name,
                spec.code_version,
                cfg,
                [row["doc_id"], extractor_version, row["text_sha256"]],
            ),
            payload(row),
        )
        for row in rows
    ]
