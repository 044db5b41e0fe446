"""A name is an identity (ADR 0140): each stage name stands for one class, each version for
one code.

Items, artifacts and events are keyed by a stage's name and version, so two classes under
one name, or two codes under one version, would silently share outputs. Every plan records
its pipeline's stages in the ledger (``stage_identities``, ``stage_versions``,
``stage_configs``) and is refused, naming both sides, when a name already stands for another
class or a version for other code. Nothing here imports Airflow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from replayable.db import Connection, execute, fetch_all
from replayable.keys import canonical_json, config_hash
from replayable.stage_code import class_path, code_hash, shipped

if TYPE_CHECKING:
    from replayable.settings import PipelineSettings
    from replayable.stage import Models, Pipeline


class StageIdentityError(ValueError):
    """A stage that would share the ledger's outputs of another: refused at plan.

    :param stage: the stage's name; ``recorded`` and ``mine`` what the ledger holds for it
        and what this pipeline has (a class path, or a code hash).
    """

    def __init__(self, message: str, *, stage: str, recorded: str, mine: str) -> None:
        super().__init__(message)
        self.stage = stage
        self.recorded = recorded
        self.mine = mine


@dataclass(frozen=True)
class Identity:
    """What a pipeline's stage is: its class, version, code and key config under a run."""

    stage: str
    class_path: str
    version: str
    code_hash: str | None
    config: dict[str, Any]


def identities(pipeline: Pipeline, settings: PipelineSettings, models: Models) -> list[Identity]:
    """The identity of each of ``pipeline``'s stages under ``settings``."""
    return [
        Identity(
            stage.name,
            class_path(type(stage)),
            stage.version,
            code_hash(type(stage)),
            stage.key_config(settings, models),
        )
        for stage in pipeline.stages
    ]


def _same_class(recorded: str, mine: str) -> bool:
    # A release may move a shipped stage to another module: it is still that stage.
    return recorded == mine or (shipped(recorded) and shipped(mine))


def record(conn: Connection, found: list[Identity], *, dag_id: str) -> None:
    """Record ``found`` (a pipeline's stages) in the ledger, or raise
    :class:`StageIdentityError` if a name stands for another class there, or a version for
    other code. The stages' rows stay locked until the transaction ends."""
    # In one order in every plan: two plans that add the same new names never deadlock.
    found = sorted(found, key=lambda i: i.stage)
    names = [i.stage for i in found]
    execute(
        conn,
        "identity/record_stage_identities",
        {"stages": names, "class_paths": [i.class_path for i in found], "dag_id": dag_id},
    )
    held = {
        row["stage"]: row for row in fetch_all(conn, "identity/stage_identities", {"stages": names})
    }
    for mine in found:
        row = held[mine.stage]
        if not _same_class(row["class_path"], mine.class_path):
            raise StageIdentityError(
                f"stage {mine.stage!r} is {row['class_path']} in the ledger (recorded by"
                f" {row['dag_id']}), and {mine.class_path} in {dag_id}: a name is an identity,"
                " and two classes under one would share their outputs. Rename one of them"
                " (ADR 0140).",
                stage=mine.stage,
                recorded=row["class_path"],
                mine=mine.class_path,
            )
    configs = [canonical_json(i.config) for i in found]
    config_hashes = [config_hash(i.config) for i in found]
    versions = [i.version for i in found]
    rows = fetch_all(
        conn,
        "identity/record_stage_versions",
        {
            "stages": names,
            "versions": versions,
            "code_hashes": [i.code_hash for i in found],
            "configs": configs,
            "config_hashes": config_hashes,
            "dag_id": dag_id,
        },
    )
    _check_code(rows, {i.stage: i for i in found}, dag_id)
    execute(
        conn,
        "identity/record_stage_configs",
        {"stages": names, "versions": versions, "config_hashes": config_hashes, "configs": configs},
    )


def _check_code(rows: list[dict[str, Any]], mine: dict[str, Identity], dag_id: str) -> None:
    for row in rows:
        ours = mine[row["stage"]]
        if row["code_hash"] is None or ours.code_hash is None or row["code_hash"] == ours.code_hash:
            continue
        raise StageIdentityError(
            f"stage {ours.stage!r} version {ours.version!r} was recorded with other code (by"
            f" {row['dag_id']}: {ours.class_path} code {row['code_hash'][:12]}; in {dag_id}:"
            f" code {ours.code_hash[:12]}): under one version its documents would keep the old"
            " code's outputs. Bump its version, or set version = 'auto' so that a change of"
            " code bumps it (ADR 0140).",
            stage=ours.stage,
            recorded=row["code_hash"],
            mine=ours.code_hash,
        )
