"""The chunk stage: each document's text split into overlapping, content-addressed chunks.

``chunker`` holds the work, ``spec`` the stage's keys, input and output. The package itself
imports neither, so reading :data:`VERSION` stays cheap.
"""

from __future__ import annotations

# Part of every chunk's content address (``chunker.chunk_id``) and of the chunker's key.
VERSION = "1.0"
