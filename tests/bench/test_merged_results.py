"""``bench/run.py --merge``: an --only run adds its figures to the full results, keeping the
others as they were and saying which run they came from."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import run as bench_run  # the bench folder is put on the path just above
from harness import Row, Samples, Target


def test_every_committed_figure_reads_back_with_its_verdict():
    earlier = json.loads((ROOT / "bench" / "results" / "latest.json").read_text())
    for figure in earlier["figures"]:
        row = Row.from_json(figure)
        assert (row.fig, row.value, row.passed) == (figure["id"], figure["value"], figure["pass"])


@pytest.mark.parametrize(
    ("text", "field", "bound"),
    [
        ("≤ 1.10", "at_most", 1.10),
        ("≥ 10", "at_least", 10.0),
        ("< 50 ms", "below", 0.050),
        ("= 0 calls", "equals", 0.0),
        ("≤ 1.5 + 0.87 (one document)", "at_most", 2.37),
    ],
)
def test_a_target_reads_back_from_its_text(text, field, bound):
    assert getattr(Target.parse(text), field) == pytest.approx(bound)


def test_a_merged_run_replaces_its_own_figures_and_keeps_the_others(tmp_path, monkeypatch):
    shutil.copy(ROOT / "bench" / "results" / "latest.json", tmp_path / "latest.json")
    earlier = json.loads((tmp_path / "latest.json").read_text())
    redone = earlier["figures"][0]["id"]
    new = [
        Row(redone, "again", "base", Samples((1.0,)), "now", Samples((0.5,)), Target("≤ 1", 1)),
        Row("B99", "new", "base", Samples((1.0,)), "now", Samples((2.0,))),
    ]
    monkeypatch.setitem(bench_run.BENCHMARKS, "fake", (lambda: (new, {"n": 1}), {}, {}))
    monkeypatch.setattr(bench_run, "_chart", lambda rows, path: path.write_bytes(b""))
    assert bench_run.main(["--only", "fake", "--merge", "--results", str(tmp_path)]) == 0
    merged = json.loads((tmp_path / "latest.json").read_text())
    ids = [figure["id"] for figure in merged["figures"]]
    assert ids.count(redone) == 1 and "B99" in ids
    assert len(ids) == len(earlier["figures"]) + 1
    assert next(f for f in merged["figures"] if f["id"] == redone)["benchmark"] == "again"
    assert merged["kept_from"]["finished_at"] == earlier["finished_at"]
    assert redone not in merged["kept_from"]["figures"]
    assert merged["details"]["fake"]["n"] == 1
    assert set(earlier["details"]) <= set(merged["details"])


def test_a_figure_kept_through_two_merges_is_dated_by_the_run_that_measured_it():
    kept = {
        "finished_at": "run-3",
        "figures": ["B1", "B2", "B3"],
        "kept_from": {
            "finished_at": "run-2",
            "figures": ["B1", "B2"],
            "kept_from": {"finished_at": "run-1", "figures": ["B1"]},
        },
    }
    assert bench_run.measured_in(kept) == {"run-1": ["B1"], "run-2": ["B2"], "run-3": ["B3"]}
