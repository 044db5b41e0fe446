"""The extract stage: text from each document's PDF, parsed in a guarded worker process.

``pdf`` holds the work (PDFium or pypdf, run in a worker), ``spec`` the stage's keys, input
and output. The package itself imports neither, so reading :data:`VERSION` stays cheap.
"""

from __future__ import annotations

# 2.0: PDFium by default, and one normalisation for both engines (line endings, control
# characters); 1.0 was pypdf alone.
VERSION = "2.0"

# The engine policies a run can choose (ADR 0103): the extractor knob's.
from replayable.knobs import DEFAULT_ENGINE as DEFAULT_ENGINE  # noqa: E402
from replayable.knobs import ENGINES as ENGINES  # noqa: E402
from replayable.knobs import check_engine  # noqa: E402


def extractor_id(engine: str = DEFAULT_ENGINE, version: str | None = None) -> str:
    """What names a document's extraction downstream: the code version and engine policy.

    The extractions table is keyed by it, and the chunk and embed stages' keys and lineage
    name it, so a run under another policy reads (or writes) its own extraction. ``VERSION``
    is read at the call, as the stages read it when they are built (ADR 0102).
    """
    check_engine(engine)
    return f"{VERSION if version is None else version}+{engine}"
