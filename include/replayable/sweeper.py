"""The sweep: find the failed items runs left behind and ask for re-runs that finish them.

An item is left ``failed`` when its task's retries ran out while it was under its attempt
cap. Each pipeline has a sweeper DAG of its own (ADR 0042, 0109). Its sweep selects the items
the pipeline's own runs left failed, through the partial index of current failed rows, at
most ``max_items`` of them, oldest first, and turns them into one ``rerun`` conf of that
pipeline per stage (a document failed in two stages is re-run from the earlier one, which
redoes the later one too); one per stage and settings for the items failed under the
settings a run recorded (ADR 0135); and per embed mode: an item is re-run in the mode its
run used (ADR 0130). It also finds the documents whose later stages never ran because a
run of another pipeline that shares a stage took over the item this pipeline's run left
there, and re-runs them from that stage (ADR 0135). Nothing here imports Airflow.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from replayable.db import Connection, fetch_all
from replayable.keys import sha256_bytes
from replayable.settings import PipelineSettings

# A re-run's conf names its embed mode only when it is not the default one.
_DEFAULT_EMBED_MODE = PipelineSettings.embed_mode


@dataclass(frozen=True)
class UnderSettings:
    """Documents failed in ``stage`` under the non-default ``settings`` their run recorded."""

    stage: str
    settings: dict[str, Any]
    doc_ids: list[str]


@dataclass(frozen=True)
class Sweep:
    """What one sweep found: document ids per stage, in pipeline order, and the oldest;
    per stage, the embed mode each document's run used, where it is not the default; and
    ``other``: those failed under a run's own settings, per stage and settings; ``unrun``:
    per stage, documents another pipeline finished there after this one's run left them,
    whose later stages in this pipeline never ran."""

    by_stage: dict[str, list[str]] = field(default_factory=dict)
    oldest: datetime | None = None
    other: list[UnderSettings] = field(default_factory=list)
    embed_modes: dict[str, dict[str, str]] = field(default_factory=dict)
    unrun: dict[str, list[str]] = field(default_factory=dict)

    @property
    def items(self) -> int:
        return (
            sum(len(docs) for docs in self.by_stage.values())
            + sum(len(group.doc_ids) for group in self.other)
            + sum(len(docs) for docs in self.unrun.values())
        )


def select_failed(
    conn: Connection,
    *,
    dag_id: str,
    stages: Sequence[str],
    spec_hashes: Mapping[str, str],
    min_age_s: float,
    max_items: int,
    max_attempts: int,
) -> Sweep:
    """Select at most ``max_items`` documents with items that runs of ``dag_id`` left failed
    in ``stages`` (in pipeline order) to re-run, oldest first."""
    if max_items < 1:
        raise ValueError(f"max_items must be at least 1, got {max_items}")
    params = {
        "dag_id": dag_id,
        "stages": list(stages),
        "spec_hashes": [spec_hashes[stage] for stage in stages],
        "min_age_s": float(min_age_s),
        "max_attempts": max_attempts,
        "limit": max_items,
    }
    rows = fetch_all(conn, "plan/sweep_failed_items", params)
    conn.commit()
    first_stage: dict[str, int] = {}
    for row in rows:
        position = int(row["position"])
        first_stage[row["doc_id"]] = min(position, first_stage.get(row["doc_id"], position))
    chosen: dict[str, list[str]] = {}
    others: dict[tuple[str, str], list[str]] = {}
    oldest = None
    taken = 0
    for row in rows:  # oldest first
        if taken == max_items:
            break
        if first_stage.get(row["doc_id"]) != int(row["position"]):
            continue
        if row.get("settings") is None:
            chosen.setdefault(row["stage"], []).append(row["doc_id"])
        else:
            group = (row["stage"], json.dumps(row["settings"], sort_keys=True))
            others.setdefault(group, []).append(row["doc_id"])
        oldest = oldest or row["updated_at"]
        taken += 1
    ordered = {stage: sorted(chosen[stage]) for stage in stages if stage in chosen}
    other = [
        UnderSettings(stage, json.loads(settings), sorted(docs))
        for stage in stages
        for (group_stage, settings), docs in sorted(others.items())
        if group_stage == stage
    ]
    unrun = _unrun(conn, stages, params, taken=taken, already=set(first_stage))
    return Sweep(ordered, oldest, other, _embed_modes(conn, ordered, params), unrun)


def _unrun(
    conn: Connection,
    stages: Sequence[str],
    params: Mapping[str, Any],
    *,
    taken: int,
    already: set[str],
) -> dict[str, list[str]]:
    """Per stage, in pipeline order, the documents handed over there whose later stages never
    ran in this pipeline, within what is left of ``max_items``; a document the failed
    selection holds is left to it."""
    room = int(params["limit"]) - taken
    if room < 1:
        return {}
    rows = fetch_all(conn, "plan/sweep_unrun_items", {**params, "limit": room})
    conn.commit()
    found: dict[str, list[str]] = {}
    seen = set(already)
    for row in rows:  # oldest first
        if len(seen) - len(already) == room:
            break
        if row["doc_id"] not in seen:
            seen.add(row["doc_id"])
            found.setdefault(row["stage"], []).append(row["doc_id"])
    return {stage: sorted(found[stage]) for stage in stages if stage in found}


def _embed_modes(
    conn: Connection, chosen: Mapping[str, list[str]], params: Mapping[str, Any]
) -> dict[str, dict[str, str]]:
    """Per stage, the chosen documents whose runs used an embed mode other than the default."""
    if not chosen:
        return {}
    rows = fetch_all(
        conn,
        "plan/sweep_embed_modes",
        {
            "dag_id": params["dag_id"],
            "stages": params["stages"],
            "spec_hashes": params["spec_hashes"],
            "doc_ids": sorted({d for docs in chosen.values() for d in docs}),
        },
    )
    conn.commit()
    modes: dict[str, dict[str, str]] = {}
    for row in rows:
        if row["doc_id"] in chosen.get(row["stage"], ()) and row["embed_mode"] != (
            _DEFAULT_EMBED_MODE
        ):
            modes.setdefault(row["stage"], {})[row["doc_id"]] = row["embed_mode"]
    return modes


def rerun_requests(sweep: Sweep, *, sweep_run_id: str, max_attempts: int) -> list[dict[str, Any]]:
    """One ``TriggerDagRunOperator`` argument set per stage and embed mode: a run id and a
    ``rerun`` conf.

    The run id is derived from the sweep's, so a retried sweep cannot start a second run for
    the same stage; ``max_attempts`` goes along so the re-run's cap is the sweep's, and the
    ``embed_mode`` of the items' runs where it is not the default (ADR 0130).
    """
    requests = []
    for stage, doc_ids in sweep.by_stage.items():
        modes = sweep.embed_modes.get(stage, {})
        by_mode: dict[str | None, list[str]] = {}
        for doc_id in doc_ids:
            by_mode.setdefault(modes.get(doc_id), []).append(doc_id)
        for mode, docs in sorted(by_mode.items(), key=lambda entry: entry[0] or ""):
            conf: dict[str, Any] = {
                "rerun": {"stage": stage, "status": ["failed"], "doc_ids": docs},
                "max_attempts": max_attempts,
            }
            run_id = f"sweep__{stage}__{sweep_run_id}"
            if mode is not None:
                conf["embed_mode"] = mode
                run_id = f"sweep__{stage}__{mode}__{sweep_run_id}"
            requests.append({"trigger_run_id": run_id, "conf": conf})
    for stage, doc_ids in sweep.unrun.items():
        # Done in ``stage`` by another pipeline: re-run from there, the rest of the pipeline
        # plans what is missing.
        requests.append(
            {
                "trigger_run_id": f"sweep__{stage}__unrun__{sweep_run_id}",
                "conf": {
                    "rerun": {"stage": stage, "status": ["done"], "doc_ids": doc_ids},
                    "max_attempts": max_attempts,
                },
            }
        )
    for group in sweep.other:
        # The run's own settings and cap, if higher; its id names the settings' digest.
        digest = sha256_bytes(json.dumps(group.settings, sort_keys=True).encode())[:12]
        cap = max(max_attempts, int(group.settings.get("max_attempts") or 0))
        requests.append(
            {
                "trigger_run_id": f"sweep__{group.stage}__{digest}__{sweep_run_id}",
                "conf": {
                    **group.settings,
                    "rerun": {"stage": group.stage, "status": ["failed"], "doc_ids": group.doc_ids},
                    "max_attempts": cap,
                },
            }
        )
    return requests
