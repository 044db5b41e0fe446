import contextlib
import json
import random
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from devtools.model_server import LocalModelServer
from replayable.models.embeddings import CallRecord, HttpEmbeddingClient
from replayable.retry import CallRetry, ErrorKind, ItemError

FAST = CallRetry(max_attempts=6, base_s=0.01, cap_s=0.05, max_total_s=30)

# Answers a request body (parsed JSON) with the bytes of a 200 response.
Answer = Callable[[dict], bytes]


class _CannedProvider(ThreadingHTTPServer):
    """A loopback /v1/embeddings endpoint whose 200 bodies a test writes byte for byte."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(("127.0.0.1", 0), _CannedHandler)
        self.answer = answer
        self.requests = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}/v1"


class _CannedHandler(BaseHTTPRequestHandler):
    server: _CannedProvider

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests += 1
        data = self.server.answer(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def canned() -> Iterator[Callable[[Answer], _CannedProvider]]:
    servers: list[_CannedProvider] = []

    def start(answer: Answer) -> _CannedProvider:
        server = _CannedProvider(answer)
        servers.append(server)
        threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _openai_style(body: dict, vector: Callable[[int], list[float]]) -> bytes:
    """An embeddings answer laid out as OpenAI's API sends it: indented, one float a line."""
    data = [
        {"object": "embedding", "index": i, "embedding": vector(body.get("dimensions") or 8)}
        for i in range(len(body["input"]))
    ]
    usage = {"prompt_tokens": len(data), "total_tokens": len(data)}
    answer = {"object": "list", "data": data, "model": body["model"], "usage": usage}
    return json.dumps(answer, indent=2).encode()


def _dense(dim: int) -> list[float]:
    """Full-precision negative components: the longest a float commonly prints."""
    rng = random.Random(dim)
    return [-rng.uniform(0.001, 0.01) for _ in range(dim)]


@pytest.fixture
def client(model):
    c = HttpEmbeddingClient(base_url=model.base_url, model="m", retry=FAST, timeout_s=5)
    yield c
    c.close()


def test_embeds_in_input_order_with_the_idempotency_key(client, model):
    result = client.embed(["alpha", "beta", "alpha"], idempotency_key="item-1")
    assert len(result.vectors) == 3
    assert result.vectors[0] == result.vectors[2] != result.vectors[1]
    assert model.stats()["idempotency_keys"] == {"item-1": 1}


def test_every_request_is_reported_including_failed_ones(client, model):
    model.set_faults(status_rates={"503": 0.5}, seed=3)
    calls: list[CallRecord] = []
    for n in range(10):
        client.embed([f"text {n}"], idempotency_key=f"k{n}", on_call=calls.append)
    stats = model.stats()
    assert len(calls) == stats["requests"]
    assert sum(c.status == "ok" for c in calls) == 10 == stats["succeeded"]
    assert {c.status for c in calls} <= {"ok", "http_503"}


def test_retry_after_is_honoured_between_tries(client, model):
    model.set_faults(status_rates={"429": 1.0}, retry_after="1")
    calls: list[CallRecord] = []
    with pytest.raises(httpx.HTTPStatusError):
        HttpEmbeddingClient(
            base_url=model.base_url, model="m", retry=CallRetry(max_attempts=2, base_s=0.01)
        ).embed(["x"], idempotency_key="k", on_call=calls.append)
    assert [c.http_status for c in calls] == [429, 429]


def test_a_bad_request_is_not_retried(client, model):
    model.set_faults(fail_inputs_containing={"POISON": 400})
    with pytest.raises(httpx.HTTPStatusError) as info:
        client.embed(["a POISON text"], idempotency_key="k")
    assert info.value.response.status_code == 400
    assert model.stats()["requests"] == 1


def test_the_api_key_is_sent_as_a_bearer_token_and_never_in_errors():
    with LocalModelServer(api_key="sk-secret-123") as secured:
        good = HttpEmbeddingClient(base_url=secured.base_url, model="m", api_key="sk-secret-123")
        assert len(good.embed(["x"], idempotency_key="k").vectors) == 1
        bad = HttpEmbeddingClient(base_url=secured.base_url, model="m", api_key="sk-wrong-456")
        with pytest.raises(httpx.HTTPStatusError) as info:
            bad.embed(["x"], idempotency_key="k")
        assert info.value.response.status_code == 401
        assert "sk-wrong-456" not in str(info.value)


def test_a_server_that_trickles_its_answer_is_cut_off_at_the_request_deadline(model):
    """httpx's timeouts are per phase: bytes every 0.1 s never trip them; the deadline does."""
    model.set_faults(trickle_bytes_per_s=200)
    slow = HttpEmbeddingClient(
        base_url=model.base_url, model="m", retry=CallRetry(max_attempts=1), timeout_s=1.0
    )
    calls: list[CallRecord] = []
    with pytest.raises(httpx.ReadTimeout, match="deadline"):
        slow.embed(
            ["a sentence with enough words to take a while"] * 4,
            idempotency_key="k",
            on_call=calls.append,
        )
    assert [c.status for c in calls] == ["read_timeout"]
    slow.close()


def test_an_oversized_answer_is_refused(client, model):
    model.set_faults(pad_response_bytes=5_000_000)
    with pytest.raises(ItemError, match="larger than"):
        HttpEmbeddingClient(
            base_url=model.base_url, model="m", retry=CallRetry(max_attempts=1)
        ).embed(["x"], idempotency_key="k")


def test_the_gate_is_held_around_each_attempt(client, model):
    model.set_faults(status_rates={"503": 1.0}, retry_after="0")
    entered: list[int] = []

    @contextlib.contextmanager
    def gate():
        entered.append(1)
        yield

    with pytest.raises(httpx.HTTPStatusError):
        HttpEmbeddingClient(
            base_url=model.base_url, model="m", retry=CallRetry(max_attempts=3, base_s=0.01)
        ).embed(["x"], idempotency_key="k", gate=gate)
    assert len(entered) == model.stats()["requests"] == 3


def test_a_legitimate_answer_at_the_largest_dimensions_fits_under_the_size_cap(canned):
    """8,192 indented full-precision floats per input are about 250 KB each; all must pass."""
    provider = canned(lambda body: _openai_style(body, _dense))
    client = HttpEmbeddingClient(
        base_url=provider.base_url, model="m", dimensions=8192, retry=CallRetry(max_attempts=1)
    )
    calls: list[CallRecord] = []
    result = client.embed(
        [f"text {n}" for n in range(4)], idempotency_key="k", on_call=calls.append
    )
    client.close()
    assert [len(vector) for vector in result.vectors] == [8192] * 4
    assert [c.status for c in calls] == ["ok"]


def test_an_answer_larger_than_the_requested_dimensions_allow_is_cut_off(canned):
    """The cap follows the dimensions asked for: 8 asked, 8,192 sent, refused unread."""
    provider = canned(lambda body: _openai_style({**body, "dimensions": 8192}, _dense))
    client = HttpEmbeddingClient(
        base_url=provider.base_url, model="m", dimensions=8, retry=CallRetry(max_attempts=1)
    )
    with pytest.raises(ItemError, match="larger than") as info:
        client.embed(["x"], idempotency_key="k")
    client.close()
    assert info.value.error_class == "bad_response"


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", '"nan"', "1e400"])
def test_a_non_finite_component_is_a_bad_response_before_anything_is_stored(canned, value):
    """pgvector refuses NaN and infinity; the answer must fail here, classified, not there."""

    def answer(body: dict) -> bytes:
        good = _openai_style(body, lambda dim: [0.5] * dim).decode()
        return good.replace("0.5", value, 1).encode()

    provider = canned(answer)
    client = HttpEmbeddingClient(
        base_url=provider.base_url, model="m", retry=CallRetry(max_attempts=2, base_s=0.01)
    )
    calls: list[CallRecord] = []
    with pytest.raises(ItemError, match="finite") as info:
        client.embed(["x", "y"], idempotency_key="k", on_call=calls.append)
    client.close()
    assert (info.value.error_class, info.value.kind) == ("bad_response", ErrorKind.RETRYABLE)
    # Retryable: a provider's glitch may pass; the item's attempt cap bounds a lasting one.
    assert [c.status for c in calls] == ["bad_response"] * 2 == ["bad_response"] * provider.requests


def test_pgvector_refuses_what_the_client_now_refuses(conn):
    """Why the check exists: a NaN reaching the insert fails after the call was paid."""
    import psycopg2

    with pytest.raises(psycopg2.Error, match="NaN"), conn.cursor() as cur:
        cur.execute("SELECT '[1,NaN]'::vector")
    conn.rollback()
