import shutil
from pathlib import Path

import pytest

from replayable.pipeline import discover, find_pdfs, format_report, plan_batches
from replayable.settings import PipelineSettings

SAMPLES = Path(__file__).resolve().parents[2] / "data" / "samples"
IDS = [f"{i:064x}" for i in range(10)]


def test_batches_cover_every_document_once_in_order():
    batches = plan_batches(IDS, 4)
    assert [b["doc_ids"] for b in batches] == [IDS[0:4], IDS[4:8], IDS[8:10]]
    assert [b["label"] for b in batches] == [
        "batch 0: docs 0-3",
        "batch 1: docs 4-7",
        "batch 2: docs 8-9",
    ]


def test_batches_grow_to_stay_within_max_map_length():
    batches = plan_batches(IDS, 1, max_map_length=3)
    assert len(batches) == 3
    assert sum(len(b["doc_ids"]) for b in batches) == len(IDS)


def test_no_documents_plan_no_batches():
    assert plan_batches([], 10) == []


def test_find_pdfs_takes_a_folder_a_glob_or_a_file(tmp_path):
    (tmp_path / "sub").mkdir()
    for name in ("a.pdf", "sub/b.PDF", "notes.txt"):
        (tmp_path / name).write_bytes(b"%PDF-1.4")
    assert [p.name for p in find_pdfs(str(tmp_path))] == ["a.pdf", "b.PDF"]
    assert [p.name for p in find_pdfs(str(tmp_path / "*.pdf"))] == ["a.pdf"]
    assert [p.name for p in find_pdfs(str(tmp_path / "a.pdf"))] == ["a.pdf"]
    with pytest.raises(FileNotFoundError, match="source"):
        find_pdfs(str(tmp_path / "missing"))


def test_discover_records_the_same_bytes_once(conn, tmp_path):
    sample = sorted(SAMPLES.glob("*.pdf"))[0]
    shutil.copy(sample, tmp_path / "one.pdf")
    shutil.copy(sample, tmp_path / "copy.pdf")
    first = discover(conn, str(tmp_path))
    assert len(first) == 1
    assert discover(conn, str(tmp_path)) == first


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"stages": ("extract", "ocr")}, "stages"),
        ({"item_timeout_s": 900, "lease_s": 600}, "item_timeout_s"),
        ({"chunk_size": 100, "chunk_overlap": 80}, "overlap"),
        ({"rerun": {"stage": "ocr"}}, "rerun.stage"),
        ({"rerun": {"stage": "chunk"}, "redrive": {"stage": "chunk"}}, "rerun and redrive"),
    ],
)
def test_bad_settings_are_rejected_naming_the_field(values, field):
    with pytest.raises(ValueError, match=field):
        PipelineSettings(**values)


def test_a_rerun_covers_its_stage_and_the_ones_after_it():
    assert PipelineSettings(rerun={"stage": "chunk"}).effective_stages == ("chunk", "embed")
    narrowed = PipelineSettings(rerun={"stage": "extract"}, stages=("extract", "chunk"))
    assert narrowed.effective_stages == ("extract", "chunk")
    assert PipelineSettings().effective_stages == ("extract", "chunk", "embed")


def test_only_a_rerun_that_asks_for_dead_items_revives_them():
    assert PipelineSettings(rerun={"stage": "embed"}).revives_dead
    assert PipelineSettings(rerun={"stage": "embed", "status": ["dead"]}).revives_dead
    assert not PipelineSettings(rerun={"stage": "embed", "status": ["failed"]}).revives_dead
    assert not PipelineSettings(redrive={"stage": "embed", "reason": "x"}).revives_dead


def test_the_report_reads_as_a_table():
    report = {
        "run_id": "r1",
        "documents": 3,
        "stages": {
            "embed": {"done": 2, "dead": 1, "errors": {"http_400": 1}, "not_entered": 0},
            "extract": {"done": 3, "errors": {}, "not_entered": 0},
        },
        "model_calls": {"calls": 4, "ok": 3, "inputs": 9, "tokens": 90},
        "dead_letters_opened": 1,
    }
    lines = format_report(report).splitlines()
    assert lines[0] == "run r1: 3 documents"
    assert lines[2].split()[0] == "extract"  # pipeline order, not alphabetical
    assert "http_400=1" in lines[3]
    assert "4 (3 ok, 9 inputs embedded, 90 tokens)" in lines[-1]
