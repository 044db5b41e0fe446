"""The batch tables stay cheap to read as they grow (ADR 0117, 0147): a collect counts its
missing lines' earlier windows in one indexed statement, and finished submissions are
pruned after a retention."""

from __future__ import annotations

import httpx
import pytest
from test_batch_mode import _batch_spec, _try
from test_batch_refusals import _body, _seed

from checks import rows, scalar

pytestmark = pytest.mark.db


def test_a_collect_counts_the_earlier_windows_of_all_its_missing_lines_in_one_statement(
    conn, dsn, model, monkeypatch
):
    from replayable.stages.embed import batch_collect

    ids = _seed(conn, dsn, {"x": _body("alpha") + " The end of x."})
    model.set_faults(batch_delay_s=0, batch_expire_after_fraction=0.0)  # no line runs
    spec, connect = _batch_spec(dsn, model, inputs_per_call=1)  # a line per chunk
    _try(spec, connect, list(ids.values()), 1)
    lines = scalar(conn, "SELECT count(*) FROM replayable.provider_batch_lines")
    assert lines > 2
    counted = []
    fetch_all = batch_collect.fetch_all

    def counting(conn, query, params=None):
        counted.append(query)
        return fetch_all(conn, query, params)

    monkeypatch.setattr(batch_collect, "fetch_all", counting)
    _try(spec, connect, list(ids.values()), 2)  # collects the expired batch
    assert (
        scalar(conn, "SELECT count(*) FROM replayable.provider_batch_lines WHERE status = 'resent'")
        == lines
    )  # every line missed its window, and was sent again
    assert counted.count("batches/line_tries") == 1


def test_the_earlier_windows_of_a_line_are_read_through_an_index(conn):
    (indexdef,) = rows(
        conn,
        "SELECT indexdef FROM pg_indexes WHERE schemaname = 'replayable'"
        " AND tablename = 'provider_batch_lines' AND indexdef LIKE '%%(custom_id)%%'",
    )[0]
    assert "status = 'resent'" in indexdef


def test_finished_submissions_past_the_retention_are_pruned_with_their_lines(conn, dsn, model):
    from replayable.stages.embed.batch_files import prune_finished_submissions

    ids = _seed(conn, dsn, {"x": _body("alpha") + " The end of x.", "y": _body("gamma")})
    model.set_faults(batch_delay_s=0)
    spec, connect = _batch_spec(dsn, model, inputs_per_call=64)
    _try(spec, connect, [ids["x"]], 1)
    _try(spec, connect, [ids["x"]], 2)  # collected
    model.set_faults(batch_delay_s=3600)
    _try(spec, connect, [ids["y"]], 3)  # waiting, for an hour
    with conn.cursor() as cur:
        cur.execute(
            "UPDATE replayable.provider_batches"
            " SET created_at = now() - interval '40 days', updated_at = now() - interval '40 days'"
        )
    conn.commit()
    statuses = dict(
        rows(conn, "SELECT status, count(*) FROM replayable.provider_batches GROUP BY 1")
    )
    assert statuses == {"collected": 1, "waiting": 1}
    assert prune_finished_submissions(conn, retention_days=30, chunk=1) == 1
    assert rows(conn, "SELECT status FROM replayable.provider_batches") == [("waiting",)]
    assert (
        scalar(
            conn,
            "SELECT count(*) FROM replayable.provider_batch_lines l"
            " LEFT JOIN replayable.provider_batches b USING (submission) WHERE b.status IS NULL",
        )
        == 0
    )
    assert prune_finished_submissions(conn, retention_days=30) == 0


def _provider_files(model) -> dict[str, str]:
    """Every file the provider keeps, uploads and results: id -> purpose."""
    listed = httpx.get(f"{model.base_url}/files").json()["data"]
    return {item["id"]: item["purpose"] for item in listed}


def test_the_sweep_deletes_the_files_of_finished_batches_that_a_collect_could_not(
    conn, dsn, model, monkeypatch
):
    """A collect deletes a batch's input, output and error files; those it could not delete
    (the provider down a moment) are the sweep's: every file of a finished submission goes,
    and the files of a batch still running stay."""
    from replayable.models.batch_api import BatchApi
    from replayable.stages.embed.batch_files import sweep_orphan_files

    poisoned = _body("alpha", poison="POISON-400.")
    ids = _seed(conn, dsn, {"x": poisoned, "y": _body("gamma") + " The end of y."})
    model.set_faults(batch_delay_s=0, batch_fail_inputs_containing={"POISON-400": 400})
    spec, connect = _batch_spec(dsn, model, inputs_per_call=1)
    delete_file = BatchApi.delete_file

    def provider_down(self, file_id):
        raise httpx.ConnectError("the provider is down a moment")

    monkeypatch.setattr(BatchApi, "delete_file", provider_down)
    _try(spec, connect, [ids["x"]], 1)
    _try(spec, connect, [ids["x"]], 2)  # collected: output and error files, not deleted
    model.set_faults(batch_delay_s=3600)
    _try(spec, connect, [ids["y"]], 3)  # y's batch runs for an hour
    monkeypatch.setattr(BatchApi, "delete_file", delete_file)
    before = _provider_files(model)
    assert sorted(before.values()) == ["batch", "batch", "batch_output", "batch_output"]
    ((running_input,),) = rows(
        conn, "SELECT input_file_id FROM replayable.provider_batches WHERE status = 'waiting'"
    )
    deleted = sweep_orphan_files(spec.batches, conn, older_than_s=0)
    assert sorted(deleted) == sorted(set(before) - {running_input})
    assert _provider_files(model) == {running_input: "batch"}


def test_a_collect_streams_the_result_file_and_stores_it_in_bounded_slices(
    conn, dsn, model, monkeypatch
):
    """A result file is read as it arrives, never whole, and its vectors are stored a
    bounded slice at a time, in the collect's one transaction."""
    from replayable.models.batch_api import BatchApi
    from replayable.stages.embed import batch_collect

    ids = _seed(conn, dsn, {"x": _body("alpha") + " The end of x.", "y": _body("gamma")})
    model.set_faults(batch_delay_s=0)
    spec, connect = _batch_spec(dsn, model, inputs_per_call=1)  # a line per chunk
    chunks = scalar(conn, "SELECT count(DISTINCT chunk_id) FROM replayable.doc_chunks")
    assert chunks > 4

    def whole_file(self, file_id):
        raise AssertionError("a result file is read whole")

    monkeypatch.setattr(BatchApi, "content", whole_file)
    monkeypatch.setattr(batch_collect, "SLICE_INPUTS", 2, raising=False)
    stored = []
    store_vectors = batch_collect.store_vectors

    def store_slice(conn, model, dimensions, chunk_ids, vectors):
        stored.append(len(chunk_ids))
        return store_vectors(conn, model, dimensions, chunk_ids, vectors)

    monkeypatch.setattr(batch_collect, "store_vectors", store_slice)
    _try(spec, connect, sorted(ids.values()), 1)
    assert sorted(_try(spec, connect, sorted(ids.values()), 2).done) == sorted(ids.values())
    assert sum(stored) == chunks and max(stored) <= 2
    assert scalar(conn, "SELECT count(*) FROM replayable.embeddings") == chunks
