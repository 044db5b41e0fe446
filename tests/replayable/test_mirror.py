"""The index mirrors the sources (ADR 0138): a run over a whole source retracts the documents
its listing lost, supersedes changed ones, restores returning ones for free, and its guard
retracts nothing from an empty, unreadable or much smaller listing, saying why.

Each run is document_pipeline's own plan, stages and report, in this process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

import corpus
from checks import SAMPLES, rows, scalar, subset
from helpers import ROOT
from replayable import mirror, search
from replayable.keys import sha256_file
from replayable.pipeline import format_report


def _doc_id(path: Path) -> str:
    return sha256_file(str(path))


def _events(conn: Any) -> dict[str, int]:
    found = rows(
        conn,
        "SELECT event_type, count(*) AS n FROM replayable.outbox"
        " WHERE event_type LIKE 'document.%%' AND event_type NOT IN"
        " ('document.ready', 'document.failed') GROUP BY event_type",
    )
    return {event_type: int(n) for event_type, n in found}


def _retracted(conn: Any) -> set[str]:
    found = rows(conn, "SELECT doc_id FROM replayable.documents WHERE retracted_at IS NOT NULL")
    return {doc_id for (doc_id,) in found}


def _search_docs(conn: Any, dsn: str, text: str) -> set[str]:
    answer = search.answer(conn, text, dsn=dsn, k=50)
    return {hit.doc_id for hit in answer.hits}


def _first_chunk_text(conn: Any, doc_id: str) -> str:
    return str(
        scalar(
            conn,
            "SELECT c.text FROM replayable.doc_chunks dc JOIN replayable.chunks c USING"
            " (chunk_id) WHERE dc.doc_id = %s ORDER BY dc.ordinal LIMIT 1",
            doc_id,
        )
    )


def _paid_docs(conn: Any, run_id: str) -> set[str]:
    """The documents whose items the run's model calls were for."""
    found = rows(
        conn,
        "SELECT DISTINCT s.doc_id FROM replayable.model_calls m"
        " LEFT JOIN replayable.model_call_items i ON i.call_id = m.id"
        " JOIN replayable.stage_runs s ON s.stage = m.stage"
        "  AND s.item_key = coalesce(i.item_key, m.item_key)"
        " WHERE m.run_id = %s",
        run_id,
    )
    return {doc_id for (doc_id,) in found}


def _demo_conf() -> dict[str, Any]:
    """The CONF ``make demo`` runs with (on the samples, its default source)."""
    found = re.search(r"^demo:.*\n\t.* CONF='(\{.*\})'", (ROOT / "Makefile").read_text(), re.M)
    assert found, "make demo's CONF"
    return dict(json.loads(found.group(1)))


def test_deleted_and_replaced_files_leave_search_with_events_and_the_rerun_pays_only_the_new(
    run_in_process, conn, dsn, tmp_path
):
    """The acceptance, as a new user would: ``make demo``, delete two sample PDFs, replace a
    third with another document under its name, ``make demo`` again (the demo's own settings,
    on a copy of sixteen samples: two of its batches, and fewer retracted than its limit)."""
    folder = subset(tmp_path, 16)
    conf = {**_demo_conf(), "source": str(folder)}
    first = run_in_process(conf)
    assert not first["_failed"], first["_tasks"]
    names = sorted(p.name for p in folder.iterdir())
    deleted = [folder / names[0], folder / names[1]]
    replaced = folder / names[2]
    gone = {_doc_id(p) for p in (*deleted, replaced)}
    texts = {doc: _first_chunk_text(conn, doc) for doc in gone}
    for path in deleted:
        path.unlink()
    corpus.write_pdf(replaced, ["A new report under an old name: the tide tables of the bay."])
    new_doc = _doc_id(replaced)

    second = run_in_process(conf)

    assert not second["_failed"], second["_tasks"]
    assert second["mirror"] == {"retracted": 2, "superseded": 1, "restored": 0, "refused": None}
    assert "index: 2 retracted (deleted), 1 superseded (updated), 0 restored" in format_report(
        second
    )
    assert _retracted(conn) == gone
    assert _events(conn) == {"document.deleted": 2, "document.updated": 1}
    published = "SELECT count(*) FROM replayable.outbox WHERE status = 'published'"
    assert (
        scalar(conn, f"{published} AND event_type IN ('document.deleted', 'document.updated')") == 3
    )
    ((old, payload),) = rows(
        conn,
        "SELECT aggregate_id, payload FROM replayable.outbox WHERE event_type = 'document.updated'",
    )
    assert old in gone and payload["successor"] == new_doc
    assert payload["uri"] == str(replaced)
    for doc, text in texts.items():
        found = _search_docs(conn, dsn, text)
        assert found, "the search found nothing at all"
        assert doc not in found
        assert not found & gone
    assert second["to_do"] == 1
    assert _paid_docs(conn, second["run_id"]) == {new_doc}
    _counts_shown(conn, second["run_id"])


def _counts_shown(conn: Any, run_id: str) -> None:
    """The CLI's status (all runs, and the run) and the UI's overview show the counts."""
    from replayable.cli.render import index_line
    from replayable.read import status_data
    from replayable.web.reads import summary

    assert status_data(conn, None)["index"] == {"retracted": 3, "purged": 0}
    of_run = status_data(conn, run_id)
    assert of_run["index"]["retracted"] == 2 and of_run["index"]["superseded"] == 1
    assert "2 retracted (deleted), 1 superseded (updated)" in str(index_line(of_run))
    assert summary(conn).index.retracted == 3


def test_a_document_that_comes_back_is_restored_with_no_model_call(
    run_in_process, conn, dsn, tmp_path
):
    folder = subset(tmp_path, 6)
    assert not run_in_process({"source": str(folder)})["_failed"]
    kept = tmp_path / "kept.pdf"
    back = sorted(folder.iterdir())[0]
    shutil.move(back, kept)
    doc = _doc_id(kept)
    assert run_in_process({"source": str(folder)})["mirror"]["retracted"] == 1
    assert _retracted(conn) == {doc}
    calls = scalar(conn, "SELECT count(*) FROM replayable.model_calls")
    shutil.move(kept, back)

    report = run_in_process({"source": str(folder)})

    assert not report["_failed"], report["_tasks"]
    assert report["mirror"]["restored"] == 1
    assert _retracted(conn) == set()
    assert scalar(conn, "SELECT count(*) FROM replayable.model_calls") == calls
    assert report["to_do"] == 0
    assert _events(conn) == {"document.deleted": 1, "document.restored": 1}
    assert doc in _search_docs(conn, dsn, _first_chunk_text(conn, doc))


def test_a_path_deleted_while_another_path_or_source_holds_the_same_bytes_retracts_nothing(
    run_in_process, conn, tmp_path
):
    """Two paths, or two sources, with one content are one document (its id is its bytes):
    losing one of them must not retract what the other still holds."""
    folder = subset(tmp_path, 8)
    first = sorted(folder.iterdir())[0]
    twin = folder / "twin.pdf"
    shutil.copy(first, twin)
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(first, other / "copy.pdf")
    doc = _doc_id(first)
    for source in (folder, other):
        assert not run_in_process({"source": str(source)})["_failed"]

    first.unlink()
    report = run_in_process({"source": str(folder)})
    assert report["mirror"]["retracted"] == 0
    twin.unlink()
    report = run_in_process({"source": str(folder)})
    assert report["mirror"]["retracted"] == 0, "the other source still holds it"
    assert _retracted(conn) == set()

    (other / "copy.pdf").unlink()
    shutil.copy(sorted(folder.iterdir())[0], other / "another.pdf")
    # The one document of that source's last listing: over the guard's share, so confirmed.
    report = run_in_process({"source": str(other), "confirm_retract": 1})
    assert not report["_failed"], report["_tasks"]
    assert report["mirror"]["retracted"] == 1
    assert _retracted(conn) == {doc}


def _emptied(folder: Path) -> None:
    for path in folder.iterdir():
        path.unlink()


def _unreadable(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Listing ``folder`` fails as it does for a user without the right (tests run as root)."""
    real = os.scandir

    def scandir(path: Any = ".") -> Any:
        if os.path.realpath(path) == os.path.realpath(folder):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)


@pytest.mark.parametrize(
    ("spoil", "why"),
    [
        (lambda folder, _mp: _emptied(folder), "is empty"),
        (_unreadable, "could not be listed"),
    ],
    ids=["empty", "unreadable"],
)
def test_an_empty_or_unreadable_source_retracts_nothing_and_says_why(
    run_in_process, conn, tmp_path, monkeypatch, spoil, why
):
    folder = subset(tmp_path, 5)
    assert not run_in_process({"source": str(folder)})["_failed"]
    spoil(folder, monkeypatch)

    report = run_in_process({"source": str(folder)})

    assert report["_failed"]
    refused = report["mirror"]["refused"]
    assert refused.startswith("nothing retracted") and why in refused
    assert str(report["_tasks"]["report", -1].error) == refused
    assert refused in format_report(report)
    assert _retracted(conn) == set()
    assert _events(conn) == {}
    assert scalar(conn, "SELECT count(*) FROM replayable.source_files") == 5


def test_over_max_retract_fraction_the_run_refuses_names_the_override_and_it_works(
    run_in_process, conn, tmp_path
):
    folder = subset(tmp_path, 5)
    assert not run_in_process({"source": str(folder)})["_failed"]
    for path in sorted(folder.iterdir())[:2]:
        path.unlink()

    refused = run_in_process({"source": str(folder)})
    assert refused["_failed"]
    reason = refused["mirror"]["refused"]
    assert "2 of the 5 document(s)" in reason and "max_retract_fraction 0.2" in reason
    assert '{"confirm_retract": 2}' in reason
    assert _retracted(conn) == set()
    lowered = run_in_process({"source": str(folder), "max_retract_fraction": 0.1})
    assert "max_retract_fraction 0.1" in lowered["mirror"]["refused"]
    wrong = run_in_process({"source": str(folder), "confirm_retract": 3})
    assert wrong["mirror"]["refused"] and _retracted(conn) == set()

    confirmed = run_in_process({"source": str(folder), "confirm_retract": 2})
    assert not confirmed["_failed"], confirmed["_tasks"]
    assert confirmed["mirror"]["retracted"] == 2
    assert len(_retracted(conn)) == 2


@pytest.mark.parametrize(
    ("field", "value"), [("max_retract_fraction", 0.5), ("confirm_retract", 0)]
)
def test_a_retract_setting_out_of_bounds_is_refused_at_trigger_time_naming_it(field, value):
    from airflow.sdk.definitions.param import ParamsDict
    from airflow.sdk.exceptions import ParamValidationError

    from replayable import pipeline_params
    from replayable.settings import PipelineSettings

    params = ParamsDict(pipeline_params(str(SAMPLES)))
    with pytest.raises(ParamValidationError, match=field):
        params.update({field: value})
        params.validate()
    with pytest.raises(ValueError, match=field):
        PipelineSettings(**{field: value})


def test_a_partial_run_never_retracts(run_in_process, conn, tmp_path):
    """A glob's subset, a re-run and a redrive list no whole source."""
    folder = subset(tmp_path, 6)
    assert not run_in_process({"source": str(folder)})["_failed"]
    glob = run_in_process({"source": str(folder / "doc-00[12]*.pdf")})
    assert not glob["_failed"] and glob["documents"] == 2
    rerun = run_in_process({"source": str(folder), "rerun": {"stage": "embed"}})
    assert not rerun["_failed"], rerun["_tasks"]
    for report in (glob, rerun):
        assert report["mirror"] == {
            "retracted": 0,
            "superseded": 0,
            "restored": 0,
            "refused": None,
        }
    assert _retracted(conn) == set()
    assert scalar(conn, "SELECT count(*) FROM replayable.source_files") == 6


def _run_then_retract_one(run_in_process: Any, tmp_path: Path) -> str:
    """Run on six samples, delete one, run again; return the retracted document's id."""
    folder = subset(tmp_path, 6)
    assert not run_in_process({"source": str(folder)})["_failed"]
    gone = sorted(folder.iterdir())[0]
    doc = _doc_id(gone)
    gone.unlink()
    assert run_in_process({"source": str(folder)})["mirror"]["retracted"] == 1
    return doc


def test_the_sweep_purges_what_only_retracted_documents_held_after_the_retention(
    run_in_process, conn, tmp_path
):
    doc = _run_then_retract_one(run_in_process, tmp_path)
    own = {
        chunk_id
        for (chunk_id,) in rows(
            conn,
            "SELECT chunk_id FROM replayable.doc_chunks WHERE doc_id = %s EXCEPT"
            " SELECT chunk_id FROM replayable.doc_chunks WHERE doc_id <> %s",
            doc,
            doc,
        )
    }
    vectors = scalar(conn, "SELECT count(*) FROM replayable.embeddings")
    conn.commit()

    assert mirror.purge(conn, retention_days=1) == 0  # retracted a moment ago: kept
    assert mirror.purge(conn, retention_days=0) == 1

    assert scalar(conn, "SELECT count(*) FROM replayable.doc_chunks WHERE doc_id = %s", doc) == 0
    assert scalar(conn, "SELECT count(*) FROM replayable.stage_runs WHERE doc_id = %s", doc) == 0
    assert scalar(conn, "SELECT count(*) FROM replayable.embeddings") == vectors - len(own)
    assert mirror.retracted(conn) == {"retracted": 1, "purged": 1}
    assert mirror.purge(conn, retention_days=0) == 0


def _discover(conn: Any, folder: Path, run_id: str) -> None:
    from replayable.pipeline import discover

    discover(
        conn,
        str(folder),
        dag_id="d",
        run_id=run_id,
        roots=[str(folder)],
        max_bytes=2**30,
        policy=mirror.Policy(),
    )


def _small_source(tmp_path: Path, n: int) -> Path:
    folder = tmp_path / "small"
    folder.mkdir()
    for i in range(n):
        (folder / f"f{i}.pdf").write_bytes(f"%PDF-1.4 file {i}\n".encode())
    return folder


def test_a_plan_that_runs_again_retracts_nothing_twice_and_reports_its_first_try(conn, tmp_path):
    """A retried ``plan`` (same run) finds the listing its first try left: no second
    retraction, no second event, and the run's counts are still the first try's."""
    folder = _small_source(tmp_path, 10)
    _discover(conn, folder, "r1")
    (folder / "f0.pdf").unlink()
    _discover(conn, folder, "r2")
    _discover(conn, folder, "r2")
    assert mirror.run_counts(conn, dag_id="d", run_id="r2")["retracted"] == 1
    assert _events(conn) == {"document.deleted": 1}


def test_a_file_that_cannot_be_read_keeps_the_document_its_path_held(conn, tmp_path, monkeypatch):
    """Unread is not changed: a file whose stat changed and that cannot be hashed any more
    (its permissions, say) supersedes nothing."""
    from replayable.pipeline import discovery

    folder = _small_source(tmp_path, 10)
    _discover(conn, folder, "r1")
    locked = folder / "f3.pdf"
    os.utime(locked, ns=(1, 1))  # the stat differs from the cache: it is hashed again
    real = discovery.sha256_file

    def sha256_file(path: str) -> str:
        if path == str(locked):
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(discovery, "sha256_file", sha256_file)
    _discover(conn, folder, "r2")
    assert mirror.run_counts(conn, dag_id="d", run_id="r2") == {
        "retracted": 0,
        "superseded": 0,
        "restored": 0,
        "refused": None,
    }
    assert _retracted(conn) == set()


def test_the_sweeper_task_purges_documents_retracted_longer_ago_than_the_retention(
    run_in_process, conn, tmp_path, monkeypatch
):
    from types import SimpleNamespace

    from replayable.airflow import tasks as dag_tasks
    from replayable.airflow.tasks import common

    doc = _run_then_retract_one(run_in_process, tmp_path)
    ti = SimpleNamespace(dag_id="replayable_sweeper", run_id="sweep-1")
    params = {"max_attempts": 3, "min_age_minutes": 10, "max_items": 100}
    monkeypatch.setattr(common, "get_current_context", lambda: {"ti": ti, "params": params})

    assert dag_tasks.sweep() == []
    assert mirror.retracted(conn) == {"retracted": 1, "purged": 0}  # within the retention
    days = mirror.RETENTION_DAYS + 1
    rows(
        conn,
        "UPDATE replayable.documents SET retracted_at = now() - make_interval(days => %s)"
        " WHERE doc_id = %s RETURNING doc_id",
        days,
        doc,
    )
    assert dag_tasks.sweep() == []
    assert mirror.retracted(conn) == {"retracted": 1, "purged": 1}
    assert scalar(conn, "SELECT count(*) FROM replayable.doc_chunks WHERE doc_id = %s", doc) == 0


def test_the_open_dead_letters_of_a_retracted_document_leave_the_work_list(
    run_in_process, conn, model, tmp_path
):
    folder = subset(tmp_path, 9)
    poisoned = folder / "poisoned.pdf"
    corpus.write_pdf(poisoned, ["This text makes the provider answer POISON-400."])
    model.set_faults(fail_inputs_containing={"POISON-400": 400})
    assert run_in_process({"source": str(folder)})["dead"]["documents"] == 1
    poisoned.unlink()

    report = run_in_process({"source": str(folder)})

    assert report["mirror"]["retracted"] == 1
    ((status, resolved_by, resolution),) = rows(
        conn, "SELECT status, resolved_by, resolution FROM replayable.dead_letters"
    )
    assert (status, resolved_by) == ("ignored", "discover")
    assert "document.deleted" in resolution and "retracted" in resolution
