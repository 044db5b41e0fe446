"""PublishEventsOperator: deliver the outbox's due events, then announce ready documents.

Two sinks (ADR 0041): the webhook of the events connection gets every event, keyed by its
id, and an event is marked published once the webhook acknowledged it; Airflow gets one
asset event on :data:`DOCUMENTS_READY` per task instance that published ``document.ready``
events, so that DAGs can be scheduled on documents becoming ready. Airflow records that
asset event in the transaction that marks the task successful; its extra names the
publication (``{"publication": ..., "ready": n}``), which
:func:`replayable.outbox.published_in` reads back page by page, so the extra stays the
same size however many documents it announces (ADR 0010). Documents that left the index
(``document.deleted`` and ``document.updated``, ADR 0138) are announced the same way on
:data:`DOCUMENTS_RETRACTED`, so that a DAG that copies the index downstream drops them.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

from airflow.sdk import Asset, BaseOperator, Context
from airflow.sdk.exceptions import AirflowFailException

from replayable import db
from replayable.airflow.hooks import connection_dsn, connection_fields
from replayable.outbox import PublishLimits, publication_counts, publish
from replayable.vocabulary import EVENTS_CONN_ID, LEDGER_CONN_ID

DOCUMENTS_READY = Asset(name="replayable_documents_ready", uri="replayable://documents/ready")
DOCUMENTS_RETRACTED = Asset(
    name="replayable_documents_retracted", uri="replayable://documents/retracted"
)


class PublishEventsOperator(BaseOperator):
    """Deliver due outbox events to the webhook; announce ready documents as an asset event.

    The task emits no asset event when it announced no ready document: it drops its outlets
    and succeeds. It fails when the webhook fails systemically (ADR 0070): it refuses the
    credentials (401/403), its endpoint is missing (404/410), it cannot be reached, or
    delivery after delivery fails; the events then stay pending with no attempt spent.
    Events that fail otherwise stay pending, with a backoff, or are dead-lettered in the
    outbox (``status = 'dead'`` with their error), and the task succeeds.

    :param postgres_conn_id: Airflow connection of the replayable database.
    :param events_conn_id: Airflow connection of the webhook (see ``replayable.airflow.sinks``);
        None publishes to the asset only, marking events published as they are claimed.
    :param max_events: events claimed at most by one run of the task.
    :param batch_size: events claimed per round trip (``PublishLimits.claim_size``).
    :param lease_s: how long a claim lasts; longer than one delivery with its retries.
    :param max_attempts: deliveries per event before it is dead-lettered.
    :param max_s: the time budget of one run: no delivery starts that could end past it;
        shorter than ``execution_timeout``, if one is set.
    """

    template_fields: Sequence[str] = (
        "max_events",
        "batch_size",
        "lease_s",
        "max_attempts",
        "max_s",
    )
    ui_color = "#eef1f8"

    def __init__(
        self,
        *,
        postgres_conn_id: str = LEDGER_CONN_ID,
        events_conn_id: str | None = EVENTS_CONN_ID,
        max_events: int | str = PublishLimits.max_events,
        batch_size: int | str = PublishLimits.claim_size,
        lease_s: float | str = PublishLimits.lease_s,
        max_attempts: int | str = PublishLimits.max_attempts,
        max_s: float | str = PublishLimits.max_s,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("outlets", [DOCUMENTS_READY, DOCUMENTS_RETRACTED])
        super().__init__(**kwargs)
        self.postgres_conn_id = postgres_conn_id
        self.events_conn_id = events_conn_id
        self.max_events = max_events
        self.batch_size = batch_size
        self.lease_s = lease_s
        self.max_attempts = max_attempts
        self.max_s = max_s

    def limits(self) -> PublishLimits:
        """The rendered arguments as limits; a bad value raises naming it."""
        values: dict[str, Any] = {}
        # The argument keeps the DAG param's name; the limits call it what it counts.
        for name, field_name, kind in (
            ("max_events", "max_events", int),
            ("batch_size", "claim_size", int),
            ("lease_s", "lease_s", float),
            ("max_attempts", "max_attempts", int),
            ("max_s", "max_s", float),
        ):
            raw = getattr(self, name)
            try:
                values[field_name] = kind(raw)
            except (TypeError, ValueError):
                raise ValueError(f"{name}: expected a number, got {raw!r}") from None
        timeout = self.execution_timeout
        if timeout is not None and values["max_s"] >= timeout.total_seconds():
            # Killed at the timeout, the task would leave a delivery half done and unsettled.
            raise ValueError(
                f"max_s ({values['max_s']:g} s) must be shorter than the task's "
                f"execution_timeout ({timeout.total_seconds():g} s)"
            )
        try:
            return PublishLimits(**values)
        except ValueError as error:
            # Name the argument the DAG author passed, not the limits' field behind it.
            raise ValueError(str(error).replace("claim_size", "batch_size")) from None

    def _has_connection(self, conn_id: str) -> bool:
        """Whether ``conn_id`` is defined; without it, events go out as asset events only."""
        from airflow.sdk.exceptions import AirflowNotFoundException

        try:
            connection_fields(conn_id)
        except AirflowNotFoundException:
            self.log.warning("no connection %r: events are published as asset events only", conn_id)
            return False
        return True

    def execute(self, context: Context) -> dict[str, Any]:
        from replayable.airflow.sinks import WebhookSink, webhook_settings_from_connection

        ti = context["ti"]
        publication = f"{ti.dag_id}/{ti.run_id}/{ti.task_id}"
        if ti.map_index is not None and ti.map_index >= 0:
            publication += f"/{ti.map_index}"
        owner = f"{socket.gethostname()}:{os.getpid()}:{publication}:{ti.try_number}"
        limits = self.limits()
        with ExitStack() as stack:
            sink = None
            if self.events_conn_id is not None and self._has_connection(self.events_conn_id):
                sink = stack.enter_context(
                    WebhookSink(webhook_settings_from_connection(self.events_conn_id))
                )
            database = db.Database(connection_dsn(self.postgres_conn_id))
            stack.callback(database.close)
            result = publish(database, sink, owner=owner, publication=publication, limits=limits)
            # Counted by publication, not from this try's result: a retry of this task
            # instance announces what an earlier try published and could not announce.
            counts = database.transaction(lambda conn: publication_counts(conn, publication))
        summary = result.summary()
        self.log.info("published %s; this task instance has published %s", summary, counts)
        if result.dead:
            self.log.warning(
                "%d event(s) dead-lettered in the outbox: `replayable outbox list --status "
                "dead` shows them, `replayable outbox requeue` sends them again",
                result.dead,
            )
        if result.out_of_time:
            self.log.warning(
                "stopped at the time budget (max_s=%g s); the next run delivers the rest",
                limits.max_s,
            )
        if result.systemic is not None:
            raise AirflowFailException(
                f"the webhook of connection {self.events_conn_id!r} did not take the events "
                f"({result.systemic.error_class}: {result.systemic.message}); they stay "
                "pending, no attempt spent"
            )
        # An asset event per kind of news this task instance published, none without any:
        # no skip either, as Airflow records a skip only once the task's process has exited,
        # up to a second after it ended, where a success is recorded at once. The runner
        # reads the outlets after execute (ADR 0124).
        announced = {DOCUMENTS_READY: "ready", DOCUMENTS_RETRACTED: "retracted"}
        if not any(counts.get(key, 0) for key in announced.values()):
            self.outlets = []
            self.log.info(
                "no document became ready or left the index (%d other event(s) published): "
                "no asset event",
                counts["events"],
            )
            return summary
        self.outlets = [
            asset
            for asset in self.outlets
            if asset not in announced or counts.get(announced[asset], 0)
        ]
        for asset in self.outlets:
            if asset in announced:
                key = announced[asset]
                context["outlet_events"][asset].extra = {
                    "publication": publication,
                    key: counts[key],
                }
        return summary
