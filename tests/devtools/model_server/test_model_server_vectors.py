"""The feature-hash vectors and the embeddings API's request and response bodies."""

from __future__ import annotations

import base64
import math
import struct

import httpx
import pytest
from model_server_calls import embed, vectors

from devtools.model_server import LocalModelServer
from devtools.model_server.vectors import embed_text


def test_same_text_gives_same_unit_vector_of_default_dim(client: httpx.Client) -> None:
    first = vectors(embed(client, "The quick brown fox"))[0]
    second = vectors(embed(client, "the QUICK brown fox!"))[0]
    assert first == second
    assert len(first) == 64
    assert math.isclose(math.fsum(x * x for x in first), 1.0)
    assert first == pytest.approx(embed_text("The quick brown fox", 64))


def test_dimensions_in_request_overrides_default_dim(client: httpx.Client) -> None:
    (vector,) = vectors(embed(client, "hello world", dimensions=128))
    assert len(vector) == 128
    assert math.isclose(math.fsum(x * x for x in vector), 1.0)


def test_text_without_words_embeds_as_unit_vector_e0(client: httpx.Client) -> None:
    (vector,) = vectors(embed(client, "!!! ???", dimensions=8))
    assert vector == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_different_texts_give_different_vectors(client: httpx.Client) -> None:
    first, second = vectors(embed(client, ["invoice total due", "weather forecast rain"]))
    assert first != second


def test_batch_keeps_input_order_and_indices(client: httpx.Client) -> None:
    texts = ["alpha", "beta gamma", "delta", "alpha"]
    response = embed(client, texts)
    body = response.json()
    assert body["object"] == "list"
    assert body["model"] == "local-hash"
    assert [item["index"] for item in body["data"]] == [0, 1, 2, 3]
    assert all(item["object"] == "embedding" for item in body["data"])
    assert vectors(response) == [pytest.approx(embed_text(text, 64)) for text in texts]


def test_usage_counts_whitespace_tokens_with_at_least_one_per_input(
    client: httpx.Client,
) -> None:
    usage = embed(client, ["one two three", "four", "!!!"]).json()["usage"]
    assert usage == {"prompt_tokens": 5, "total_tokens": 5}


def test_base64_encoding_decodes_to_the_float_vector(client: httpx.Client) -> None:
    (floats,) = vectors(embed(client, "pack me"))
    response = embed(client, "pack me", encoding_format="base64")
    raw = base64.b64decode(response.json()["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == pytest.approx(floats, abs=1e-6)


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"[1, 2]",
        b'{"model": "m"}',
        b'{"model": "m", "input": ""}',
        b'{"model": "m", "input": []}',
        b'{"model": "m", "input": ["ok", 3]}',
        b'{"input": "no model"}',
        b'{"model": "m", "input": "x", "dimensions": 0}',
        b'{"model": "m", "input": "x", "encoding_format": "int8"}',
    ],
)
def test_bad_request_body_gets_400_openai_error(
    client: httpx.Client, server: LocalModelServer, content: bytes
) -> None:
    response = client.post("/embeddings", content=content)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert server.stats()["by_status"] == {"400": 1}


def test_unknown_v1_endpoint_gets_404(client: httpx.Client) -> None:
    assert client.get("/models").status_code == 404
