"""embed_mode "batch": a submission that can never be advanced (its results unreadable, its
batch unknown to the provider, its upload refused) is abandoned after a bounded number of
passes, with a class and a message, and frees its chunks; it fails only its own documents
(ADR 0147). Charges are counted at the local provider."""

from __future__ import annotations

import contextlib
import itertools

import httpx
import pytest
from test_batch_mode import _batch_spec, _charged_twice, _try
from test_batch_refusals import _body, _chunks, _seed, _states

from checks import assert_nothing_lost, rows, scalar

pytestmark = pytest.mark.db

CAUSES = {
    "output file gone": "http_404",
    "malformed result line": "bad_response",
    "batch unknown after the connection changed": "batch_provider_changed",
    "upload refused every time": "http_413",
}


def _submission_of(conn, doc_chunks: set[str]) -> tuple[str, str | None]:
    ((submission, batch_id),) = rows(
        conn,
        "SELECT DISTINCT b.submission, b.batch_id FROM replayable.provider_batches b"
        " JOIN replayable.provider_batch_lines l USING (submission)"
        " WHERE l.chunk_ids && %s::text[]",
        sorted(doc_chunks),
    )
    return submission, batch_id


def _until_ended(conn, spec, connect, doc_ids, first, passes=16):
    """Run passes, as a task's wakes and retries would, until every document is done or
    dead."""
    for n in range(first, first + passes):
        _try(spec, connect, doc_ids, n)
        if {status for status, _ in _states(conn).values()} <= {"done", "dead"}:
            return
    pytest.fail(f"not ended after {passes} passes: {_states(conn)}")


@pytest.mark.parametrize("cause", list(CAUSES))
def test_a_submission_that_cannot_be_advanced_is_abandoned_and_fails_only_its_documents(
    conn, dsn, model, monkeypatch, cause
):
    from replayable.models.batch_api import BatchApi

    texts = {"x": _body("alpha") + " The end of x.", "y": _body("gamma") + " The end of y."}
    ids = _seed(conn, dsn, texts)
    model.set_faults(batch_delay_s=0)
    spec, connect = _batch_spec(dsn, model, inputs_per_call=64)
    _try(spec, connect, [ids["y"]], 1)  # y's task sends y's batch
    if cause == "upload refused every time":
        model.set_faults(batch_delay_s=0, files_max_total_bytes=1)
    _try(spec, connect, [ids["x"]], 2)  # x's task sends (or tries to send) x's
    submission, batch_id = _submission_of(conn, _chunks(texts["x"]))
    if cause == "output file gone":
        job = httpx.get(f"{model.base_url}/batches/{batch_id}").json()
        httpx.delete(f"{model.base_url}/files/{job['output_file_id']}").raise_for_status()
    elif cause == "malformed result line":
        output = httpx.get(f"{model.base_url}/batches/{batch_id}").json()["output_file_id"]
        result_lines = BatchApi.result_lines

        @contextlib.contextmanager
        def garbled(self, file_id):
            with result_lines(self, file_id) as lines:
                cut = ['{"custom_id": "cut off'] if file_id == output else []
                yield itertools.chain(cut, lines)

        monkeypatch.setattr(BatchApi, "result_lines", garbled)
    elif cause == "batch unknown after the connection changed":
        with conn.cursor() as cur:
            cur.execute(
                "UPDATE replayable.provider_batches SET provider = %s, batch_id = %s"
                " WHERE submission = %s",
                ("http://127.0.0.1:9/v1", "batch_at_the_old_provider", submission),
            )
        conn.commit()

    both = sorted(ids.values())
    first = _try(spec, connect, both, 3)  # a task holding both collects y's batch
    assert ids["y"] in first.done  # y's batch is y's alone: x's does not fail it
    _until_ended(conn, spec, connect, both, first=4)
    states = _states(conn)
    assert states[ids["y"]] == ("done", 1)
    ((status, tries, error_class, error),) = rows(
        conn,
        "SELECT status, tries, error_class, error FROM replayable.provider_batches"
        " WHERE submission = %s",
        submission,
    )
    assert (status, tries, error_class) == ("abandoned", 3, CAUSES[cause]), error
    assert (
        scalar(
            conn,
            "SELECT count(*) FROM replayable.provider_batch_chunks WHERE submission = %s",
            submission,
        )
        == 0
    )
    if cause == "upload refused every time":
        assert states[ids["x"]][0] == "dead"  # every submission of it refused, to the cap
        assert _charged_twice(model) == {}
    else:
        assert states[ids["x"]][0] == "done"  # sent again in a new submission
        # Only x's lines can be charged twice: the answers lost with x's first batch.
        assert set(_charged_twice(model)) <= {
            cid
            for (cid,) in rows(
                conn,
                "SELECT custom_id FROM replayable.provider_batch_lines WHERE submission = %s",
                submission,
            )
        }
    assert_nothing_lost(conn, one_version=False)


def test_a_run_whose_batch_the_provider_forgot_ends_done_through_the_trigger(
    run_in_process, conn, model, tmp_path, monkeypatch
):
    """The provider forgets the run's first batch (another account behind the connection):
    the trigger ends each wait on its 404 at once instead of polling for a day, the task
    abandons the submission at its third pass, and its retry sends the chunks again."""
    from test_batch_mode import FAST

    import in_process
    from checks import subset
    from replayable.models.batch_api import BatchApi

    created, forgotten = BatchApi.create, []

    def create_then_forget(self, submission, file_id):
        job = created(self, submission, file_id)
        if not forgotten:
            forgotten.append(job.id)
            model.reset_stats()  # drops every file and batch the provider holds
        return job

    monkeypatch.setattr(BatchApi, "create", create_then_forget)
    model.set_faults(batch_delay_s=0.2)
    report = run_in_process({"source": str(subset(tmp_path, 3)), **FAST})
    assert not report["_failed"], report["_tasks"]
    assert report["stages"]["embed"]["done"] == 3
    assert rows(
        conn,
        "SELECT batch_id, status, tries, error_class FROM replayable.provider_batches"
        " WHERE status = 'abandoned'",
    ) == [(forgotten[0], "abandoned", 3, "http_404")]
    assert len(in_process.DEFERRALS) >= 3  # each wait on the forgotten batch ended
    assert _charged_twice(model) == {}
    assert_nothing_lost(conn)
