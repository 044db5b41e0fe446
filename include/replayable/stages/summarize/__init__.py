"""The summarize stage: one summary per document through an OpenAI-compatible chat endpoint.

``config`` holds what shapes a summary (model, prompt, how much text, the answer's length),
``client`` the HTTP client (classified retries with ``Retry-After``, an ``Idempotency-Key``
per call, the shared budget as a gate), ``spec`` the stage's keys, input and output. A
refusal or an empty answer is an item error, not a summary. The package itself imports none
of them, so reading :data:`VERSION` stays cheap.
"""

from __future__ import annotations

VERSION = "1.0"
