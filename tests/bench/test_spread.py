"""``bench/run.py --repeat``: each figure over separate runs, its median deciding, its range
shown."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

from helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import run as bench_run  # the bench folder is put on the path just above
from harness import Row, Samples, Target, across_runs

AT_LEAST = Target("≥ 0.8", at_least=0.8)


def _row(ratio: float, target: Target | None = AT_LEAST) -> Row:
    """A figure whose ratio is ``ratio`` (measured ``ratio`` against a baseline of 1)."""
    return Row("B5", "saturation", "ideal", Samples((1.0,)), "pipeline", Samples((ratio,)), target)


def test_a_figure_passes_when_the_median_of_its_runs_does():
    row = across_runs([[_row(0.7)], [_row(0.85)], [_row(0.9)]])[0]
    assert row.value == 0.85 and row.passed is True
    assert across_runs([[_row(0.9)], [_row(0.75)], [_row(0.7)]])[0].passed is False


def test_a_figure_across_runs_records_its_median_range_and_count():
    row = across_runs([[_row(0.9)], [_row(0.7)], [_row(0.85)]])[0]
    figure = row.to_json()
    assert (figure["median"], figure["min"], figure["max"], figure["runs"]) == (0.85, 0.7, 0.9, 3)
    assert figure["value"] == figure["median"] and figure["pass"] is True
    assert figure["run_values"] == [0.9, 0.7, 0.85]


def test_a_figure_across_runs_reads_back_from_its_file():
    row = across_runs([[_row(0.9)], [_row(0.7)], [_row(0.85)]])[0]
    again = Row.from_json(json.loads(json.dumps(row.to_json())))
    assert (again.values, again.value, again.passed) == (row.values, 0.85, True)


def test_a_figure_from_a_file_without_runs_is_one_run():
    figure = _row(0.9).to_json()
    for key in ("median", "min", "max", "runs", "run_values"):
        del figure[key]
    row = Row.from_json(figure)
    assert row.values == (0.9,) and row.to_json()["runs"] == 1


def test_every_figure_of_a_run_is_kept_and_samples_pool_across_runs():
    first = [_row(0.9), Row("B5.x", "context", "a", Samples((2.0,)), "b", Samples((1.0,)))]
    rows = across_runs([first, [_row(0.7)]])
    assert [row.fig for row in rows] == ["B5", "B5.x"]
    assert rows[0].measured.values == (0.9, 0.7) and rows[1].values == (0.5,)


def _fake(values: list[float]) -> Iterator[tuple[list[Row], dict[str, int]]]:
    for value in values:
        yield [_row(value)], {"n": 1}


def test_a_repeated_run_writes_median_range_and_runs_and_exits_by_the_median(tmp_path, monkeypatch):
    runs = _fake([0.9, 0.7, 0.85])
    monkeypatch.setitem(bench_run.BENCHMARKS, "fake", (lambda: next(runs), {}, {}))
    monkeypatch.setattr(bench_run, "_chart", lambda rows, path: path.write_bytes(b""))
    assert bench_run.main(["--only", "fake", "--repeat", "3", "--results", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "latest.json").read_text())
    figure = result["figures"][0]
    assert (figure["median"], figure["min"], figure["max"], figure["runs"]) == (0.85, 0.7, 0.9, 3)
    assert result["passed"] is True and result["details"]["fake"]["runs"] == 3
    table = (tmp_path / "latest.md").read_text()
    assert "| median | min to max | runs |" in table
    assert "| 0.85 | 0.70 to 0.90 | 3 | ≥ 0.8 | pass |" in table


def test_a_repeated_run_whose_median_misses_fails(tmp_path, monkeypatch):
    runs = _fake([0.9, 0.75, 0.7])
    monkeypatch.setitem(bench_run.BENCHMARKS, "fake", (lambda: next(runs), {}, {}))
    monkeypatch.setattr(bench_run, "_chart", lambda rows, path: path.write_bytes(b""))
    assert bench_run.main(["--only", "fake", "--repeat", "3", "--results", str(tmp_path)]) == 1
    assert "| 0.75 | 0.70 to 0.90 | 3 | ≥ 0.8 | FAIL |" in (tmp_path / "latest.md").read_text()


def test_the_chart_draws_each_figures_range(tmp_path):
    rows = across_runs([[_row(0.9)], [_row(0.7)], [_row(0.85)]])
    bench_run._chart(rows, tmp_path / "latest.png")
    assert (tmp_path / "latest.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_smoke_run_runs_each_benchmark_once(tmp_path, monkeypatch):
    calls: list[int] = []
    monkeypatch.setitem(
        bench_run.BENCHMARKS, "fake", (lambda: (calls.append(1), ([_row(0.9)], {}))[1], {}, {})
    )
    monkeypatch.setattr(bench_run, "ROOT", tmp_path)
    monkeypatch.setattr(bench_run, "SMOKE_RESULTS", tmp_path / "bench-smoke.json")
    assert bench_run.main(["--only", "fake", "--smoke"]) == 0
    assert calls == [1]
    assert json.loads((tmp_path / "bench-smoke.json").read_text())["figures"][0]["runs"] == 1
