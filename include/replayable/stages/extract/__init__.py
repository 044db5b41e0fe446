"""The extract stage: text from each document's PDF, parsed in a guarded worker process.

``pdf`` holds the work (pypdf, run in a worker), ``spec`` the stage's keys, input and output.
The package itself imports neither, so reading :data:`VERSION` stays cheap.
"""

from __future__ import annotations

# Sanitising left this at 1.0: it only alters text that Postgres refused before, so no
# stored extraction changes; documents that died on such text come back with a redrive.
VERSION = "1.0"
