"""The local OpenAI-compatible model server, with fault injection, for demos and tests.

This server is for offline demos and tests only. Its vectors are feature hashes of the
input's words, not semantic embeddings: texts that share words land close together, but
synonyms, paraphrases and other languages do not. Never use them to judge retrieval
quality; the model ``local-wordllama-256`` (:mod:`~devtools.model_server.wordllama_model`)
is a small real model, loaded offline from its wheel, for when meaning matters.
Its chat completions are extractive summaries, the first sentences of the last user
message; never use them to judge a summary either.

It speaks enough of the OpenAI API for the pipeline's provider clients
(``POST /v1/embeddings``, ``POST /v1/chat/completions`` for summaries, and the Files and
Batch API for embeddings in batch mode), binds loopback
only, and behaves like a careful paid provider: it charges each successful request, remembers it
per ``Idempotency-Key`` and can inject faults at runtime (error statuses, ``Retry-After``,
latency, hangs, poison inputs, refusals, lost responses, a concurrency limit, a
tokens-per-minute limit, slow or padded bodies) so retry and replay behaviour can be
exercised without a network or a paid account. It also receives "document ready"
webhooks, standing in for a downstream system.

- :mod:`~devtools.model_server.limits`: the provider's size limits, which the faults may
  lower;
- :mod:`~devtools.model_server.faults`: the fault config and its JSON keys;
- :mod:`~devtools.model_server.ratelimit`: the token bucket behind ``max_tpm``;
- :mod:`~devtools.model_server.stats` and :mod:`~devtools.model_server.idempotency`: what
  ``GET /stats`` counts and the memory of charged responses by ``Idempotency-Key``;
- :mod:`~devtools.model_server.vectors`, :mod:`~devtools.model_server.chat` and
  :mod:`~devtools.model_server.errors`: the vectors and the summaries, the request and
  response bodies of each endpoint, the error bodies;
- :mod:`~devtools.model_server.batches`: ``/v1/files`` and ``/v1/batches``, a batch's life
  from upload to output and error files, and its faults (partial failure, expiry, cancel,
  a lost upload answer), over :mod:`~devtools.model_server.batch_lines` (an input file,
  checked), :mod:`~devtools.model_server.batch_life` (a batch's status by the clock) and
  :mod:`~devtools.model_server.api_shapes` (forms, metadata and list pages);
- :mod:`~devtools.model_server.state`: the server's counters, files, batches and faults;
- :mod:`~devtools.model_server.handler` (over :mod:`~devtools.model_server.http_io` and
  :mod:`~devtools.model_server.webhooks`) and :mod:`~devtools.model_server.server`: the
  HTTP endpoints, and the state listening on a socket;
- :mod:`~devtools.model_server.cli`: ``python -m devtools.model_server``;
- :mod:`~devtools.model_server.process`: :class:`LocalModelServer`, which runs it as a
  subprocess.

The server itself uses the standard library only, so it starts fast anywhere.
"""

from __future__ import annotations

from devtools.model_server.process import LocalModelServer

__all__ = ["LocalModelServer"]
