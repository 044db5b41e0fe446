"""Property tests of document_pipeline's conf: any JSON is refused naming a field, or runs.

The conf goes the way a triggered run's does: merged into the *serialized* DAG's params and
validated (``SerializedDAG.create_dagrun``), its keys checked as ``plan`` checks them
(Airflow lets unknown keys through), then turned into ``PipelineSettings`` as every task
does, and the selection a re-run or redrive makes is run against the real database
(in a transaction that is rolled back). Whatever Hypothesis generates, each step either
accepts it or refuses it with a message naming a field of the conf; nothing else may happen.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from typing import Any

import pytest
from airflow.models import DagBag
from airflow.sdk.exceptions import ParamValidationError
from airflow.serialization.serialized_objects import DagSerialization
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from helpers import ROOT
from replayable import db, sources
from replayable.airflow.params import STATUSES, pipeline_params
from replayable.pipeline import rerun_params
from replayable.settings import BOUNDS, STAGES, PipelineSettings, check_conf_keys
from replayable.stages.builtin import document_pipeline
from replayable.stages.chunk.chunker import chunk_config_of

pytestmark = pytest.mark.db

EXAMPLES = int(os.environ.get("REPLAYABLE_FUZZ_EXAMPLES", "500"))
EXPLORES_EVERY_OUTCOME = 300
PARAMS = sorted(pipeline_params("/data"))
_seen = {
    "examples": 0,
    "refused_by_schema": 0,
    "refused_by_plan": 0,
    "refused_by_settings": 0,
    "ran": 0,
}


@pytest.fixture(scope="module")
def params() -> Any:
    """The DAG's params as the scheduler holds them: from the serialized DAG."""
    dag = DagBag(dag_folder=str(ROOT / "dags")).dags["document_pipeline"]
    return DagSerialization.from_dict(DagSerialization.to_dict(dag)).params


@pytest.fixture(scope="module")
def database(dsn: str) -> Iterator[Any]:
    conn = db.connect(dsn)
    yield conn
    conn.close()


# ---- strategies ---------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats()  # NaN and infinities too: Python's JSON parser reads them
    | st.text(max_size=40)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)


def near(low: float, high: float) -> st.SearchStrategy[Any]:
    """Numbers in, at and just past a documented range."""
    ints = st.integers(min_value=int(low) - 3, max_value=int(high) + 3)
    edges = st.sampled_from([low, high, low - 1, high + 1, high * 10, 0, -1, math.nan])
    return ints | edges | st.floats(min_value=low - 1, max_value=high + 1)


roots = sources.allowed_roots()
stage_names = st.sampled_from([*STAGES, "ocr", "", "EXTRACT"])
free_text = st.text(max_size=30) | st.sampled_from(["", "x\x00y", "\x1b[2J", "a" * 300])
versions = st.from_regex(r"[0-9]{1,12}(\.[0-9]{1,12}){0,3}", fullmatch=True) | st.sampled_from(
    ["1.10", "1..2", "v1", ""]
)
moments = st.datetimes().map(lambda moment: moment.isoformat()) | st.sampled_from(
    ["2024-05-01", "2024-05-01T12:00:00+02:00", "yesterday", "2024-13-45", "9999-12-31T23:59"]
)
doc_ids = st.from_regex(r"[0-9a-f]{64}", fullmatch=True) | st.sampled_from(["A" * 64, "a" * 63])
# Mostly well-formed selections, so that the values inside them reach the database.
rerun = st.fixed_dictionaries(
    {"stage": st.sampled_from(STAGES)},
    optional={
        "status": st.lists(st.sampled_from([*STATUSES, "lost"]), min_size=1, max_size=3),
        "error_class": st.lists(free_text, min_size=1, max_size=3),
        "code_version_lt": versions,
        "since": moments,
        "doc_ids": st.lists(doc_ids, max_size=3),
    },
)
redrive = st.fixed_dictionaries(
    {"stage": st.sampled_from(STAGES), "reason": free_text},
    optional={
        "error_class": st.lists(free_text, min_size=1, max_size=3),
        "ids": st.lists(st.integers(min_value=-5, max_value=2**70), min_size=1, max_size=3),
        "since": moments,
        "until": moments,
        "by": free_text,
    },
)
plausible: dict[str, st.SearchStrategy[Any]] = {
    **{name: near(low, high) for name, (low, high) in BOUNDS.items()},
    "source": st.sampled_from(
        [
            *roots,
            *(f"{root}/**/*.pdf" for root in roots),
            *(f"{root}/../etc" for root in roots),
            *(f"{root}/x\x00" for root in roots),
            "/etc",
            "/",
            "relative",
            "",
        ]
    ),
    "stages": st.lists(stage_names, max_size=4),
    "model": free_text,
    "rerun": rerun,
    "redrive": redrive,
}
one_field = st.sampled_from(sorted(plausible)).flatmap(
    lambda name: plausible[name].map(lambda value: {name: value})
)
confs = (
    # Arbitrary JSON under known and unknown names.
    st.dictionaries(st.sampled_from(PARAMS) | st.text(max_size=12), json_values, max_size=3)
    # One or two fields at and around their limits, so that many are accepted.
    | one_field
    | st.tuples(one_field, one_field).map(lambda pair: {**pair[0], **pair[1]})
)


# ---- the property -------------------------------------------------------------------------


def _names_a_field(message: str, conf: dict[str, Any]) -> bool:
    """Whether ``message`` names a key of ``conf``, as it is or quoted as by ``repr``."""
    return any(
        re.search(rf"(?<![A-Za-z_]){re.escape(key)}(?![A-Za-z_])", message) or repr(key) in message
        for key in conf
    )


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(conf=confs)
# Found by this fuzzer in CI: stages that leave a re-run nothing to run once ran nothing.
@example(conf={"rerun": {"stage": "chunk"}, "stages": ["extract"]})
def _refused_naming_a_field_or_runs(params: Any, database: Any, conf: Any) -> None:
    _seen["examples"] += 1
    try:
        resolved = params.deep_merge(conf).validate()
    except ParamValidationError as error:
        _seen["refused_by_schema"] += 1
        named = re.match(r"Invalid input for param (?P<name>\w+):", str(error))
        assert named and named["name"] in conf, str(error)[:300]
        return
    try:
        check_conf_keys(conf)
    except ValueError as error:
        _seen["refused_by_plan"] += 1
        assert _names_a_field(str(error), conf), str(error)[:300]
        return
    try:
        run = PipelineSettings.from_params(resolved)
        # What plan checks next, against the pipeline's own stages.
        document_pipeline().check(run)
    except ValueError as error:
        _seen["refused_by_settings"] += 1
        assert _names_a_field(str(error), conf), str(error)[:300]
        return
    _seen["ran"] += 1
    # What the tasks derive from the settings before touching any document.
    stages = document_pipeline().effective_stages(run)
    assert stages and set(stages) <= set(STAGES)
    assert chunk_config_of(run).key and run.batch_deadline_s(10) > 0
    assert isinstance(run.revives_dead, bool)
    # The selection discover makes for a re-run or a redrive, against the real database.
    try:
        if run.rerun:
            db.fetch_all(database, "plan/count_rerun_docs", rerun_params(run.rerun))
        if run.redrive:
            redrive = run.redrive
            db.fetch_all(
                database,
                "plan/redrive_dead_letters",
                {
                    "dag_id": "fuzz",
                    "run_id": "fuzz",
                    "selection": "{}",
                    "stage": redrive["stage"],
                    "error_classes": redrive.get("error_class"),
                    "ids": redrive.get("ids"),
                    "since": redrive.get("since"),
                    "until": redrive.get("until"),
                    "by": redrive.get("by") or "fuzz",
                    "reason": redrive["reason"],
                },
            )
    finally:
        database.rollback()


def test_any_conf_is_refused_naming_a_field_or_runs(
    params: Any, database: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every generated conf is refused naming a field or runs; and every outcome was seen.

    One test, so that the count of outcomes is of this very exploration, whichever
    worker runs it and in whatever order.
    """
    _seen.update(dict.fromkeys(_seen, 0))
    _refused_naming_a_field_or_runs(params=params, database=database)
    with capsys.disabled():
        print(
            f"\nconf fuzzing: {_seen['examples']} generated confs, "
            f"{_seen['refused_by_schema']} refused at trigger time, "
            f"{_seen['refused_by_plan']} refused by plan's key check, "
            f"{_seen['refused_by_settings']} refused by PipelineSettings or the pipeline's"
            f" stage check, {_seen['ran']} ran"
        )
    assert _seen["examples"] >= EXAMPLES
    # PipelineSettings refuses about one conf in a hundred: the inner loop's 100 examples
    # (make test-fast) can miss it, make test's 500 practically never do.
    if EXAMPLES >= EXPLORES_EVERY_OUTCOME:
        assert min(_seen.values()) > 0, _seen
