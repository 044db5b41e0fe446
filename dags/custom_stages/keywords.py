"""A stage of your own: each document's most frequent words, as JSON.

It reads the extracted text and needs no model, so it runs anywhere; a stage that calls a
model writes the same ``process`` around its client. Replayable keys, claims, retries,
dead-letters and stores its output (README, "Write your own stage").
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from replayable import ArtifactStage, Document
from replayable.retry import ItemError

WORD = re.compile(r"[^\W\d_]{4,}")


class Keywords(ArtifactStage):
    """The ``top`` most frequent words of four letters or more, with their counts."""

    name = "keywords"
    reads = "extract"
    version = "1.0"
    input_chars = 200_000

    def __init__(self, top: int = 10) -> None:
        self.top = top

    def config(self) -> dict[str, Any]:
        return {"top": self.top}  # part of the key: another top redoes every document

    def process(self, document: Document) -> dict[str, Any]:
        words = Counter(w.lower() for w in WORD.findall(document.text or ""))
        if not words:
            # Terminal: the same text never has words; the document is dead-lettered at once.
            raise ItemError("no_words", "the extracted text has no words of four letters")
        return {"keywords": [[word, n] for word, n in words.most_common(self.top)]}
