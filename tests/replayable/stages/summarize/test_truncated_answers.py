"""An answer cut off (``finish_reason`` ``length``) or filtered is no summary (ADR 0134).

It fails with a class of its own, shows in the report and the metrics, and is stored only
when the run asks to keep truncated answers, under a key of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from checks import rows, subset
from replayable.models.chat import parse_answer
from replayable.retry import ErrorKind, ItemError
from replayable.settings import PipelineSettings
from replayable.stages.summarize.config import SummaryConfig

STAGES = ["extract", "summarize"]


def answer(content, finish_reason):
    message = {"role": "assistant", "content": content}
    return {
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
    }


@pytest.mark.parametrize("reason", ["length", "max_tokens"])
def test_an_answer_cut_at_max_tokens_is_a_terminal_truncated_error(reason):
    with pytest.raises(ItemError) as caught:
        parse_answer(answer("Invoices are due", reason))
    assert (caught.value.error_class, caught.value.kind) == ("truncated", ErrorKind.TERMINAL)
    assert "max_tokens" in str(caught.value)


def test_a_run_that_keeps_truncated_answers_gets_the_answer_marked_as_cut():
    result = parse_answer(answer("Invoices are due", "length"), keep_truncated=True)
    assert (result.text, result.finish_reason, result.truncated) == (
        "Invoices are due",
        "length",
        True,
    )


def test_a_filtered_answer_is_never_a_summary_even_with_partial_content():
    for keep in (False, True):
        with pytest.raises(ItemError) as caught:
            parse_answer(answer("Invoices are", "content_filter"), keep_truncated=keep)
        assert (caught.value.error_class, caught.value.kind) == (
            "content_filtered",
            ErrorKind.TERMINAL,
        )


def test_the_answer_is_checked_without_assert_so_python_o_checks_it_too():
    code = (
        "from replayable.retry import ItemError\n"
        "from replayable.models.chat import parse_answer\n"
        "for payload in ({'choices': [{'message': 'text'}]}, [],"
        " {'choices': [{'message': {'content': 5}}]}):\n"
        "    try:\n"
        "        parse_answer(payload)\n"
        "    except ItemError as e:\n"
        "        assert e.error_class == 'bad_response', e.error_class\n"
        "    else:\n"
        "        raise SystemExit('accepted ' + repr(payload))\n"
        "print('checked')\n"
    )
    include = str(Path(__file__).resolve().parents[4] / "include")
    env = {**os.environ, "PYTHONPATH": include}
    done = subprocess.run(
        [sys.executable, "-O", "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert done.stdout.strip() == "checked", done.stderr[-2000:]


def test_keeping_truncated_answers_is_a_bounded_param_and_part_of_the_key():
    assert PipelineSettings().summary_keep_truncated is False
    with pytest.raises(ValueError, match="summary_keep_truncated"):
        PipelineSettings(summary_keep_truncated="yes")  # type: ignore[arg-type]
    default = SummaryConfig(model="m")
    assert "keep_truncated" not in default.key()  # the summaries made so far keep their keys
    assert SummaryConfig(model="m", keep_truncated=True).key()["keep_truncated"] is True


def test_with_a_tiny_max_tokens_every_summary_is_dead_as_truncated_and_the_report_says_so(
    run_in_process, conn, model, tmp_path
):
    folder = subset(tmp_path, 2)
    report = run_in_process({"source": str(folder), "stages": STAGES, "summary_max_tokens": 3})
    entry = report["stages"]["summarize"]
    assert (entry["done"], entry["dead"]) == (0, 2), report["_tasks"]
    assert entry["errors"] == {"truncated": 2}
    assert report["model_calls"]["truncated"] == 2
    assert rows(conn, "SELECT count(*) FROM replayable.artifacts") == [(0,)]
    # The metrics count the calls by outcome: the truncated ones under their own.
    assert rows(
        conn,
        "SELECT status, count(*) FROM replayable.model_calls WHERE stage = 'summarize' GROUP BY 1",
    ) == [("truncated", 2)]


def test_a_run_that_keeps_truncated_answers_stores_them_marked_and_reports_them(
    run_in_process, conn, model, tmp_path
):
    folder = subset(tmp_path, 2)
    conf = {"source": str(folder), "stages": STAGES, "summary_max_tokens": 3}
    report = run_in_process({**conf, "summary_keep_truncated": True})
    entry = report["stages"]["summarize"]
    assert (entry["done"], entry["dead"]) == (2, 0), report["_tasks"]
    assert report["model_calls"]["truncated"] == 2
    assert rows(
        conn,
        "SELECT DISTINCT a.data->>'finish_reason', (a.data->>'truncated')::boolean"
        " FROM replayable.artifacts a WHERE a.stage = 'summarize'",
    ) == [("length", True)]
    # A run that does not keep them does not take those answers as full summaries.
    again = run_in_process(conf)
    assert again["stages"]["summarize"]["dead"] == 2
