"""The UI's search (``web/search.py``): the search page and ``api/search``, through the
model connection and the local server's real model (``local-wordllama-256``); every value
on the page escaped; refusals that name the parameter or the connection; and a search that
holds no UI connection, and none of Airflow's worker threads, while the provider answers
(ADR 0073)."""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from fastapi import FastAPI
from fastapi.testclient import TestClient
from markupsafe import escape
from ui_fixtures import (  # noqa: F401 - fixtures
    _as,
    anonymous_fixture,
    app_fixture,
    auth_manager_fixture,
    client_fixture,
    connections_fixture,
)

from checks import TOPICS, topic_pdfs
from replayable.vocabulary import MODEL_CONN_ID

MODEL = "local-wordllama-256"
pytestmark = pytest.mark.db

TEXTS = {
    **{name: text for name, text in TOPICS.items() if name != "ledger.pdf"},
    # A document's own text, shown as the snippet of its chunk.
    "markup.pdf": "Browser markup such as <script>alert(1)</script> & <b>bold</b> tags "
    "belongs in web pages.",
}
HOSTILE_QUERY = "<script>alert(1)</script>\"'&"
MODEL_CONN = f"AIRFLOW_CONN_{MODEL_CONN_ID.upper()}"


@pytest.fixture
def topics(run_in_process: Any, conn: Any, model: Any, tmp_path: Path) -> Path:
    """Four one-chunk documents embedded with the real model, under their own folder."""
    folder = topic_pdfs(tmp_path / "topics", TEXTS)
    assert not run_in_process({"source": str(folder), "model": MODEL})["_failed"]
    return folder


def _change_model_connection(
    monkeypatch: pytest.MonkeyPatch, change: Callable[[dict[str, Any]], None]
) -> None:
    connection = json.loads(os.environ[MODEL_CONN])
    change(connection)
    monkeypatch.setenv(MODEL_CONN, json.dumps(connection))


def test_the_api_finds_the_document_that_answers_a_paraphrased_question_first(
    client: TestClient, topics: Path
) -> None:
    for question, answer in (
        ("How can a loaf rise without yeast from a shop?", "bread.pdf"),
        ("creatures that hide in rock pools by the seaside", "tides.pdf"),
        ("when do you collect honey from a hive", "bees.pdf"),
    ):
        found = client.get("/replayable/api/search", params={"q": question, "model": MODEL})
        assert found.status_code == 200, found.text
        body = found.json()
        assert set(body) == {
            "query",
            "model",
            "dimensions",
            "run_id",
            "exact",
            "mode",
            "coverage",
            "hits",
        }
        assert (body["query"], body["model"], body["mode"]) == (question, MODEL, "hybrid")
        # What it searched: the topics' run's settings, every document, none left out.
        assert body["run_id"] is not None and body["dimensions"] is None
        assert (body["coverage"]["documents"], body["coverage"]["left_out"]) == (4, {})
        assert body["hits"][0]["uri"].endswith(answer), (question, body["hits"])
        assert set(body["hits"][0]) == {"doc_id", "uri", "ordinal", "chunk_id", "score", "snippet"}
        scores = [hit["score"] for hit in body["hits"]]
        assert scores == sorted(scores, reverse=True)
    # k and source narrow it, as the CLI's --k and --source do.
    narrowed = client.get(
        "/replayable/api/search",
        params={"q": "the hive", "k": 2, "source": str(topics / "b"), "model": MODEL},
    ).json()
    assert sorted(h["uri"].rsplit("/", 1)[-1] for h in narrowed["hits"]) == [
        "bees.pdf",
        "bread.pdf",
    ]


def test_the_page_lists_each_hit_and_escapes_the_question_and_every_snippet(
    client: TestClient, topics: Path
) -> None:
    page = client.get("/replayable/search", params={"q": HOSTILE_QUERY, "model": MODEL})
    assert page.status_code == 200, page.text
    rows = re.findall(r'<tr class="hit">(.*?)</tr>', page.text, re.S)
    assert len(rows) == len(TEXTS)  # the default k (10) finds all four, one chunk each
    (markup,) = [row for row in rows if "markup.pdf" in row]
    assert str(topics / "markup.pdf") in markup  # the document's URI
    assert re.search(r'<td class="num">0</td>\s*<td class="num">-?\d\.\d{3}</td>', markup)
    assert "&lt;b&gt;bold&lt;/b&gt;" in markup  # the snippet, as text
    assert "<script" not in page.text and "<b>" not in page.text
    assert str(escape(HOSTILE_QUERY)) in page.text  # in the box and in the caption, as text
    assert f'value="{escape(HOSTILE_QUERY)}"' in page.text
    # What it searched, under whose settings (ADR 0152).
    assert f"Searched {MODEL} under the settings of run manual__" in page.text
    assert ": 4 documents, none left out (counted " in page.text


def test_the_overview_has_a_search_box_that_leads_to_the_search_page(client: TestClient) -> None:
    overview = client.get("/replayable/").text
    form = re.search(r'<form[^>]*action="search"[^>]*>.*?</form>', overview, re.S)
    assert form is not None and 'name="q"' in form.group(0)


@pytest.mark.parametrize("q", ["", "   "])
def test_without_a_question_the_page_shows_the_box_and_the_api_names_q(
    client: TestClient, q: str
) -> None:
    page = client.get("/replayable/search", params={"q": q})
    assert page.status_code == 200
    assert 'name="q"' in page.text and 'role="alert"' not in page.text
    assert 'class="hits"' not in page.text
    api = client.get("/replayable/api/search", params={"q": q})
    assert api.status_code == 400
    assert api.json() == {"detail": "q: give a question or some words to search for"}


@pytest.mark.parametrize(
    ("params", "api_status", "message"),
    [
        ({"q": "x", "k": "0"}, 422, "k: ask for between 1 and 100 chunks, not 0"),
        ({"q": "x", "k": "101"}, 422, "k: ask for between 1 and 100 chunks, not 101"),
        ({"q": "x", "k": "many"}, 422, "k: a whole number from 1 to 100, not 'many'"),
        ({"q": "x" * 2001}, 422, "q: at most 2000 characters, not 2001"),
        ({"q": "x", "source": "/data/\x00"}, 422, "source: no control characters"),
        ({"q": "x", "model": "a\x1bb"}, 422, "model: no control characters"),
        (
            {"q": "x", "dimensions": "many"},
            422,
            "dimensions: a whole number from 1 to 8192, or 0 for the model's own size, not 'many'",
        ),
        (
            {"q": "x", "dimensions": "-1"},
            422,
            "dimensions: a whole number from 1 to 8192, or 0 for the model's own size, not -1",
        ),
        (
            {"q": "x", "model": "<b>no-such-model</b>"},
            400,
            "model: the ledger has no vectors for '<b>no-such-model</b>'",
        ),
    ],
)
def test_bad_input_is_refused_naming_the_parameter(
    client: TestClient,
    connections: dict[str, str],
    params: dict[str, str],
    api_status: int,
    message: str,
) -> None:
    """The page shows the message (escaped) with 400; the JSON twin answers 400, or 422 as
    FastAPI refuses a parameter outside its declared type and bounds, naming it."""
    page = client.get("/replayable/search", params=params)
    assert page.status_code == 400, page.text
    assert str(escape(message)) in page.text
    assert "<b>no-such-model" not in page.text
    api = client.get("/replayable/api/search", params=params)
    assert api.status_code == api_status, api.text
    if api_status == 400:
        assert api.json()["detail"].startswith(message)
    else:
        [error] = api.json()["detail"]
        assert error["loc"] == ["query", message.split(":")[0]]


def test_dimensions_names_the_vectors_searched_and_a_size_without_any_is_a_400(
    client: TestClient, topics: Path, run_in_process: Any
) -> None:
    """After a run at 64 dimensions beside the topics' run at the model's own size, a search
    reads the 64-d vectors, ``dimensions=0`` the own size's, and a size with no vectors is a
    400 that names the sizes held (ADR 0151); the page keeps the value in its box."""
    conf = {"source": str(topics), "model": MODEL, "dimensions": 64}
    assert not run_in_process(conf)["_failed"]
    params = {"q": "when do you collect honey from a hive", "mode": "vector"}
    current = client.get("/replayable/api/search", params=params)
    assert current.status_code == 200 and current.json()["dimensions"] == 64, current.text
    own = client.get("/replayable/api/search", params={**params, "dimensions": 0})
    assert own.status_code == 200 and own.json()["dimensions"] is None, own.text
    assert own.json()["hits"][0]["uri"].endswith("bees.pdf")

    none = client.get("/replayable/api/search", params={**params, "dimensions": 32})
    assert none.status_code == 400
    assert none.json()["detail"].startswith(
        f"dimensions: the ledger has no vectors for '{MODEL}' at 32 dimensions; it has vectors"
        f" of '{MODEL}' at its own size (256 dimensions), '{MODEL}' at 64 dimensions"
    )
    page = client.get("/replayable/search", params={**params, "dimensions": "0"})
    assert page.status_code == 200
    assert 'name="dimensions" value="0"' in page.text
    assert f"Searched {MODEL} under" in page.text


def test_without_the_model_connection_a_search_is_503_naming_it(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(MODEL_CONN, raising=False)
    api = client.get("/replayable/api/search", params={"q": "honey"})
    assert api.status_code == 503
    assert "'replayable_model'" in api.json()["detail"]
    page = client.get("/replayable/search", params={"q": "honey"})
    assert page.status_code == 503
    assert "replayable_model" in page.text and 'value="honey"' in page.text


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_provider_that_refuses_or_cannot_be_reached_is_a_502_that_shows_no_key(
    client: TestClient,
    connections: dict[str, str],
    model: Any,
    dsn: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = "sk-never-shown-42"
    _change_model_connection(monkeypatch, lambda c: c.update(password=key))
    model.set_faults(status_always=401)
    refused = client.get("/replayable/api/search", params={"q": "honey"})
    assert refused.status_code == 502
    detail = refused.json()["detail"]
    assert "http_401" in detail and "API key" in detail and "'replayable_model'" in detail
    model.clear_faults()

    port = _closed_port()
    _change_model_connection(monkeypatch, lambda c: c.update(host=f"http://127.0.0.1:{port}/v1"))
    unreachable = client.get("/replayable/search", params={"q": "honey"})
    assert unreachable.status_code == 502
    assert "connect_error" in unreachable.text and "replayable_model" in unreachable.text
    for answer in (refused.text, unreachable.text):
        assert key not in answer and dsn not in answer and str(port) not in answer


def test_searching_needs_an_airflow_login_and_a_role(app: FastAPI, anonymous: TestClient) -> None:
    nobody = _as(app, SimpleAuthManagerUser(username="nobody", role=None))
    for path in ("/replayable/search?q=honey", "/replayable/api/search?q=honey"):
        assert anonymous.get(path).status_code == 401, path
        assert nobody.get(path).status_code == 403, path


def _until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_search_waits_for_the_provider_holding_no_ui_connection_and_a_third_is_refused(
    app: FastAPI, client: TestClient, connections: dict[str, str], model: Any, conn: Any
) -> None:
    """ADR 0073: while two searches wait for a slow provider, the UI's pool is free (a page
    still answers) and a third search is refused at once, with Retry-After."""
    model.set_faults(latency_ms=60_000)  # held until the faults are cleared
    answers: list[int] = []

    def one_search() -> None:
        searcher = _as(app, SimpleAuthManagerUser(username="s", role="VIEWER"))
        answers.append(searcher.get("/replayable/api/search", params={"q": "honey"}).status_code)

    searches = [threading.Thread(target=one_search) for _ in range(2)]
    try:
        for thread in searches:
            thread.start()
        _until(lambda: model.stats()["in_flight"] == 2)
        assert app.state.pool.in_use == 0
        assert client.get("/replayable/api/summary").status_code == 200
        third = client.get("/replayable/api/search", params={"q": "bees"})
        assert third.status_code == 503 and third.headers["retry-after"] == "1"
        assert "searches are running" in third.json()["detail"]
    finally:
        model.clear_faults()
        for thread in searches:
            thread.join(60)
    # The ledger holds no vectors: each got as far as the read, and was refused there.
    assert answers == [400, 400]
