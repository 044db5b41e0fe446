"""``local-wordllama-256``: the local server's real embedding model, offline."""

from __future__ import annotations

import math
import socket

import httpx
import pytest

from devtools.model_server import wordllama_model

MODEL = wordllama_model.MODEL


def _embed(model, texts, **extra):
    response = httpx.post(
        f"{model.base_url}/embeddings",
        json={"model": MODEL, "input": texts, **extra},
        headers=extra.pop("headers", {}),
        timeout=30,
    )
    return response


def _cosine(a, b):
    return math.fsum(x * y for x, y in zip(a, b, strict=True))


def test_its_vectors_mean_something(model):
    texts = [
        "How do I reset my password?",
        "Steps to recover access to an account after forgetting the login secret.",
        "The quarterly revenue grew by ten percent in Europe.",
    ]
    answer = _embed(model, texts)
    assert answer.status_code == 200, answer.text
    vectors = [row["embedding"] for row in answer.json()["data"]]
    assert {len(v) for v in vectors} == {256}
    assert all(math.isclose(_cosine(v, v), 1.0, rel_tol=1e-6) for v in vectors)
    # The paraphrase shares no word with the question, yet is nearer than the unrelated text.
    assert _cosine(vectors[0], vectors[1]) > _cosine(vectors[0], vectors[2]) + 0.1


def test_dimensions_below_256_are_the_first_ones_normalised_again(model):
    full = _embed(model, ["A short text about cats."]).json()["data"][0]["embedding"]
    cut = _embed(model, ["A short text about cats."], dimensions=64).json()["data"][0]["embedding"]
    norm = math.sqrt(math.fsum(x * x for x in full[:64]))
    assert cut == pytest.approx([x / norm for x in full[:64]], abs=1e-6)
    refused = _embed(model, ["text"], dimensions=512)
    assert refused.status_code == 400
    assert "'dimensions' must be an integer between 1 and 256" in refused.text


def test_it_loads_with_the_network_unavailable(monkeypatch):
    """Every connection but loopback is refused while the model loads: it reads the wheel's
    own weights and tokenizer, and never asks for a download."""
    real_connect = socket.socket.connect

    def loopback_only(self, address):
        host = address[0] if isinstance(address, tuple) else address
        if host not in ("127.0.0.1", "::1", "localhost"):
            raise OSError(f"network unavailable: refused {host}")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", loopback_only)
    monkeypatch.setattr(wordllama_model, "_model", None)
    vectors = wordllama_model.embed(["offline text"], 32)
    assert len(vectors[0]) == 32


def test_charges_faults_and_idempotency_work_as_for_the_hashed_model(model):
    key = {"Idempotency-Key": "wordllama-once"}
    first = httpx.post(
        f"{model.base_url}/embeddings", json={"model": MODEL, "input": ["same"]}, headers=key
    )
    again = httpx.post(
        f"{model.base_url}/embeddings", json={"model": MODEL, "input": ["same"]}, headers=key
    )
    assert first.json() == again.json()
    stats = model.stats()
    assert (stats["charged"], stats["deduplicated"]) == (1, 1)
    model.set_faults(fail_inputs_containing={"POISON": 400})
    assert _embed(model, ["a POISON input"]).status_code == 400
