"""Stages as a public API: what a stage declares, and the pipeline a list of them makes.

A :class:`Stage` names itself, the stage whose output it reads, its code version and the
config that shapes its output, and builds the :class:`~replayable.runner.StageSpec` that
processes a batch. The framework gives every stage the same guarantees: keys from content,
code version and config, check-before-call, leases, classified retries, the attempt cap and
dead letters, partial re-runs, outbox events. A user's stage subclasses
:class:`ArtifactStage` (``replayable.stages.artifact``) and writes one method.

A :class:`Pipeline` is an ordered list of stages; ``pipeline_dag`` builds a DAG from one and
registers it under its DAG id, so that each task of the DAG finds its stages again
(:func:`pipeline_of`). Nothing here imports Airflow.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from replayable.models.choice import Models as Models  # replayable.Models is read from here
from replayable.runner.protocol import spec_hash_of
from replayable.vocabulary import STAGE_NAME_PATTERN

if TYPE_CHECKING:
    from replayable.db import Database
    from replayable.models.endpoint import ModelSettings
    from replayable.runner import StageSpec
    from replayable.settings import PipelineSettings

# A stage's name is its identity in the ledger (stage_runs.stage, metrics labels, the UI's
# filters): lowercase words, as a URL, a label and a SQL value all take them.
NAME_PATTERN = STAGE_NAME_PATTERN


# The error class a run's report gives the documents of a stage that could not be built.
STAGE_BUILD = "stage_build"


class StageBuildError(Exception):
    """A stage's ``build`` raised: the stage or the run's settings are wrong, no document is.

    Building it again would fail the same way, so the task fails once (ADR 0133).

    :param stage: the stage's name.
    :param cause: what ``build`` raised.
    """

    def __init__(self, stage: str, cause: BaseException) -> None:
        self.stage = stage
        self.cause = f"{type(cause).__name__}: {cause}"
        super().__init__(
            f"stage {stage!r} could not be built: {self.cause}. Its documents were not entered;"
            " fix the stage or the run's settings and run again (not retried: building it"
            " again fails the same way)"
        )


@dataclass
class BuildContext:
    """What a stage is built from at task time: the run's settings and what it can use.

    ``stack`` closes what the stage opens (clients, pools) when the batch ends;
    ``spec_hashes`` are every stage's spec hash under these settings, as the plan computed
    them, from the ``models`` the run resolved; ``model_conn_id`` names the model connection
    a model stage asks for a client.
    """

    settings: PipelineSettings
    run_id: str
    documents: int
    connect: Callable[[], Database]
    stack: ExitStack
    spec_hashes: Mapping[str, str]
    model_conn_id: str
    models: Models = field(default_factory=Models)
    # Reads the model connection ``model_conn_id`` names (the operator hands its hook's in):
    # a model stage builds its clients from what it answers.
    model_provider: Callable[[], ModelSettings] | None = None
    # The task the stage runs in (recorded with what it submits to a provider's batches).
    dag_id: str | None = None
    map_index: int | None = None
    # Whether the stage announces its documents ``document.ready`` in this pipeline
    # (:meth:`Pipeline.announces`); None: as its own ``last`` says.
    announces: bool | None = None


# ``version = "auto"``: the version is derived from the stage class's code (ADR 0140).
AUTO_VERSION = "auto"


class _CodeVersion:
    """An ``auto`` version: ``auto-`` and the start of the hash of the stage's code, taken
    when it is first asked for (the planner, a task), once per class."""

    def __init__(self) -> None:
        self._found: dict[type, str] = {}

    def __get__(self, instance: object, owner: type | None = None) -> str:
        from replayable.stage_code import code_hash

        cls = owner if owner is not None else type(instance)
        if cls not in self._found:
            found = code_hash(cls)
            if found is None:
                raise ValueError(
                    f"stage class {cls.__qualname__}: version = 'auto' needs its source code,"
                    " which Python cannot find (a class made in a REPL or by exec); set a"
                    " version of your own"
                )
            self._found[cls] = f"{AUTO_VERSION}-{found[:12]}"
        return self._found[cls]


class Stage(ABC):
    """One stage of a pipeline. Subclasses set the class attributes and implement
    :meth:`build`; :class:`~replayable.stages.artifact.ArtifactStage` implements it for
    stages whose output is JSON.

    - ``name``: its identity in the ledger, unique in the pipeline and in every pipeline that
      shares the ledger unless it is the same stage;
    - ``reads``: the stage whose output it reads, or None for the document itself;
    - ``version``: its code version; raising it redoes its items (and the stages that read it);
      ``"auto"``: derived from the class's code, so that a change of code redoes them;
    - ``last``: whether a document done in it is announced ``document.ready``; None (the
      default): when it is its pipeline's final stage and no stage there says ``last = True``.

    The ledger holds one class per name, and one code per name and version: a pipeline
    whose stage breaks either is refused at plan (:mod:`replayable.stage_identity`).
    """

    name: str = ""
    reads: str | None = None
    version: str = "1.0"
    last: bool | None = None
    # Whether its output per document is a JSON artifact (what an ArtifactStage reads).
    writes_artifacts: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("version") == AUTO_VERSION:
            cls.version = _CodeVersion()  # type: ignore[assignment]

    def check_input(self, source: Stage | None) -> str | None:
        """Why this stage cannot read ``source`` (None: the document), or None if it can.

        The pipeline asks when it is made, so that a DAG file whose stages cannot work is
        refused when it is parsed, not when a task first runs.
        """
        return None

    def key_config(self, settings: PipelineSettings, models: Models) -> dict[str, Any]:
        """The config that shapes this stage's output under a run's settings (its key)."""
        return {}

    def spec_hash(
        self, settings: PipelineSettings, models: Models, hashes: Mapping[str, str]
    ) -> str:
        """What a current row carries when it is done under these settings: the stage's
        version, key config and the spec hash of the stage it reads (``hashes``)."""
        lineage = dict(self.key_config(settings, models))
        if self.reads is not None:
            lineage["input"] = hashes[self.reads]
        return spec_hash_of(self.name, self.version, lineage)

    @abstractmethod
    def build(self, ctx: BuildContext) -> StageSpec:
        """The spec that plans, keys and processes a batch of this stage."""

    def __repr__(self) -> str:
        return f"<stage {self.name} {self.version} reads {self.reads}>"


@dataclass(frozen=True)
class Pipeline:
    """An ordered list of stages, each reading a stage before it (or the document).

    The first stage reads the document (``extract`` in the shipped pipelines); the others
    name their input. :meth:`paths` are the chains the planner walks, :meth:`downstream`
    what a re-run of a stage redoes.
    """

    dag_id: str
    stages: tuple[Stage, ...]
    default_stages: tuple[str, ...] = ()
    by_name: dict[str, Stage] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name: dict[str, Stage] = {}
        for stage in self.stages:
            if not re.match(NAME_PATTERN, stage.name or ""):
                raise ValueError(
                    f"stage name {stage.name!r}: lowercase letters, digits and _, "
                    "starting with a letter, at most 40"
                )
            if stage.name in by_name:
                raise ValueError(f"stage {stage.name!r} is in the pipeline twice")
            if stage.reads is not None and stage.reads not in by_name:
                raise ValueError(
                    f"stage {stage.name!r} reads {stage.reads!r}, which is not a stage before it"
                )
            refused = stage.check_input(by_name[stage.reads] if stage.reads else None)
            if refused is not None:
                raise ValueError(refused)
            by_name[stage.name] = stage
        if not by_name:
            raise ValueError("a pipeline needs at least one stage")
        if self.stages[0].reads is not None:
            raise ValueError(f"the first stage, {self.stages[0].name!r}, must read the document")
        unknown = [name for name in self.default_stages if name not in by_name]
        if unknown:
            raise ValueError(f"default_stages: {unknown} are not stages of the pipeline")
        object.__setattr__(self, "by_name", by_name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(stage.name for stage in self.stages)

    @property
    def defaults(self) -> tuple[str, ...]:
        """The stages a run executes when its conf names none."""
        return self.default_stages or self.names

    def stage(self, name: str) -> Stage:
        try:
            return self.by_name[name]
        except KeyError:
            raise ValueError(
                f"stage: {name!r} is not one of {list(self.names)} ({self.dag_id})"
            ) from None

    def announces(self, name: str) -> bool:
        """Whether ``name``'s documents done are announced ``document.ready``: its ``last``,
        or when it says nothing, whether it is the final stage and no stage says True."""
        stage = self.stage(name)
        if stage.last is not None:
            return stage.last
        return stage is self.stages[-1] and not any(s.last for s in self.stages)

    def inputs(self) -> dict[str, str | None]:
        return {stage.name: stage.reads for stage in self.stages}

    def downstream(self, name: str) -> tuple[str, ...]:
        """``name`` and every stage that reads its output, directly or not, in order."""
        found = {self.stage(name).name}
        for stage in self.stages:  # an input always comes before its readers
            if stage.reads in found:
                found.add(stage.name)
        return tuple(n for n in self.names if n in found)

    def paths(self) -> tuple[tuple[str, ...], ...]:
        """Each chain of inputs from the document to a stage no other stage reads."""
        read = {stage.reads for stage in self.stages if stage.reads}
        paths = []
        for leaf in (n for n in self.names if n not in read):
            path: list[str] = []
            at: str | None = leaf
            while at is not None:
                path.insert(0, at)
                at = self.by_name[at].reads
            paths.append(tuple(path))
        return tuple(paths)

    def effective_stages(self, settings: PipelineSettings) -> tuple[str, ...]:
        """The stages a run executes, in order: its ``stages`` (default :attr:`defaults`),
        or for a re-run or a redrive those of them that are its stage or read it. Without
        ``stages``, a re-run or redrive runs its own stage as well (ADR 0107)."""
        first = settings.first_stage
        chosen: Iterable[str] | None = settings.stages
        if chosen is None:
            chosen = (*self.defaults, first) if first else self.defaults
        chosen = set(chosen)
        if first is None:
            return tuple(n for n in self.names if n in chosen)
        return tuple(n for n in self.downstream(first) if n in chosen)

    def check(self, settings: PipelineSettings) -> None:
        """Refuse settings that name a stage this pipeline does not have, naming the field."""
        names = list(self.names)
        unknown = [s for s in settings.stages or () if s not in names]
        if unknown:
            raise ValueError(f"stages: {unknown} are not stages of {self.dag_id}: {names}")
        for what, selection in (("rerun", settings.rerun), ("redrive", settings.redrive)):
            if selection and selection.get("stage") not in names:
                raise ValueError(f"{what}.stage: {selection.get('stage')!r} is not one of {names}")
            if selection and not self.effective_stages(settings):
                stage = selection["stage"]
                raise ValueError(
                    f"stages: {list(settings.stages or ())} leave this {what} nothing to run:"
                    f" {what}.stage {stage!r} runs only {list(self.downstream(stage))}"
                    f" ({stage} and the stages that read it)"
                )

    def spec_hashes(self, settings: PipelineSettings, models: Models) -> dict[str, str]:
        """Every stage's spec hash under ``settings``, inputs first, without building any."""
        hashes: dict[str, str] = {}
        for stage in self.stages:
            hashes[stage.name] = stage.spec_hash(settings, models, hashes)
        return hashes
