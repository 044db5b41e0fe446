"""Discover, plan and report against a real Postgres; settings validation."""

import json
import os
import shutil
from pathlib import Path

import pytest

from checks import rows
from replayable import db, keys, pipeline
from replayable.ledger import Ledger, Outcome, RunContext
from replayable.pipeline import discover, discovery, format_report, plan_batches
from replayable.retry import Classified, ErrorKind
from replayable.settings import PipelineSettings
from replayable.stages.builtin import document_pipeline
from replayable.stages.chunk.chunker import chunk_config_of
from replayable.stages.lineage import spec_hashes
from replayable.vocabulary import STAGES

SAMPLES = Path(__file__).resolve().parents[2] / "data" / "samples"
SETTINGS = PipelineSettings(batch_size=2)
HASHES = spec_hashes(chunk_config_of(SETTINGS), "m", None)


def run_discover(conn, folder, run_id="r1", max_bytes=2**30):
    return discover(
        conn, str(folder), dag_id="d", run_id=run_id, roots=[str(folder)], max_bytes=max_bytes
    )


def run_docs(conn, run_id="r1"):
    return [
        r[0]
        for r in rows(
            conn, "SELECT doc_id FROM replayable.run_docs WHERE run_id = %s ORDER BY 1", run_id
        )
    ]


@pytest.fixture
def hashed(monkeypatch):
    """The paths discover reads, in the order it reads them."""
    seen: list[str] = []
    real = keys.sha256_file

    def counting(path):
        seen.append(Path(path).name)
        return real(path)

    monkeypatch.setattr(discovery, "sha256_file", counting)
    return seen


pytestmark = pytest.mark.db


def test_discover_records_the_same_bytes_once(conn, tmp_path):
    sample = sorted(SAMPLES.glob("*.pdf"))[0]
    shutil.copy(sample, tmp_path / "one.pdf")
    shutil.copy(sample, tmp_path / "copy.pdf")
    assert run_discover(conn, tmp_path) == 1
    assert run_discover(conn, tmp_path, run_id="r2") == 1
    assert run_docs(conn) == run_docs(conn, "r2") == [keys.sha256_file(sample)]


def test_an_unchanged_file_is_not_read_again_and_a_changed_one_is(conn, tmp_path, hashed):
    for sample in sorted(SAMPLES.glob("*.pdf"))[:3]:
        shutil.copy(sample, tmp_path / sample.name)
    run_discover(conn, tmp_path)
    assert len(hashed) == 3
    hashed.clear()
    run_discover(conn, tmp_path, run_id="r2")
    assert hashed == []
    changed = sorted(tmp_path.iterdir())[1]
    changed.write_bytes(changed.read_bytes() + b"\n%% appended\n")
    run_discover(conn, tmp_path, run_id="r3")
    assert hashed == [changed.name]
    assert keys.sha256_file(changed) in run_docs(conn, "r3")


def test_a_file_over_max_bytes_is_recorded_from_its_stat_and_never_read(conn, tmp_path, hashed):
    big = tmp_path / "big.pdf"
    big.write_bytes(b"%PDF-1.4\n" + b"0" * 5000)
    assert run_discover(conn, tmp_path, max_bytes=1000) == 1
    assert hashed == []
    ((doc_id, size),) = rows(conn, "SELECT doc_id, size_bytes FROM replayable.documents")
    assert size == big.stat().st_size and doc_id != keys.sha256_file(big)


def test_a_moved_file_takes_its_new_path_and_reopens_its_missing_file_letter(conn, dsn, tmp_path):
    sample = sorted(SAMPLES.glob("*.pdf"))[0]
    shutil.copy(sample, tmp_path / "old.pdf")
    run_discover(conn, tmp_path)
    (doc_id,) = run_docs(conn)
    database = db.Database(dsn)
    ledger = Ledger(database, "extract", "1.0", "c", HASHES["extract"], RunContext(owner="w"))
    ledger.claim([("k", doc_id)])
    missing = Classified("missing_file", ErrorKind.TERMINAL, "gone")
    database.transaction(lambda c: ledger.finish(c, [Outcome("k", "failed", missing)]))
    os.rename(tmp_path / "old.pdf", tmp_path / "new.pdf")
    run_discover(conn, tmp_path, run_id="r2")
    assert rows(conn, "SELECT uri FROM replayable.documents") == [(str(tmp_path / "new.pdf"),)]
    assert rows(conn, "SELECT status FROM replayable.stage_runs") == [("pending",)]
    assert rows(conn, "SELECT status, resolved_by FROM replayable.dead_letters") == [
        ("redriven", "discover")
    ]
    database.close()


def finish_all(database, stage, doc_ids, outcome="done", error=None):
    ledger = Ledger(database, stage, "1.0", "c", HASHES[stage], RunContext(owner="w"))
    ledger.claim([(f"{stage}-{d}", d) for d in doc_ids])
    database.transaction(
        lambda c: ledger.finish(c, [Outcome(f"{stage}-{d}", outcome, error) for d in doc_ids])
    )


def test_an_identical_rerun_maps_no_batch(conn, dsn, tmp_path):
    for sample in sorted(SAMPLES.glob("*.pdf"))[:5]:
        shutil.copy(sample, tmp_path / sample.name)
    run_discover(conn, tmp_path)
    docs = run_docs(conn)
    batches = plan_batches(conn, SETTINGS, dag_id="d", run_id="r1", spec_hashes=HASHES)
    assert [b["size"] for b in batches] == [2, 2, 1]
    assert [b["label"] for b in batches] == [
        "batch 0: docs 0-1",
        "batch 1: docs 2-3",
        "batch 2: docs 4-4",
    ]
    database = db.Database(dsn)
    for stage in STAGES:
        finish_all(database, stage, docs)
    database.close()
    run_discover(conn, tmp_path, run_id="r2")
    assert plan_batches(conn, SETTINGS, dag_id="d", run_id="r2", spec_hashes=HASHES) == []
    # A new model changes the embed spec: only embed has work now, for every document.
    other = spec_hashes(chunk_config_of(SETTINGS), "other-model", None)
    assert sum(
        b["size"] for b in plan_batches(conn, SETTINGS, dag_id="d", run_id="r2", spec_hashes=other)
    ) == len(docs)


def test_dead_items_map_no_batch_unless_the_run_revives_them(conn, dsn, tmp_path):
    for sample in sorted(SAMPLES.glob("*.pdf"))[:3]:
        shutil.copy(sample, tmp_path / sample.name)
    run_discover(conn, tmp_path)
    docs = run_docs(conn)
    database = db.Database(dsn)
    finish_all(
        database, "extract", docs[:1], "failed", Classified("encrypted", ErrorKind.TERMINAL, "x")
    )
    finish_all(database, "extract", docs[1:])
    for stage in ("chunk", "embed"):
        finish_all(database, stage, docs[1:])
    database.close()
    assert plan_batches(conn, SETTINGS, dag_id="d", run_id="r1", spec_hashes=HASHES) == []
    revive = PipelineSettings(rerun={"stage": "extract", "status": ["dead"]})
    batches = plan_batches(conn, revive, dag_id="d", run_id="r1", spec_hashes=HASHES)
    assert sum(b["size"] for b in batches) == 1


def test_each_chain_of_inputs_is_planned_on_its_own(conn, dsn, tmp_path):
    """summarize reads extract, beside chunk: a document done (or dead) through embed has
    work only for a run that summarises, and a dead summary holds back nothing on the other
    chain, nor a dead embedding the summary."""
    for sample in sorted(SAMPLES.glob("*.pdf"))[:3]:
        shutil.copy(sample, tmp_path / sample.name)
    run_discover(conn, tmp_path)
    docs = run_docs(conn)
    database = db.Database(dsn)
    for stage in ("extract", "chunk"):
        finish_all(database, stage, docs)
    finish_all(database, "embed", docs[1:])
    too_long = Classified("input_too_long", ErrorKind.TERMINAL, "a chunk is too long")
    finish_all(database, "embed", docs[:1], "failed", too_long)
    assert plan_batches(conn, SETTINGS, dag_id="d", run_id="r1", spec_hashes=HASHES) == []
    summarising = PipelineSettings(batch_size=2, stages=STAGES)
    batches = plan_batches(conn, summarising, dag_id="d", run_id="r1", spec_hashes=HASHES)
    assert sum(b["size"] for b in batches) == 3

    finish_all(database, "summarize", docs[:2])
    refused = Classified("refused", ErrorKind.TERMINAL, "the model refused")
    finish_all(database, "summarize", docs[2:], "failed", refused)
    database.close()
    assert plan_batches(conn, summarising, dag_id="d", run_id="r1", spec_hashes=HASHES) == []
    # A new embedding model: every document has embed work, the refused summary's too.
    other = spec_hashes(chunk_config_of(SETTINGS), "other-model", None)
    batches = plan_batches(conn, summarising, dag_id="d", run_id="r1", spec_hashes=other)
    assert sum(b["size"] for b in batches) == 3


def test_batches_grow_to_stay_within_max_map_length(conn, tmp_path):
    for sample in sorted(SAMPLES.glob("*.pdf"))[:10]:
        shutil.copy(sample, tmp_path / sample.name)
    run_discover(conn, tmp_path)
    one_each = PipelineSettings(batch_size=1)
    batches = plan_batches(
        conn, one_each, dag_id="d", run_id="r1", spec_hashes=HASHES, max_map_length=3
    )
    assert len(batches) == 3 and sum(b["size"] for b in batches) == 10


def _run_of(conn, run_id, documents):
    """A run of ``documents`` new documents, as discover records them (ids from SQL)."""
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO replayable.documents (doc_id, uri, size_bytes)"
            " SELECT %s || i, '/docs/' || i, 1 FROM generate_series(1, %s) AS i",
            (run_id, documents),
        )
        cur.execute("INSERT INTO replayable.runs (dag_id, run_id) VALUES ('d', %s)", (run_id,))
        cur.execute(
            "INSERT INTO replayable.run_docs (dag_id, run_id, doc_id)"
            " SELECT 'd', %s, %s || i FROM generate_series(1, %s) AS i",
            (run_id, run_id, documents),
        )
    conn.commit()


@pytest.mark.parametrize(
    ("documents", "slots", "max_map_length", "sizes"),
    [
        # A small run is one batch: never fewer than AUTO_MIN_BATCH documents in one.
        (10, 2, 1024, [10]),
        (60, 2, 1024, [25, 25, 10]),
        # 1,000 documents on two slots: two batches each, four task instances per stage.
        (1000, 2, 1024, [250] * 4),
        (1000, 16, 1024, [32] * 31 + [8]),
        # Never more batches than max_map_length.
        (1000, 16, 10, [100] * 10),
        # Never more documents in one batch than the largest batch_size (10,000).
        (25_000, 1, 1024, [10_000, 10_000, 5000]),
    ],
)
def test_auto_batches_are_a_few_per_slot_within_bounds_and_max_map_length(
    conn, documents, slots, max_map_length, sizes
):
    _run_of(conn, "auto", documents)
    auto = PipelineSettings()
    assert auto.batch_size == "auto"
    batches = plan_batches(
        conn,
        auto,
        dag_id="d",
        run_id="auto",
        spec_hashes=HASHES,
        max_map_length=max_map_length,
        slots=slots,
    )
    assert [b["size"] for b in batches] == sizes


def test_a_number_is_a_batch_size_and_any_other_word_is_refused():
    assert PipelineSettings(batch_size=7).batch_size == 7
    with pytest.raises(ValueError, match="batch_size: must be 'auto' or a number"):
        PipelineSettings(batch_size="big")


def test_xcoms_stay_the_same_size_for_ten_thousand_documents(conn, tmp_path):
    """Discover and plan hand on references: their return values do not grow with documents."""
    sizes = {}
    for n in (10, 10_000):
        folder = tmp_path / str(n)
        folder.mkdir()
        for i in range(n):
            (folder / f"{i:05}.pdf").write_bytes(b"%PDF-1.4 " + str(i).encode())
        found = run_discover(conn, folder, run_id=f"r{n}")
        settings = PipelineSettings(batch_size=10_000)
        batches = plan_batches(conn, settings, dag_id="d", run_id=f"r{n}", spec_hashes=HASHES)
        report = pipeline.build_report(conn, dag_id="d", run_id=f"r{n}")
        sizes[n] = [len(json.dumps(v)) for v in ({"documents": found}, batches, report)]
        assert found == n and report["documents"] == n
    for small, large in zip(sizes[10], sizes[10_000], strict=True):
        assert large <= small + 40  # a few longer numbers, nothing per document


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 10_001}, "batch_size"),
        ({"item_timeout_s": 1_000_000}, "item_timeout_s"),
        ({"max_bytes": 2**31}, "max_bytes"),
        ({"memory_mb": 100_000}, "memory_mb"),
        ({"lease_s": 100_000}, "lease_s"),
        ({"stages": ("extract", "OCR pages")}, "stages"),
        ({"item_timeout_s": 900, "lease_s": 600}, "item_timeout_s"),
        ({"chunk_size": 100, "chunk_overlap": 80}, "overlap"),
        ({"rerun": {"stage": "Embed;"}}, "rerun.stage"),
        ({"rerun": {"stage": "chunk"}, "redrive": {"stage": "chunk"}}, "rerun and redrive"),
    ],
)
def test_bad_settings_are_rejected_naming_the_field(values, field):
    with pytest.raises(ValueError, match=field):
        PipelineSettings(**values)


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"stages": ("extract", "ocr")}, "stages"),
        ({"rerun": {"stage": "ocr"}}, "rerun.stage"),
        ({"redrive": {"stage": "ocr", "reason": "fixed"}}, "redrive.stage"),
    ],
)
def test_a_stage_the_pipeline_does_not_have_is_refused_naming_the_field(values, field):
    with pytest.raises(ValueError, match=field):
        document_pipeline().check(PipelineSettings(**values))


@pytest.mark.parametrize(
    "values",
    [
        {"rerun": {"stage": "chunk"}, "stages": ("extract",)},
        {"redrive": {"stage": "embed", "reason": "x"}, "stages": ("summarize",)},
    ],
)
def test_stages_that_leave_a_rerun_nothing_to_run_are_refused_naming_both_fields(values):
    """A re-run runs those of ``stages`` that are its stage or read it: none here. Such a run
    would plan nothing and succeed, so its conf is refused instead."""
    (what,) = {"rerun", "redrive"} & set(values)
    with pytest.raises(ValueError, match=rf"^stages: .*{what}\.stage"):
        document_pipeline().check(PipelineSettings(**values))


def runs(**settings) -> tuple[str, ...]:
    """The stages a run of the document pipeline with ``settings`` executes."""
    return document_pipeline().effective_stages(PipelineSettings(**settings))


def test_a_rerun_covers_its_stage_and_the_ones_after_it():
    assert runs(rerun={"stage": "chunk"}) == ("chunk", "embed")
    assert runs(rerun={"stage": "extract"}, stages=("extract", "chunk")) == ("extract", "chunk")
    assert runs() == ("extract", "chunk", "embed")


def test_a_rerun_reaches_only_the_stages_that_read_its_stage():
    """summarize reads extract, not chunk: a re-run of chunk never summarises, a re-run of
    summarize redoes summaries alone, and a plain run summarises only when asked to."""
    everything = ("extract", "chunk", "embed", "summarize")
    assert runs(rerun={"stage": "chunk"}, stages=everything) == ("chunk", "embed")
    assert runs(rerun={"stage": "extract"}, stages=everything) == everything
    assert runs(rerun={"stage": "summarize"}) == ("summarize",)
    assert runs(redrive={"stage": "summarize", "reason": "model fixed"}) == ("summarize",)
    assert runs(stages=everything) == everything
    assert "summarize" not in runs(rerun={"stage": "extract"})


def test_only_a_rerun_that_asks_for_dead_items_revives_them():
    assert PipelineSettings(rerun={"stage": "embed"}).revives_dead
    assert PipelineSettings(rerun={"stage": "embed", "status": ["dead"]}).revives_dead
    assert not PipelineSettings(rerun={"stage": "embed", "status": ["failed"]}).revives_dead
    assert not PipelineSettings(redrive={"stage": "embed", "reason": "x"}).revives_dead


def test_the_report_reads_as_a_table():
    report = {
        "run_id": "r1",
        "documents": 3,
        "to_do": 2,
        "batches": 1,
        "stages": {
            "embed": {"done": 2, "dead": 1, "errors": {"http_400": 1}, "not_entered": 0},
            "extract": {"done": 3, "errors": {}, "not_entered": 0},
        },
        "model_calls": {"calls": 4, "ok": 3, "inputs": 9, "tokens": 90},
        "dead_letters_opened": 1,
    }
    lines = format_report(report).splitlines()
    assert lines[0] == "run r1: 3 documents, 2 with work in 1 batches"
    assert lines[2].split()[0] == "extract"  # pipeline order, not alphabetical
    assert "http_400=1" in lines[3]
    assert "4 (3 ok, 9 inputs embedded, 90 tokens)" in lines[-1]


def test_redriving_a_letter_of_an_older_version_leaves_no_stale_row(conn, dsn, tmp_path):
    """The redriven letter's item was keyed by an older extractor: nothing is reset to pending."""
    shutil.copy(sorted(SAMPLES.glob("*.pdf"))[0], tmp_path / "a.pdf")
    run_discover(conn, tmp_path)
    (doc_id,) = run_docs(conn)
    database = db.Database(dsn)
    old = Ledger(database, "extract", "0.9", "c", "old-spec", RunContext(owner="w"))
    old.claim([("old-key", doc_id)])
    terminal = Classified("malformed", ErrorKind.TERMINAL, "parser bug")
    database.transaction(lambda c: old.finish(c, [Outcome("old-key", "failed", terminal)]))
    for stage in STAGES:  # the fixed extractor did it under a new key, and the rest followed
        finish_all(database, stage, [doc_id])
    database.close()
    # The run that took the new key closed the letter (ADR 0132); a ledger written before
    # that may still hold it open, which is what the redrive below must cope with.
    assert rows(conn, "SELECT status, resolved_by FROM replayable.dead_letters") == [
        ("redriven", "rerun")
    ]
    rows(conn, "UPDATE replayable.dead_letters SET status = 'open' RETURNING id")
    redrive = PipelineSettings(redrive={"stage": "extract", "reason": "parser fixed"})
    assert pipeline.select_documents(conn, redrive, dag_id="d", run_id="rd") == 1
    assert rows(conn, "SELECT count(*) FROM replayable.stage_runs WHERE status = 'pending'") == [
        (0,)
    ]
    assert (
        plan_batches(conn, redrive, dag_id="d", run_id="rd", spec_hashes=HASHES, revived_by="ana")
        == []
    )
    report = pipeline.build_report(conn, dag_id="d", run_id="rd")
    assert report["stages"]["extract"]["done"] == 1
    assert rows(conn, "SELECT status, resolved_by FROM replayable.dead_letters") == [
        ("redriven", "ana")
    ]


def test_a_file_that_cannot_be_read_is_a_document_of_the_run_named_from_its_stat(conn, tmp_path):
    """An unreadable file is not skipped: it is recorded, so extract can dead-letter it."""
    from file_access import permission_bits_bind

    sample = sorted(SAMPLES.glob("*.pdf"))[0]
    shutil.copy(sample, tmp_path / "open.pdf")
    shutil.copy(sample, tmp_path / "locked.pdf")
    shutil.copy(sorted(SAMPLES.glob("*.pdf"))[1], tmp_path / "other.pdf")
    (tmp_path / "locked.pdf").chmod(0)
    with permission_bits_bind():
        assert run_discover(conn, tmp_path) == 3
    assert len(run_docs(conn)) == 3
    ((uri, stat_named),) = rows(
        conn,
        "SELECT uri, stat_id FROM replayable.documents WHERE doc_id <> ALL(%s)",
        [keys.sha256_file(sample), keys.sha256_file(tmp_path / "other.pdf")],
    )
    assert (uri, stat_named) == (str(tmp_path / "locked.pdf"), True)
    # Not cached: the next discover tries the file again, and reads it once it can.
    assert rows(conn, "SELECT count(*) FROM replayable.file_cache WHERE path = %s", uri) == [(0,)]


def swap_for_fifo_after_listing(monkeypatch, path):
    """Replace ``path`` by a FIFO once discover has listed and stat'ed the source."""
    real = discovery._stat_rows

    def listed_then_swapped(found):
        scanned = real(found)
        path.unlink()
        os.mkfifo(path)
        return scanned

    monkeypatch.setattr(discovery, "_stat_rows", listed_then_swapped)


def test_a_file_swapped_for_a_fifo_before_it_is_hashed_does_not_block_discover(
    conn, tmp_path, monkeypatch
):
    """The FIFO is opened without blocking and refused by fstat: an unreadable document."""
    from file_access import finishes

    sample = sorted(SAMPLES.glob("*.pdf"))[0]
    shutil.copy(sample, tmp_path / "kept.pdf")
    shutil.copy(sorted(SAMPLES.glob("*.pdf"))[1], tmp_path / "x.pdf")
    swap_for_fifo_after_listing(monkeypatch, tmp_path / "x.pdf")
    assert finishes(lambda: run_discover(conn, tmp_path), fifo=tmp_path / "x.pdf") == 2
    assert rows(conn, "SELECT uri FROM replayable.documents WHERE stat_id") == [
        (str(tmp_path / "x.pdf"),)
    ]


def test_an_unreadable_document_is_dead_lettered_by_extract_and_counted_in_the_report(
    conn, dsn, tmp_path, monkeypatch
):
    """A FIFO in place of a listed PDF ends dead in extract as unreadable, and the run says so."""
    from file_access import finishes
    from replayable import guards
    from replayable.runner import Limits, run_batch
    from replayable.stages.extract.spec import ExtractSpec

    shutil.copy(sorted(SAMPLES.glob("*.pdf"))[0], tmp_path / "x.pdf")
    swap_for_fifo_after_listing(monkeypatch, tmp_path / "x.pdf")
    finishes(lambda: run_discover(conn, tmp_path), fifo=tmp_path / "x.pdf")
    (doc_id,) = run_docs(conn)
    with guards.GuardedPool(timeout_s=30, memory_mb=512, workers=1) as pool:
        spec = ExtractSpec(pool=pool, max_bytes=2**20, roots=[str(tmp_path)])
        result = finishes(
            lambda: run_batch(
                spec,
                [doc_id],
                connect=lambda: db.Database(dsn),
                ctx=RunContext(owner="w", dag_id="d", run_id="r1"),
                limits=Limits(),
            ),
            fifo=tmp_path / "x.pdf",
        )
    assert result.dead == [doc_id]
    assert rows(conn, "SELECT error_class FROM replayable.dead_letters") == [("unreadable",)]
    report = pipeline.build_report(conn, dag_id="d", run_id="r1")
    assert report["documents"] == 1
    assert report["stages"]["extract"]["dead"] == 1
    assert report["stages"]["extract"]["errors"] == {"unreadable": 1}


def test_a_rerun_leaves_a_still_unreadable_document_for_extract_to_report(conn, tmp_path):
    """Re-identifying stat-named documents skips a file it cannot read instead of failing plan."""
    from file_access import permission_bits_bind

    shutil.copy(sorted(SAMPLES.glob("*.pdf"))[0], tmp_path / "locked.pdf")
    (tmp_path / "locked.pdf").chmod(0)
    with permission_bits_bind():
        run_discover(conn, tmp_path)
        before = run_docs(conn)
        discovery._reidentify(conn, dag_id="d", run_id="r1", max_bytes=2**30)
    assert run_docs(conn) == before


def test_discover_drops_runs_past_the_retention_with_their_documents_and_keeps_reports(
    conn, tmp_path
):
    """Runs older than RUN_RETENTION_DAYS lose their run and run_docs rows, not their report."""
    shutil.copy(sorted(SAMPLES.glob("*.pdf"))[0], tmp_path / "a.pdf")
    for run_id in ("old", "recent"):
        run_discover(conn, tmp_path, run_id=run_id)
        db.execute(conn, "report/save_report", {"dag_id": "d", "run_id": run_id, "report": "{}"})
    days = discovery.RUN_RETENTION_DAYS
    rows(
        conn,
        "UPDATE replayable.runs SET created_at = now() - make_interval(days => %s)"
        " WHERE run_id = 'old' RETURNING 1",
        days + 1,
    )
    rows(
        conn,
        "UPDATE replayable.runs SET created_at = now() - make_interval(days => %s)"
        " WHERE run_id = 'recent' RETURNING 1",
        days - 1,
    )
    run_discover(conn, tmp_path, run_id="new")
    assert rows(conn, "SELECT run_id FROM replayable.runs ORDER BY 1") == [("new",), ("recent",)]
    assert run_docs(conn, "old") == []
    assert run_docs(conn, "recent") == run_docs(conn, "new") != []
    assert rows(conn, "SELECT run_id FROM replayable.run_reports ORDER BY 1") == [
        ("old",),
        ("recent",),
    ]
