"""Every DAG loads, and document_pipeline's params reject bad conf naming the field."""

import copy

import pytest
from airflow.sdk.exceptions import ParamValidationError

from helpers import ROOT
from replayable import vocabulary
from replayable.settings import BOUNDS, TASK_TIMEOUTS, PipelineSettings

KEYWORDS = "keyword_pipeline"  # dags/keyword_pipeline.py, the example of your own stages


@pytest.fixture(scope="module")
def dagbag(monkeypatch_module):
    # Imported here: collecting this module (on every pytest-xdist worker) stays cheap.
    from airflow.models import DagBag

    return DagBag(dag_folder=str(ROOT / "dags"))


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
        # Airflow puts the DAG bundle's folder on sys.path before it parses a file, so that
        # a DAG imports its own modules (keyword_pipeline's custom_stages) as top-level ones.
        mp.syspath_prepend(str(ROOT / "dags"))
        yield mp


def test_every_dag_imports_without_errors(dagbag):
    assert dagbag.import_errors == {}
    assert "document_pipeline" in dagbag.dag_ids


def test_the_dags_carry_the_ids_the_vocabulary_defines(dagbag):
    """The UI, the CLI and the sweeper's trigger name these DAGs by the vocabulary's ids."""
    assert set(dagbag.dag_ids) == {
        vocabulary.PIPELINE_DAG_ID,
        vocabulary.SWEEPER_DAG_ID,
        vocabulary.OUTBOX_PUBLISHER_DAG_ID,
        vocabulary.DEAD_LETTER_WATCH_DAG_ID,
        KEYWORDS,
        f"{KEYWORDS}_sweeper",
    }


def test_a_pipeline_of_your_own_stages_has_the_same_shape(dagbag):
    """keyword_pipeline (a stage defined in dags/custom_stages/, outside the package): plan,
    a mapped group with a task per stage after the one it reads, report, publish; its params
    know its stages and no others."""
    dag = dagbag.dags[KEYWORDS]
    assert {t.task_id for t in dag.tasks} == {
        "plan",
        "batch.extract",
        "batch.keywords",
        "report",
        "publish",
    }
    assert dag.get_task("batch.keywords").upstream_task_ids == {"plan", "batch.extract"}
    assert dag.get_task("batch.keywords").trigger_rule == "none_failed"
    assert "label" in dag.get_task("batch.keywords").map_index_template
    params = copy.deepcopy(dag.params)
    params.update({"rerun": {"stage": "keywords", "error_class": ["no_words"]}})
    params.validate()
    with pytest.raises(ParamValidationError, match="stages"):
        params.update({"stages": ["extract", "embed"]})
        params.validate()


def test_pipeline_defaults_validate(dagbag):
    dag = dagbag.dags["document_pipeline"]
    dag.params.validate()


@pytest.mark.parametrize(
    ("conf", "field"),
    [
        ({"stages": ["extract", "summarise"]}, "stages"),
        ({"batch_size": 0}, "batch_size"),
        ({"stages": []}, "stages"),
        ({"max_attempts": "three"}, "max_attempts"),
        ({"source": "/etc"}, "source"),
        ({"item_timeout_s": 1_000_000}, "item_timeout_s"),
    ],
)
def test_bad_conf_is_rejected_naming_the_field(dagbag, conf, field):
    dag = dagbag.dags["document_pipeline"]
    params = copy.deepcopy(dag.params)
    with pytest.raises(ParamValidationError, match=field):
        params.update(conf)
        params.validate()


def test_mapped_stages_are_labelled_by_batch(dagbag):
    dag = dagbag.dags["document_pipeline"]
    for task_id in ("batch.extract", "batch.chunk", "batch.embed", "batch.summarize"):
        assert "label" in dag.get_task(task_id).map_index_template


def test_every_task_has_an_execution_timeout(dagbag):
    dag = dagbag.dags["document_pipeline"]
    for task in dag.tasks:
        assert task.execution_timeout is not None, task.task_id
    for task_id in ("batch.extract", "batch.chunk", "batch.embed"):
        assert dag.get_task(task_id).execution_timeout == TASK_TIMEOUTS["stage"]


def test_a_batch_deadline_ends_before_its_task_is_killed():
    """The run's own deadline, plus one item still in flight, fits in the backstop."""
    longest = PipelineSettings(
        batch_size=int(BOUNDS["batch_size"][1]),
        item_timeout_s=BOUNDS["item_timeout_s"][1],
        lease_s=BOUNDS["lease_s"][1],
        max_retry_after_s=BOUNDS["max_retry_after_s"][1],
    )
    worst = longest.batch_deadline_s(longest.batch_size) + longest.item_timeout_s
    assert worst <= TASK_TIMEOUTS["stage"].total_seconds()
    defaults = PipelineSettings()
    assert defaults.batch_deadline_s(50) == 50 * 60 + 600 + 300
