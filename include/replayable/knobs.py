"""The run knobs' defaults, declared once: every surface that shows or checks one reads it here."""

from __future__ import annotations

# The embeddings model a run uses when neither its conf nor the model connection names one.
DEFAULT_MODEL = "text-embedding-3-small"
# The summarize stage's chat model, by the same chain (conf, the connection's chat_model).
DEFAULT_CHAT_MODEL = "gpt-4o-mini"
# Requests in flight to the model provider, shared by every task, when the connection
# does not say (ADR 0086).
DEFAULT_MAX_IN_FLIGHT = 4

# How the embed stage reaches the provider: a request at a time, or the Batch API.
EMBED_MODES = ("sync", "batch")
