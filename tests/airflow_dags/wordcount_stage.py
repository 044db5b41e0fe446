"""A stage defined only in tests/, for the shared Airflow's test bundle (shared_airflow.py).

Its poisons are the texts that carry ``POISON-A`` or ``POISON-B``: a terminal error of class
``poisoned_a`` or ``poisoned_b``. A text that carries ``OUTAGE`` stops the batch, as an
outage of a service the stage calls would, leaving the items it had not finished failed
under their cap. Both last until the file the environment variable ``WORDCOUNT_FIXED_FLAG``
names exists, which is how a test ships the fix.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from replayable import ArtifactStage, Document
from replayable.retry import Classified, ErrorKind, ItemError
from replayable.runner import SystemicStopError

FIXED_FLAG_ENV = "WORDCOUNT_FIXED_FLAG"


class WordCount(ArtifactStage):
    """The number of words of each document's text."""

    name = "wordcount"
    version = "1.0"

    def process(self, document: Document) -> dict[str, Any]:
        text = document.text or ""
        fixed = Path(os.environ.get(FIXED_FLAG_ENV, "/nonexistent")).exists()
        if "OUTAGE" in text and not fixed:
            raise SystemicStopError(
                Classified("outage", ErrorKind.SYSTEMIC, "the service the stage calls is down")
            )
        for marker in ("POISON-A", "POISON-B"):
            if marker in text and not fixed:
                raise ItemError(f"poisoned_{marker[-1].lower()}", f"the text carries {marker}")
        return {"words": len(text.split())}
