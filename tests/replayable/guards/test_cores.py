"""Tests for replayable.guards.cores: one extraction as wide as the machine at a time (ADR 0123)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from replayable.guards import cores
from replayable.guards.cores import machine_cores
from replayable.settings import PipelineSettings
from replayable.stage import BuildContext
from replayable.stages import builtin

HOLD_S = 0.3


@pytest.fixture
def lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own temporary folder, where the lock file is found (``lock_path``)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # for a process the test starts
    return cores.lock_path()


def hold(width: int, spans: list[tuple[float, float]], barrier: threading.Barrier | None = None):
    with machine_cores(width):
        start = time.monotonic()
        if barrier is not None:
            barrier.wait()  # passes only while every holder is inside at once
        time.sleep(HOLD_S)
        spans.append((start, time.monotonic()))


def run_threads(*targets) -> None:
    threads = [threading.Thread(target=t) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)


def test_two_batches_as_wide_as_the_machine_never_hold_its_cores_at_once(lock, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    spans: list[tuple[float, float]] = []
    run_threads(lambda: hold(2, spans), lambda: hold(4, spans))
    (_, first_end), (second_start, _) = sorted(spans)
    assert first_end <= second_start, "the second held the cores before the first let go"


def test_narrower_batches_share_the_cores_with_each_other(lock, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    spans: list[tuple[float, float]] = []
    both_inside = threading.Barrier(2, timeout=5)
    run_threads(lambda: hold(1, spans, both_inside), lambda: hold(3, spans, both_inside))
    assert len(spans) == 2 and not both_inside.broken


def test_a_narrow_batch_waits_for_a_wide_one(lock, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    spans: list[tuple[float, float]] = []
    wide_inside = threading.Event()

    def wide() -> None:
        with machine_cores(4):
            wide_inside.set()
            start = time.monotonic()
            time.sleep(HOLD_S)
            spans.append((start, time.monotonic()))

    def narrow() -> None:
        wide_inside.wait(5)
        hold(1, spans)

    run_threads(wide, narrow)
    (_, wide_end), (narrow_start, _) = sorted(spans)
    assert wide_end <= narrow_start


def test_a_killed_holder_leaves_the_cores_free(lock):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from replayable.guards.cores import machine_cores\n"
            "with machine_cores(1 << 20):\n"
            "    print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert lock.exists()  # the holder's lock file is this test's
        waited = threading.Event()

        def take() -> None:
            with machine_cores(1 << 20):
                waited.set()

        threading.Thread(target=take, daemon=True).start()
        assert not waited.wait(HOLD_S), "the cores were taken while the holder lived"
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(10)
        assert waited.wait(5), "the cores stayed taken after their holder was killed"
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait(10)


def test_a_batch_waits_for_a_holder_that_never_lets_go_only_so_long(lock, monkeypatch):
    """A frozen holder keeps its lock: the waiter goes on beside it after max_wait_s."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    with machine_cores(2) as first:
        started = time.monotonic()
        with machine_cores(2, max_wait_s=HOLD_S) as second:
            waited = time.monotonic() - started
    assert (first, second) == (True, False)
    assert waited >= HOLD_S


def extract_build_done_while_cores_held(monkeypatch: pytest.MonkeyPatch, within_s: float) -> bool:
    """Build the extract stage for a batch as wide as the machine while another holds the
    machine's cores for up to ``within_s``; whether the build came back before they were let
    go."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    built = threading.Event()

    def build() -> None:
        with ExitStack() as stack:
            builtin.EXTRACT.build(
                BuildContext(
                    settings=PipelineSettings(),
                    run_id="run",
                    documents=10,
                    connect=lambda: None,
                    stack=stack,
                    spec_hashes={},
                    model_conn_id="unused",
                )
            )
            built.set()

    with machine_cores(2):
        thread = threading.Thread(target=build, daemon=True)
        thread.start()
        done_early = built.wait(within_s)
    thread.join(10)
    assert built.is_set(), "the build never came back"
    return done_early


def test_an_extract_batch_is_not_built_while_another_holds_the_cores(lock, monkeypatch):
    """The operator builds a stage before it claims (``IdempotentStageOperator.execute``),
    so a batch waiting here holds no lease."""
    assert not extract_build_done_while_cores_held(monkeypatch, within_s=1.0)


def test_queue_for_cores_false_lets_extract_batches_run_side_by_side(lock, monkeypatch):
    monkeypatch.setenv("AIRFLOW__REPLAYABLE__QUEUE_FOR_CORES", "false")
    # Long enough for a build on a busy machine (its first imports); it needs no lock.
    assert extract_build_done_while_cores_held(monkeypatch, within_s=30.0)
