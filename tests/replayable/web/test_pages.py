"""The UI's HTML pages: escaped values, relative links, links into Airflow, the redrive form."""

from __future__ import annotations

import html
import re

from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from airflow.api_fastapi.core_api.security import get_user
from fastapi import FastAPI
from fastapi.testclient import TestClient
from ui_fixtures import (  # noqa: F401 - fixtures
    _USERS,
    HOSTILE,
    _hrefs,
    _test_identity,
    app_fixture,
    auth_manager_fixture,
    client_fixture,
    editor_fixture,
    ledger_fixture,
)


def test_hostile_values_are_escaped_in_every_page(
    client: TestClient, editor: TestClient, ledger: dict[str, int]
) -> None:
    letter = ledger["encrypted"]
    pages = ("/replayable/failed", "/replayable/dead-letters", f"/replayable/dead-letters/{letter}")
    for path in pages:
        page = client.get(path).text
        assert "<script" not in page, path
        assert html.escape(HOSTILE) in page, path  # shown, as text
    # The owner also sits in an input's value attribute: the quote must not close it.
    editor.post(
        f"/replayable/dead-letters/{ledger['bad_input']}/assign",
        data={"owner": '"><script>x</script>', "note": "n"},
    )
    for path in ("/replayable/dead-letters", f"/replayable/dead-letters/{ledger['bad_input']}"):
        page = client.get(path).text
        assert "<script" not in page
        assert 'value="&#34;&gt;&lt;script&gt;x&lt;/script&gt;"' in page


def test_pages_use_only_relative_urls(client: TestClient, ledger: dict[str, int]) -> None:
    """The page is served under /replayable/ and framed at /plugin/replayable."""
    letter = f"/replayable/dead-letters/{ledger['encrypted']}"
    for path in ("/replayable/", "/replayable/failed", "/replayable/dead-letters", letter):
        urls = re.findall(r'(?:href|action)="([^"]*)"', client.get(path).text)
        assert urls, path
        assert not [u for u in urls if u.startswith(("/", "http:", "https:"))], path


def test_the_letter_page_links_resolve_to_the_app_routes(
    client: TestClient, ledger: dict[str, int]
) -> None:
    letter = ledger["encrypted"]
    page = client.get(f"/replayable/dead-letters/{letter}")
    base = page.url
    urls = {str(base.join(u).path) for u in re.findall(r'(?:href|action)="([^"]*)"', page.text)}
    assert {
        "/replayable/",
        "/replayable/failed",
        "/replayable/dead-letters",
        f"/replayable/dead-letters/{letter}/assign",
        f"/replayable/dead-letters/{letter}/ignore",
    } <= urls


def test_pages_link_into_airflow_relative_to_its_base_path(
    app: FastAPI, ledger: dict[str, int]
) -> None:
    """Served at <base>/replayable/..., a page's Airflow links resolve to <base>/dags/...."""
    letter = ledger["encrypted"]
    for base in ("", "/airflow"):
        root = FastAPI()
        root.mount(f"{base}/replayable", app)
        app.dependency_overrides[get_user] = _test_identity
        _USERS["v:VIEWER"] = SimpleAuthManagerUser(username="v", role="VIEWER")
        viewer = TestClient(root, headers={"X-Test-User": "v:VIEWER"})
        log = f"{base}/dags/document_pipeline/runs/r2/tasks/batch.extract/mapped/0?try_number=2"
        for path in ("/dead-letters", f"/dead-letters/{letter}"):
            hrefs = _hrefs(viewer.get(f"{base}/replayable{path}"))
            assert log in hrefs, (base, path)
            assert f"{base}/dags/document_pipeline/runs/r2" in hrefs
        failed = _hrefs(viewer.get(f"{base}/replayable/failed"))
        assert f"{base}/dags/document_pipeline/runs/r1/tasks/batch.extract/mapped/1/details" in (
            failed
        )


def test_the_dead_letter_page_offers_redrive_of_ticked_or_matching_open_letters(
    client: TestClient, ledger: dict[str, int]
) -> None:
    page = client.get("/replayable/dead-letters?error_class=encrypted").text
    form = re.search(r'<form id="redrive".*?</form>', page, re.S)
    assert form is not None and 'action="dead-letters/redrive"' in form.group(0)
    assert 'name="error_class" value="encrypted"' in form.group(0)
    assert f'name="ids" value="{ledger["encrypted"]}" form="redrive"' in page
    # Only open letters can be redriven: no form on other statuses, no box on closed rows.
    closed = client.get("/replayable/dead-letters?status=redriven").text
    assert 'id="redrive"' not in closed and 'name="ids"' not in closed
