"""A name is an identity (ADR 0140): one class per stage name, one code per version, and
stages that cannot work are refused when the pipeline is made."""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from checks import rows, scalar, subset
from in_process import PipelineInProcess
from replayable import ArtifactStage, Document, Pipeline
from replayable.stage_code import class_path, code_hash
from replayable.stage_identity import Identity, StageIdentityError, record
from replayable.stages.builtin import CHUNK, EMBED, EXTRACT, SUMMARIZE

STAGE_FILE = '''
from replayable import ArtifactStage


class Tags(ArtifactStage):
    """{doc}"""

    name = "tags"
    version = {version!r}

    def process(self, document):
        return {{"tags": [{tag!r}]}}  # {comment}
'''


def load_stage(
    folder: Path, *, tag: str, version: str = "1.0", doc: str = "Tags.", comment: str = ""
) -> type[ArtifactStage]:
    """``user_tags.Tags``, from a file of its own in ``folder``: one class path, any code."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "user_tags.py"
    path.write_text(STAGE_FILE.format(doc=doc, version=version, tag=tag, comment=comment))
    spec = importlib.util.spec_from_file_location("user_tags", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Kept, as Airflow keeps a DAG file's module: Python finds a class's source through it.
    sys.modules["user_tags"] = module
    spec.loader.exec_module(module)
    return module.Tags  # type: ignore[no-any-return]


class Tags(ArtifactStage):
    """A stage named ``tags``, defined here."""

    name = "tags"

    def process(self, document: Document) -> dict[str, Any]:
        return {"tags": ["mine"]}


class OtherTags(ArtifactStage):
    """Another stage under the same name, defined here as well."""

    name = "tags"

    def process(self, document: Document) -> dict[str, Any]:
        return {"tags": ["theirs"]}


@pytest.fixture(autouse=True)
def _forget_user_tags():
    yield
    sys.modules.pop("user_tags", None)


@pytest.fixture
def run_pipeline(run_in_process, monkeypatch):
    def run(pipeline: Pipeline, conf: dict[str, Any]) -> dict[str, Any]:
        return PipelineInProcess(monkeypatch, pipeline=pipeline)(conf)

    return run


def test_two_pipelines_with_different_stages_under_one_name_the_second_is_refused_at_plan(
    run_pipeline, conn, tmp_path
):
    folder = subset(tmp_path, 2)
    first = run_pipeline(Pipeline("tags_one", (EXTRACT, Tags())), {"source": str(folder)})
    assert not first["_failed"], first["_tasks"]
    assert first["stages"]["tags"]["done"] == 2

    second = run_pipeline(Pipeline("tags_two", (EXTRACT, OtherTags())), {"source": str(folder)})
    assert second["_failed"]
    refusal = str(second["_tasks"]["plan", -1].error)
    assert class_path(Tags) in refusal and class_path(OtherTags) in refusal, refusal
    assert "tags_one" in refusal and "Rename" in refusal
    # Nothing of the second pipeline was planned, let alone linked to the first's outputs.
    assert scalar(conn, "SELECT count(*) FROM replayable.stage_runs WHERE dag_id = 'tags_two'") == 0
    assert rows(conn, "SELECT stage, class_path, dag_id FROM replayable.stage_identities") == [
        ("extract", class_path(type(EXTRACT)), "tags_one"),
        ("tags", class_path(Tags), "tags_one"),
    ]


def test_other_code_under_the_same_version_is_refused_and_a_bumped_version_is_not(
    run_pipeline, conn, tmp_path
):
    folder = subset(tmp_path, 1)
    old = load_stage(tmp_path / "v1", tag="old")
    assert not run_pipeline(Pipeline("tags_p", (EXTRACT, old())), {"source": str(folder)})[
        "_failed"
    ]

    changed = load_stage(tmp_path / "v2", tag="new")
    assert class_path(changed) == class_path(old) == "user_tags.Tags"
    refused = run_pipeline(Pipeline("tags_p", (EXTRACT, changed())), {"source": str(folder)})
    assert refused["_failed"]
    refusal = str(refused["_tasks"]["plan", -1].error)
    assert "'1.0' was recorded with other code" in refusal, refusal
    assert "Bump its version, or set version = 'auto'" in refusal

    bumped = load_stage(tmp_path / "v3", tag="new", version="1.1")
    again = run_pipeline(Pipeline("tags_p", (EXTRACT, bumped())), {"source": str(folder)})
    assert not again["_failed"], again["_tasks"]
    assert again["stages"]["tags"]["done"] == 1
    assert rows(
        conn, "SELECT version, config FROM replayable.stage_configs WHERE stage = 'tags' ORDER BY 1"
    ) == [("1.0", {"input_chars": 100_000}), ("1.1", {"input_chars": 100_000})]


def test_a_comment_or_a_docstring_is_not_a_change_of_code(tmp_path):
    # Python finds a class's source through its module as it is now: each is hashed in turn.
    plain = code_hash(load_stage(tmp_path / "a", tag="x"))
    annotated = code_hash(load_stage(tmp_path / "b", tag="x", doc="Other.", comment="a note"))
    changed = code_hash(load_stage(tmp_path / "c", tag="y"))
    assert plain == annotated != changed
    assert code_hash(type(EMBED)) is None  # a shipped stage: its release keeps its version


def test_version_auto_follows_the_code_so_a_change_redoes_its_items(run_pipeline, tmp_path):
    folder = subset(tmp_path, 1)
    # Each version is taken once per class, from its module as it is then.
    first = load_stage(tmp_path / "a", tag="old", version="auto")
    assert first().version.startswith("auto-")
    same = load_stage(tmp_path / "b", tag="old", version="auto", comment="only a comment")
    assert same().version == first().version
    changed = load_stage(tmp_path / "c", tag="new", version="auto")
    assert changed().version != first().version

    assert not run_pipeline(Pipeline("auto_p", (EXTRACT, first())), {"source": str(folder)})[
        "_failed"
    ]
    again = run_pipeline(Pipeline("auto_p", (EXTRACT, changed())), {"source": str(folder)})
    assert not again["_failed"], again["_tasks"]
    assert (again["to_do"], again["stages"]["tags"]["done"]) == (1, 1)


def test_the_final_stage_announces_unless_a_stage_says_which_does():
    assert Pipeline("p", (EXTRACT, Tags())).announces("tags")
    assert not Pipeline("p", (EXTRACT, Tags())).announces("extract")
    shipped = Pipeline("p", (EXTRACT, CHUNK, EMBED, SUMMARIZE))
    assert [shipped.announces(n) for n in shipped.names] == [False, False, True, False]
    # A stage that says last = True (embed) is the one; the final stage then keeps quiet.
    assert not Pipeline("p", (EXTRACT, CHUNK, EMBED, Tags())).announces("tags")
    assert Pipeline("p", (EXTRACT, SUMMARIZE)).announces("summarize")


@pytest.mark.parametrize("reads", ["chunk", "embed"])
def test_an_artifact_stage_reading_chunks_or_vectors_is_refused_when_the_pipeline_is_made(reads):
    class Tagger(Tags):
        pass

    Tagger.reads = reads
    with pytest.raises(ValueError, match=f"stage 'tags' reads '{reads}': its output is not"):
        Pipeline("p", (EXTRACT, CHUNK, EMBED, Tagger()))


def test_an_artifact_stage_reading_the_document_itself_is_refused_when_the_pipeline_is_made():
    class First(Tags):
        reads = None

    with pytest.raises(ValueError, match=r"reads the document itself.*EXTRACT"):
        Pipeline("p", (First(),))


def test_an_artifact_stage_may_read_the_text_a_summary_or_another_artifact_stage():
    class OnSummary(Tags):
        name = "on_summary"
        reads = "summarize"

    class OnTags(Tags):
        name = "on_tags"
        reads = "tags"

    Pipeline("p", (EXTRACT, SUMMARIZE, Tags(), OnSummary(), OnTags()))


def test_the_class_path_drops_the_prefix_airflow_gives_a_dag_files_module():
    module = ModuleType(f"unusual_prefix_{'ab' * 20}_my_pipeline")
    cls = type("Tags", (), {"__module__": module.__name__})
    assert class_path(cls) == "my_pipeline.Tags"


def test_two_plans_recording_one_new_name_at_once_cannot_both_take_it(conn, dsn):
    """The first plan's transaction holds the name until it ends: the second, started while
    the first is open, waits for it and is refused, whichever order the commits reach."""
    from replayable import db

    db.migrate(conn)
    conn.commit()
    first, second = db.connect(dsn), db.connect(dsn)
    outcome: list[BaseException | None] = []

    def plan_second() -> None:
        try:
            record(second, [Identity("tags", "theirs.Tags", "1.0", None, {})], dag_id="two")
            second.commit()
            outcome.append(None)
        except StageIdentityError as error:
            second.rollback()
            outcome.append(error)

    try:
        record(first, [Identity("tags", "mine.Tags", "1.0", None, {})], dag_id="one")
        waiting = threading.Thread(target=plan_second)
        waiting.start()
        first.commit()
        waiting.join(timeout=60)
    finally:
        first.close()
        second.close()
    assert len(outcome) == 1 and isinstance(outcome[0], StageIdentityError), outcome
    assert "mine.Tags" in str(outcome[0]) and "theirs.Tags" in str(outcome[0])
    assert rows(conn, "SELECT stage, class_path FROM replayable.stage_identities") == [
        ("tags", "mine.Tags")
    ]
