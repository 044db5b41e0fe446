"""The UI plugin inside a running Airflow: real tokens per role, and a real browser.

Airflow is the session's (tests/shared_airflow.py): separate processes with SimpleAuthManager
users of every role, whose passwords the API server generates.
The role tests send real JWTs (bearer, and the UI's ``_token`` cookie for the CSRF cases);
the browser test logs in with Playwright driving Debian's Chromium, opens Replayable from the
nav, compares the overview with the ledger, searches from the overview's box, opens a dead
letter whose file name is an HTML payload, assigns it, redrives it, and follows its log link
into Airflow's task page, saving a screenshot at each step (and of the dead-letter chart)
under the test's output folder. Runs
the UI triggers stay queued (the pipeline is paused here) and are deleted after each test;
``test_replayable_sweeper.py`` redrives from the UI on a running scheduler to the end.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import httpx
import pytest
from fastapi.routing import APIRoute

from checks import SAMPLES, rows, scalar
from helpers import ROOT
from replayable.vocabulary import PIPELINE_DAG_ID, STAGES
from replayable.web import create_app
from shared_airflow import SharedAirflow, delete_queued_runs

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
HOSTILE_NAME = "<img src=x onerror=alert(1)>.pdf"
# The model make demo embeds with (its conf in the Makefile).
DEMO_MODEL = "local-wordllama-256"


@dataclass
class RunningAirflow:
    url: str
    passwords: Path

    def password(self, username: str) -> str:
        return str(json.loads(self.passwords.read_text())[username])

    def token(self, username: str) -> str:
        response = httpx.post(
            f"{self.url}/auth/token",
            json={"username": username, "password": self.password(username)},
            timeout=30,
        )
        response.raise_for_status()
        return str(response.json()["access_token"])

    def client(self, username: str | None = None, **kwargs: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token(username)}"} if username else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, **kwargs)


@pytest.fixture(scope="module")
def airflow(shared_airflow: SharedAirflow) -> RunningAirflow:
    """The session's Airflow (tests/shared_airflow.py); its DAGs stay paused here."""
    return RunningAirflow(shared_airflow.url, shared_airflow.passwords)


@pytest.fixture
def letter(conn: Any) -> int:
    """One open dead letter, with its document."""
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO replayable.documents (doc_id, uri, size_bytes)"
            " VALUES (%s, '/data/a.pdf', 1)",
            ("a" * 64,),
        )
        cur.execute(
            "INSERT INTO replayable.dead_letters (stage, item_key, doc_id, error_class,"
            " error_kind, error, attempts, code_version, note)"
            " VALUES ('extract', 'k', %s, 'encrypted', 'terminal', 'locked', 3, '1', 'first')"
            " RETURNING id",
            ("a" * 64,),
        )
        (found,) = cur.fetchone()
    conn.commit()
    return int(found)


def _pages(letter_id: int) -> list[str]:
    """Every GET route of the app (enumerated, so new pages are covered), under /replayable;
    the searches are asked no question."""
    app = create_app(lambda: "unused")
    paths = [
        "/replayable"
        + route.path.replace("{letter_id}", str(letter_id))
        + ("?q=" if route.path.endswith("/search") else "")
        for route in app.routes
        if isinstance(route, APIRoute) and "GET" in route.methods
    ]
    assert len(paths) == 13
    return paths


def _letter_state(conn: Any, letter_id: int) -> tuple[Any, ...]:
    return rows(
        conn, "SELECT status, owner, note FROM replayable.dead_letters WHERE id = %s", letter_id
    )[0]


def _actors(conn: Any, letter_id: int) -> list[tuple[str, str]]:
    return [
        (actor, action)
        for actor, action in rows(
            conn,
            "SELECT actor, action FROM replayable.dead_letter_history WHERE letter_id = %s"
            " ORDER BY id",
            letter_id,
        )
    ]


def _letter_task(conn: Any, letter_id: int) -> tuple[str, str, str, int, int]:
    dag_id, run_id, stage, map_index, try_number = rows(
        conn,
        "SELECT dag_id, run_id, stage, map_index, try_number FROM replayable.dead_letters"
        " WHERE id = %s",
        letter_id,
    )[0]
    return dag_id, run_id, f"batch.{stage}", map_index, try_number


def _expected_log_path(conn: Any, letter_id: int) -> str:
    dag_id, run_id, task_id, map_index, try_number = _letter_task(conn, letter_id)
    return f"dags/{dag_id}/runs/{run_id}/tasks/{task_id}/mapped/{map_index}?try_number={try_number}"


def _assert_the_task_try_exists(airflow: RunningAirflow, conn: Any, letter_id: int) -> None:
    """The coordinates the links carry name a real task try, with a log, in Airflow."""
    dag_id, run_id, task_id, map_index, try_number = _letter_task(conn, letter_id)
    instance = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"
    with airflow.client("admin") as admin:
        ti = admin.get(f"{instance}/{map_index}")
        assert ti.status_code == 200, ti.text
        assert ti.json()["try_number"] >= try_number >= 1
        log = admin.get(
            f"{instance}/logs/{try_number}",
            params={"map_index": map_index},
            headers={"Accept": "application/json"},
        )
        assert log.status_code == 200, log.text


# ---- roles, with real tokens ---------------------------------------------------------------


def test_anonymous_requests_are_refused_everywhere(airflow: RunningAirflow, letter: int) -> None:
    with airflow.client() as anonymous:
        for path in _pages(letter):
            assert anonymous.get(path).status_code == 401, path
        for action in ("assign", "ignore"):
            posted = anonymous.post(
                f"/replayable/dead-letters/{letter}/{action}", data={"reason": "x"}
            )
            assert posted.status_code == 401


@pytest.mark.parametrize("username", ["viewer", "user", "op", "admin"])
def test_every_role_reads_every_page(airflow: RunningAirflow, letter: int, username: str) -> None:
    with airflow.client(username) as client:
        for path in _pages(letter):
            response = client.get(path)
            # Asked no question, the search page shows its box; its JSON twin names what is
            # missing, once the role has been let through.
            expected = 400 if path.startswith("/replayable/api/search") else 200
            assert response.status_code == expected, (username, path)
            assert "default-src 'none'" in response.headers["content-security-policy"]


@pytest.mark.parametrize(
    ("username", "allowed"), [("viewer", False), ("user", True), ("op", True), ("admin", True)]
)
def test_changing_the_work_list_needs_permission_to_edit_the_dag(
    airflow: RunningAirflow, conn: Any, letter: int, username: str, allowed: bool
) -> None:
    base = f"/replayable/dead-letters/{letter}"
    with airflow.client(username, follow_redirects=True) as client:
        assigned = client.post(f"{base}/assign", data={"owner": username, "note": "mine"})
        ignored = client.post(f"{base}/ignore", data={"reason": "known sample"})
    if not allowed:
        assert (assigned.status_code, ignored.status_code) == (403, 403)
        assert _letter_state(conn, letter) == ("open", None, "first")
        assert _actors(conn, letter) == []
        return
    assert (assigned.status_code, ignored.status_code) == (200, 200)  # after the redirect
    assert _letter_state(conn, letter) == ("ignored", username, "mine")
    assert _actors(conn, letter) == [(username, "assigned"), (username, "ignored")]


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example"},
        # A bearer scheme without a token ("Bearer " arrives so: a server strips the
        # trailing space): Airflow falls back to the cookie.
        {"Origin": "http://evil.example", "Authorization": "Bearer"},
        {},
    ],
)
def test_a_cookie_post_from_another_origin_is_refused(
    airflow: RunningAirflow, conn: Any, letter: int, headers: dict[str, str]
) -> None:
    """The UI's cookie authenticates; a blank bearer token does not skip the origin check."""
    with airflow.client() as browser:
        browser.cookies.set("_token", airflow.token("op"))
        refused = browser.post(
            f"/replayable/dead-letters/{letter}/assign", data={"owner": "mallory"}, headers=headers
        )
        assert refused.status_code == 403, refused.text
        assert "cross-origin" in refused.json()["detail"]
        same_origin = browser.post(
            f"/replayable/dead-letters/{letter}/assign",
            data={"owner": "olga"},
            headers={"Origin": airflow.url},
        )
        assert same_origin.status_code == 303
    assert _letter_state(conn, letter)[1] == "olga"
    assert _actors(conn, letter) == [("op", "assigned")]


# ---- redrive, as the logged-in user ---------------------------------------------------------


def _airflow_run(airflow: RunningAirflow, run_id: str) -> dict[str, Any]:
    with airflow.client("admin") as admin:
        response = admin.get(f"/api/v2/dags/{PIPELINE_DAG_ID}/dagRuns/{run_id}")
    response.raise_for_status()
    return dict(response.json())


def _runs_in_airflow(airflow: RunningAirflow) -> int:
    with airflow.client("admin") as admin:
        response = admin.get(f"/api/v2/dags/{PIPELINE_DAG_ID}/dagRuns", params={"limit": 1})
    response.raise_for_status()
    return int(response.json()["total_entries"])


@pytest.fixture(autouse=True)
def no_queued_run_left(shared_airflow: SharedAirflow) -> Iterator[None]:
    """Runs triggered here stay queued (the pipeline is paused between tests); the metadata
    database outlives the test, so they are deleted, or a later test's scheduling would run
    them."""
    yield
    delete_queued_runs(shared_airflow)


@pytest.mark.parametrize(("username", "allowed"), [("viewer", False), ("op", True)])
def test_a_redrive_from_the_ui_is_a_run_triggered_as_the_logged_in_user(
    airflow: RunningAirflow, conn: Any, letter: int, username: str, allowed: bool
) -> None:
    """The page asks Airflow's own REST API with the caller's token: Airflow decides and
    records them; a viewer changes nothing, in the ledger or in Airflow."""
    before = _runs_in_airflow(airflow)
    with airflow.client(username) as client:
        answer = client.post(
            "/replayable/dead-letters/redrive",
            data={"scope": "selected", "ids": [str(letter)], "reason": "parser fixed"},
        )
    if not allowed:
        assert answer.status_code == 403, answer.text
        assert _runs_in_airflow(airflow) == before
        assert _letter_state(conn, letter)[0] == "open"
        return
    assert answer.status_code == 200, answer.text
    run_id = answer.text.split('class="run" href="', 1)[1].split('"', 1)[0].rsplit("/", 1)[1]
    run = _airflow_run(airflow, run_id)
    assert run["triggering_user_name"] == username
    assert run["conf"] == {
        "redrive": {"stage": "extract", "ids": [letter], "reason": "parser fixed", "by": username}
    }
    # Nothing has run yet (the pipeline is paused): the letter stays open until a run takes it.
    assert _letter_state(conn, letter)[0] == "open"


def test_replayable_redrive_trigger_starts_the_run_as_the_airflow_user_it_logs_in_as(
    airflow: RunningAirflow, dsn: str, letter: int
) -> None:
    """The installed console script, against the running Airflow: a viewer is refused with
    Airflow's answer and exit code 2; op gets a run, printed with its link."""
    command = [str(ROOT / ".venv" / "bin" / "replayable"), "--dsn", dsn, "--json", "redrive"]
    command += ["--stage", "extract", "--id", str(letter), "--reason", "parser fixed"]
    command += ["--trigger", "--airflow-url", airflow.url]

    def replayable(username: str) -> subprocess.CompletedProcess[str]:
        env = {"PATH": "/usr/bin:/bin", "AIRFLOW_PASSWORD": airflow.password(username)}
        return subprocess.run(
            [*command, "--username", username],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    before = _runs_in_airflow(airflow)
    refused = replayable("viewer")
    assert refused.returncode == 2, refused.stderr
    assert "Airflow refused: 403" in refused.stderr
    assert airflow.password("viewer") not in refused.stdout + refused.stderr
    assert _runs_in_airflow(airflow) == before

    done = replayable("op")
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    run = _airflow_run(airflow, printed["run_id"])
    assert run["triggering_user_name"] == "op"
    assert run["conf"] == printed["conf"]
    assert printed["run_url"] == f"{airflow.url}/dags/{PIPELINE_DAG_ID}/runs/{printed['run_id']}"
    assert airflow.password("op") not in done.stdout + done.stderr


# ---- a browser session ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def chromium() -> Path:
    """Debian's Chromium, installed by tests/install-browser.sh if it is missing."""
    if not CHROMIUM.exists():
        done = subprocess.run(
            [str(ROOT / "tests" / "install-browser.sh")],
            capture_output=True,
            text=True,
            check=False,
            timeout=900,
        )
        if not CHROMIUM.exists():
            pytest.skip(
                "Chromium could not be installed, so the browser test cannot run: "
                + (done.stderr or done.stdout).strip()
            )
    return CHROMIUM


def _overview_counts(frame: Any) -> dict[str, list[int]]:
    """The overview table as {stage: [pending, running, done, failed, dead, total, open]}."""
    found = {}
    for row in frame.locator("table.stages tbody tr").all():
        stage, *numbers = [cell.strip() for cell in row.locator("td").all_inner_texts()]
        found[stage] = [int(n.replace(",", "")) for n in numbers]
    return found


def _ledger_counts(conn: Any) -> dict[str, list[int]]:
    statuses = ("pending", "running", "done", "failed", "dead")
    counts = {stage: dict.fromkeys(statuses, 0) for stage in STAGES}
    for stage, status, n in rows(
        conn,
        "SELECT stage, status, count(*) FROM replayable.stage_runs WHERE is_current"
        " GROUP BY stage, status",
    ):
        counts[stage][status] = int(n)
    open_letters = dict(
        rows(
            conn,
            "SELECT stage, count(*) FROM replayable.dead_letters WHERE status = 'open'"
            " GROUP BY stage",
        )
    )
    return {
        stage: [
            *(by_status[s] for s in statuses),
            sum(by_status.values()),
            int(open_letters.get(stage, 0)),
        ]
        for stage, by_status in counts.items()
    }


def test_a_browser_session_through_the_airflow_ui(
    airflow: RunningAirflow,
    chromium: Path,
    run_dag: Any,
    conn: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from playwright.sync_api import expect, sync_playwright

    folder = tmp_path / "pdfs"
    folder.mkdir()
    for sample in sorted(SAMPLES.glob("*.pdf"))[:3]:
        shutil.copy(sample, folder / sample.name)
    (folder / HOSTILE_NAME).write_bytes(b"This is no PDF; its name is an HTML payload.")
    # Embedded as make demo embeds, with the bundled model: the overview's box names no
    # model, and finds the documents through the one that holds their vectors (issue 37).
    report = run_dag({"source": str(folder), "batch_size": 4, "model": DEMO_MODEL})
    assert report["_returncode"] == 0, report["_log"]
    letter = scalar(
        conn,
        "SELECT dl.id FROM replayable.dead_letters dl JOIN replayable.documents d USING (doc_id)"
        " WHERE d.uri = %s AND dl.status = 'open'",
        str(folder / HOSTILE_NAME),
    )

    shots = tmp_path / "screenshots"
    shots.mkdir()
    dialogs: list[str] = []
    errors: list[str] = []
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),  # a fresh profile: no cookie, no cache
            executable_path=str(chromium),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            page = context.new_page()
            page.set_default_timeout(60_000)
            # A script that ran would most likely open a dialog; listen on every frame.
            page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
            page.on("pageerror", lambda error: errors.append(str(error)))

            page.goto(f"{airflow.url}/")
            page.get_by_label("Username").fill("op")
            page.get_by_label("Password").fill(airflow.password("op"))
            page.screenshot(path=shots / "1-login.png")
            page.get_by_role("button", name="Sign in").click()

            page.get_by_role("button", name="Browse").click()
            page.get_by_role("menuitem", name="Replayable").click()
            frame = page.frame_locator("iframe")
            expect(frame.get_by_role("heading", name="Overview")).to_be_visible()
            page.screenshot(path=shots / "2-overview.png")
            assert _overview_counts(frame) == _ledger_counts(conn)
            # The chart: one bar per hour of the last 48, which add up to the ledger's count.
            assert frame.locator("svg.per-hour rect").count() == 48
            frame.locator("svg.per-hour").screenshot(path=shots / "2-chart.png")
            hourly = frame.locator("table.per-hour tbody td.num").all_text_contents()
            assert sum(int(n) for n in hourly) == scalar(
                conn,
                "SELECT count(*) FROM replayable.dead_letters"
                " WHERE created_at >= date_trunc('hour', now()) - interval '47 hours'",
            )

            # Search from the overview's box; the question carries a payload, shown as text.
            frame.get_by_label("Search the documents").fill(f"{HOSTILE_NAME} a capacity report")
            frame.get_by_role("button", name="Search").click()
            expect(frame.get_by_role("heading", name="Search")).to_be_visible()
            hits = frame.locator("tr.hit")
            expect(hits.first).to_be_visible()
            first_document = hits.first.locator("td").nth(1).inner_text()
            assert any(sample.name in first_document for sample in folder.glob("*.pdf"))
            expect(frame.locator("p.caption")).to_contain_text(HOSTILE_NAME)
            expect(frame.locator("p.searched")).to_contain_text(
                f"Searched {DEMO_MODEL} under the settings of run {report['run_id']}: 3 documents"
            )
            assert frame.locator("img").count() == 0
            page.screenshot(path=shots / "2-search.png", full_page=True)

            frame.get_by_role("link", name="Dead letters", exact=True).click()
            row = frame.locator(f"#dl-{letter}")
            expect(row).to_contain_text(HOSTILE_NAME)  # shown as text
            row.locator("summary").click()
            expect(row.locator("details")).to_have_attribute("open", "")
            page.screenshot(path=shots / "3-dead-letters.png")

            row.get_by_role("link", name=str(letter), exact=True).click()
            expect(frame.get_by_role("heading", level=1)).to_contain_text(HOSTILE_NAME)
            assert frame.locator("img").count() == 0  # the payload made no element
            frame.get_by_label("Owner").fill("ana")
            frame.get_by_label("Note").fill("looking into the name")
            frame.get_by_role("button", name="Save owner and note").click()
            expect(frame.locator("table.history")).to_contain_text("assigned")
            expect(frame.get_by_role("heading", level=1)).to_contain_text(HOSTILE_NAME)
            page.screenshot(path=shots / "4-assigned.png", full_page=True)

            # The letter leads to the task try that wrote it, in Airflow's own UI.
            log_link = frame.locator("p.airflow").get_by_role("link", name="log", exact=False)
            href = log_link.get_attribute("href")
            # Relative to the plugin's iframe, not to the page around it.
            (frame_url,) = [f.url for f in page.frames if f != page.main_frame]
            target = urljoin(frame_url, href)
            assert target == f"{airflow.url}/{_expected_log_path(conn, letter)}"

            # Redrive it from the list: a run of document_pipeline, triggered as op.
            frame.get_by_role("link", name="Dead letters", exact=True).click()
            frame.get_by_label(f"Select dead letter {letter}").check()
            frame.get_by_label("Why redrive?").fill("the name is fine now")
            frame.get_by_role("button", name="Redrive ticked letters").click()
            run_link = frame.locator("a.run")
            expect(run_link).to_be_visible()
            page.screenshot(path=shots / "5-redrive.png", full_page=True)
            redriven = _airflow_run(airflow, run_link.inner_text().strip())
            assert redriven["triggering_user_name"] == "op"
            assert redriven["conf"]["redrive"]["ids"] == [letter]

            page.goto(target)
            expect(page.get_by_text("batch.extract").first).to_be_visible()
            page.screenshot(path=shots / "6-task-log.png")
        finally:
            context.close()

    with capsys.disabled():
        print(f"\nbrowser test screenshots: {shots}")
    assert dialogs == [] and errors == []
    assert rows(conn, "SELECT owner, note FROM replayable.dead_letters WHERE id = %s", letter) == [
        ("ana", "looking into the name")
    ]
    assert _actors(conn, letter) == [("op", "assigned")]
    assert sorted(path.name for path in shots.iterdir()) == [
        "1-login.png",
        "2-chart.png",
        "2-overview.png",
        "2-search.png",
        "3-dead-letters.png",
        "4-assigned.png",
        "5-redrive.png",
        "6-task-log.png",
    ]
    _assert_the_task_try_exists(airflow, conn, letter)
