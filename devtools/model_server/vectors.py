"""The embeddings themselves: feature-hash vectors, the request and the response body.

The vectors are feature hashes of the input's words, not semantic embeddings: texts that
share words land close together, but synonyms, paraphrases and other languages do not. The
model ``local-wordllama-256`` is served by a real model instead
(:mod:`devtools.model_server.wordllama_model`), whose vectors mean something.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from devtools.model_server import wordllama_model
from devtools.model_server.errors import HttpError, model_request

DEFAULT_DIM = 64
MAX_DIM = 8192

_TOKEN_RE = re.compile(r"\w+")


def embed_text(text: str, dim: int = DEFAULT_DIM) -> list[float]:
    """Return the unit-norm feature-hash vector of ``text`` with ``dim`` components.

    Lowercased word tokens are each hashed to a bucket and a sign and summed. A text with
    no tokens (or whose tokens cancel out) gets the fixed unit vector e0, so every vector
    has norm 1 and cosine similarity is always defined.
    """
    if not 1 <= dim <= MAX_DIM:
        raise ValueError(f"dim must be between 1 and {MAX_DIM}, got {dim}")
    vector = [0.0] * dim
    for token in _TOKEN_RE.findall(text.lower()):
        digest = hashlib.blake2b(token.encode(), digest_size=8).digest()
        bucket = int.from_bytes(digest[:4], "big") % dim
        vector[bucket] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(math.fsum(x * x for x in vector))
    if norm == 0.0:
        vector[0] = 1.0
        return vector
    return [x / norm for x in vector]


def count_tokens(text: str) -> int:
    """Return the usage token count of one input: its whitespace tokens, at least 1."""
    return max(1, len(text.split()))


def usage_tokens(inputs: Sequence[str]) -> int:
    """Return the ``usage.total_tokens`` of a request's inputs, which ``max_tpm`` counts."""
    return sum(count_tokens(text) for text in inputs)


@dataclass(frozen=True)
class EmbeddingsRequest:
    """What a ``POST /v1/embeddings`` body asks for, checked."""

    model: str
    inputs: list[str]
    dim: int
    encoding_format: str

    def canonical(self) -> list[object]:
        """What identifies the request for its idempotency key; it names the endpoint."""
        return ["embeddings", self.model, self.inputs, self.dim, self.encoding_format]


def parse_embeddings_request(body: bytes, default_dim: int) -> EmbeddingsRequest:
    """Parse and check a request body; raise a 400 :class:`HttpError` naming the field."""
    payload, model = model_request(body)
    raw_input = payload.get("input")
    if isinstance(raw_input, str):
        inputs = [raw_input]
    elif isinstance(raw_input, list) and all(isinstance(item, str) for item in raw_input):
        inputs = cast("list[str]", raw_input)
    else:
        raise HttpError(400, "'input' must be a string or a list of strings")
    if not inputs or not all(inputs):
        raise HttpError(400, "'input' must not be empty and must not contain empty strings")
    encoding_format = payload.get("encoding_format", "float")
    if encoding_format not in ("float", "base64"):
        raise HttpError(400, "'encoding_format' must be 'float' or 'base64'")
    learned = model == wordllama_model.MODEL
    top = wordllama_model.DIM if learned else MAX_DIM
    dim = payload.get("dimensions", wordllama_model.DIM if learned else default_dim)
    if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= top:
        raise HttpError(400, f"'dimensions' must be an integer between 1 and {top}")
    return EmbeddingsRequest(model, inputs, dim, cast("str", encoding_format))


def embeddings_response(request: EmbeddingsRequest) -> dict[str, Any]:
    """The OpenAI-shaped response to ``request``: one vector per input, and the usage."""
    data: list[dict[str, Any]] = []
    if request.model == wordllama_model.MODEL:
        vectors = wordllama_model.embed(request.inputs, request.dim)
    else:
        vectors = [embed_text(text, request.dim) for text in request.inputs]
    for index, vector in enumerate(vectors):
        embedding: list[float] | str = vector
        if request.encoding_format == "base64":
            # The OpenAI Python client asks for base64 by default: little-endian float32.
            packed = struct.pack(f"<{len(vector)}f", *vector)
            embedding = base64.b64encode(packed).decode("ascii")
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    tokens = usage_tokens(request.inputs)
    return {
        "object": "list",
        "data": data,
        "model": request.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
