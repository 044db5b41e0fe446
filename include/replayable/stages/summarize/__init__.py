"""Summaries through an OpenAI-compatible ``/v1/chat/completions`` endpoint.

``client`` holds the HTTP client: one conversation per call, classified retries with
``Retry-After``, an ``Idempotency-Key`` per call, the shared budget as a gate, and every
request reported as a :class:`~replayable.stages.model_http.CallRecord`, as the embed
stage's client does. A refusal or an empty answer is an item error, not a summary.
"""
