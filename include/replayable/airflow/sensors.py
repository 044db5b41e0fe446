"""DeadLetterGrowthSensor: wait for a spike in how fast dead letters arrive, then alert.

Alerts follow the dead-letter queue's growth *rate*, not its depth (invariant 9): a backlog
people are working through must not page anyone every 15 minutes, and a burst of new letters
must page even when the list was empty before. The growth is the number of letters created
in the last ``window_minutes``, whatever their status now (a letter redriven since still
arrived); the open depth and the window's commonest error classes only make the message
useful.

How it reads in a DAG (``dags/dead_letter_watch.py``)::

    spike = DeadLetterGrowthSensor(task_id="wait_for_growth", mode="reschedule",
                                   timeout=14 * 60, soft_fail=True)
    task(alert, task_id="alert")(spike.output)

- **The sensor waits for the spike**: it succeeds ("alert condition met") when more than
  ``max_new`` letters arrived in the window, and hands the numbers to XCom.
- **``alert`` raises the alarm**: it fails the run with ``AirflowFailException`` carrying the
  message, so Airflow's own machinery is the alert channel (on_failure_callback, notifiers,
  e-mail, a red run in the grid), and it is never retried.
- **A quiet interval is a green run**: the sensor pokes (``mode="reschedule"``, no worker slot
  held) until its timeout, a little under the schedule interval, and ``soft_fail=True``
  turns that timeout into SKIPPED; ``alert`` is skipped with it.

Why not fail the sensor itself on a spike (SqlSensor's ``failure`` callable)? That raises a
plain ``AirflowException``, which is retried and which ``soft_fail`` does not touch, so
a spike would be re-polled instead of reported, and a broken watcher would look like an
alert. Inverted as here, the grid tells the three cases apart: skipped sensor = quiet, failed
``alert`` = spike, failed sensor = the watch itself is broken (database down, schema missing).

The window ends at the database's ``now()`` at each poke, not at the run's data interval:
this is a live watch (the DAG has ``catchup=False``). While the window still holds more than
``max_new`` letters, each new run fires at its first poke, so an ongoing spike re-alerts
once per schedule interval and stops by itself when the rate drops; there is no state to
reset.

``window_minutes``, ``max_new`` and ``stage`` travel in the templated, bound ``parameters``;
``timeout`` and ``poke_interval`` are templated too, so a run's params can shorten a watch.
Literal values are checked when the sensor is built, templated ones once rendered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any, NoReturn

from airflow.providers.common.sql.sensors.sql import SqlSensor
from airflow.sdk import Context
from airflow.sdk.bases.sensor import PokeReturnValue
from airflow.sdk.exceptions import AirflowFailException

from replayable import db
from replayable.vocabulary import LEDGER_CONN_ID, STAGES, is_stage_name

__all__ = ["DeadLetterGrowth", "DeadLetterGrowthSensor", "alert"]


@dataclass(frozen=True)
class DeadLetterGrowth:
    """What one poke measured, and the threshold it was measured against."""

    new_letters: int
    open_letters: int
    top_error_classes: list[tuple[str, int]]
    window_minutes: int
    max_new: int
    stage: str | None

    @property
    def spiking(self) -> bool:
        return self.new_letters > self.max_new

    def message(self) -> str:
        """One line a person paged at night can act on."""
        scope = f"stage {self.stage}" if self.stage else "all stages"
        classes = ", ".join(f"{name} ({n})" for name, n in self.top_error_classes) or "none"
        verdict = "above" if self.spiking else "within"
        return (
            f"{self.new_letters} new dead letters in the last {self.window_minutes} min"
            f" ({scope}), {verdict} the threshold of {self.max_new};"
            f" {self.open_letters} open in total; top error classes: {classes}"
        )

    def to_xcom(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_xcom(cls, value: Mapping[str, Any]) -> DeadLetterGrowth:
        # XCom stores JSON: the (class, count) pairs come back as lists.
        top = [(str(name), int(n)) for name, n in value["top_error_classes"]]
        return cls(**{**value, "top_error_classes": top})


def alert(growth: Mapping[str, Any]) -> NoReturn:
    """Fail the task with the growth alert, so Airflow's failure notifications carry it.

    ``AirflowFailException`` is never retried: the spike is reported once per run.
    """
    raise AirflowFailException(f"Dead-letter spike: {DeadLetterGrowth.from_xcom(growth).message()}")


class DeadLetterGrowthSensor(SqlSensor):
    """Wait until more than ``max_new`` dead letters were created in the last window.

    Succeeds with the measured :class:`DeadLetterGrowth` (as a dict) in XCom; see the module
    docstring for how a DAG turns that into an alert.

    :param conn_id: Airflow connection of the replayable database.
    :param window_minutes: length of the window the growth is counted in (>= 1); templated.
    :param max_new: the sensor fires when *more* than this many letters arrived in the
        window (>= 0); templated.
    :param stage: count only this stage's letters (``extract``, ``chunk`` or ``embed``);
        ``None`` counts every stage; templated.
    :param poke_interval: seconds (or timedelta) between pokes; templated.
    :param timeout: seconds (or timedelta) after which the sensor gives up; templated.
    :param hook_params: extra arguments for the Postgres hook.
    """

    template_fields: Sequence[str] = (
        "conn_id",
        "parameters",
        "hook_params",
        "poke_interval",
        "timeout",
    )
    ui_color = "#f4dede"

    def __init__(
        self,
        *,
        conn_id: str = LEDGER_CONN_ID,
        window_minutes: int | str = 60,
        max_new: int | str = 10,
        stage: str | None = None,
        poke_interval: timedelta | float | str = 60,
        timeout: timedelta | float | str | None = None,
        hook_params: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        parameters = {"window_minutes": window_minutes, "max_new": max_new, "stage": stage}
        _check_parameters(parameters, allow_templates=True)
        interval_templated, timeout_templated = _is_template(poke_interval), _is_template(timeout)
        super().__init__(
            conn_id=conn_id,
            sql=db.sql("views/dead_letter_growth"),
            parameters=parameters,
            hook_params=hook_params,
            poke_interval=60 if interval_templated else _seconds("poke_interval", poke_interval),
            timeout=None if timeout is None or timeout_templated else _seconds("timeout", timeout),
            **kwargs,
        )
        # The SDK types these as seconds; a template string stands in for them from here
        # until execute() has it rendered and converts it.
        if interval_templated:
            self.poke_interval = poke_interval  # type: ignore[assignment]
        if timeout_templated:
            self.timeout = timeout  # type: ignore[assignment]

    def execute(self, context: Context) -> Any:
        # The fields are rendered by now; the base class needs plain seconds.
        self.poke_interval = _seconds("poke_interval", self.poke_interval)
        self.timeout = _seconds("timeout", self.timeout)
        return super().execute(context)

    def poke(self, context: Context) -> PokeReturnValue:  # type: ignore[override]
        # SqlSensor annotates poke() as bool; BaseSensorOperator.execute(), its only caller,
        # also takes a PokeReturnValue, the SDK's way to hand a finding to the next task.
        window, max_new, stage = _check_parameters(self.parameters or {}, allow_templates=False)
        self.parameters = {"window_minutes": window, "max_new": max_new, "stage": stage}
        hook = self._get_hook()  # type: ignore[attr-defined]  # the provider's stub omits it
        new_letters, open_letters, top = hook.get_records(self.sql, self.parameters)[0]
        growth = DeadLetterGrowth(
            new_letters=int(new_letters),
            open_letters=int(open_letters),
            top_error_classes=[(str(name), int(n)) for name, n in top],
            window_minutes=window,
            max_new=max_new,
            stage=stage,
        )
        self.log.info("%s", growth.message())
        return PokeReturnValue(is_done=growth.spiking, xcom_value=growth.to_xcom())


def _is_template(value: object) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def _whole(name: str, value: object, minimum: int) -> int:
    """``value`` as an int >= ``minimum``; Jinja without native rendering yields digit strings."""
    problem = ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise problem
    try:
        number = int(value)
    except ValueError:
        raise problem from None
    if number < minimum:
        raise problem
    return number


def _seconds(name: str, value: object) -> float:
    """``value`` (timedelta, number or rendered number) as non-negative seconds."""
    problem = ValueError(f"{name} must be a number of seconds >= 0 or a timedelta, got {value!r}")
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool) or not isinstance(value, int | float | str):
        raise problem
    else:
        try:
            seconds = float(value)
        except ValueError:
            raise problem from None
    if not seconds >= 0:  # also rejects NaN
        raise problem
    return seconds


def _check_parameters(
    parameters: Mapping[str, Any], *, allow_templates: bool
) -> tuple[int, int, str | None]:
    """Check window_minutes, max_new and stage; raise ValueError naming a bad value.

    With ``allow_templates`` a Jinja string passes unchecked (it is checked once rendered)
    and the returned tuple is only meaningful for the literal values.
    """

    def skip(value: object) -> bool:
        return allow_templates and _is_template(value)

    window = parameters.get("window_minutes")
    max_new = parameters.get("max_new")
    stage = parameters.get("stage")
    checked_window = 0 if skip(window) else _whole("window_minutes", window, 1)
    checked_max = 0 if skip(max_new) else _whole("max_new", max_new, 0)
    # Any pipeline's stage, a user's own included: the ledger is shared (ADR 0108).
    if not (stage is None or skip(stage) or is_stage_name(stage)):
        hint = ""
        if stage in ("None", ""):
            hint = " (render with render_template_as_native_obj=True so a null param stays None)"
        raise ValueError(
            f"stage must be a stage name ({', '.join(STAGES)} or one of your own) or None,"
            f" got {stage!r}{hint}"
        )
    return checked_window, checked_max, stage
