"""ProviderBatchTrigger: wait on the triggerer for a provider's batch jobs to end (ADR 0117).

An embed task in batch mode submits its batches, records them in the ledger and defers:
its worker slot is free while the batches run, which can take up to their 24-hour window.
This trigger reads each batch at the provider every ``poll_s`` seconds and fires as soon as
one of them has ended (completed, failed, expired, cancelled), so that the task collects
it and sends again what must be sent again while the others go on. With no batch id to
read (another worker is still sending the submission), it fires after ``poll_s``.

It reads the model connection in the triggerer, as the task does (the API key is never in
its serialized arguments, which Airflow stores in its database). A passing provider error
(a timeout, a lost connection, 408, 429, a 5xx) is logged and read again at the next poll;
the task's defer timeout ends a wait that never ends. A permanent one (401, 403, 404 or any
other 4xx: the key refused, a batch the provider does not know) ends the wait at once with
a ``failed`` event naming its class (``http_404``, …) and the batch, and the task runs its
stage again, which classifies it: a refused key stops the batch, and a submission no pass
can advance is abandoned (ADR 0147).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from replayable.models.batch_api import FINISHED
from replayable.retry import RETRYABLE_STATUS

log = logging.getLogger(__name__)


class ProviderBatchTrigger(BaseTrigger):
    """Fire when one of ``batch_ids`` has ended at the provider of ``conn_id``."""

    def __init__(self, conn_id: str, batch_ids: Sequence[str], poll_s: float = 60.0) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.conn_id = conn_id
        self.batch_ids = list(batch_ids)
        self.poll_s = float(poll_s)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "replayable.airflow.triggers.ProviderBatchTrigger",
            {"conn_id": self.conn_id, "batch_ids": self.batch_ids, "poll_s": self.poll_s},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        if not self.batch_ids:
            await asyncio.sleep(self.poll_s)
            yield TriggerEvent({"status": "recheck", "ended": {}})  # type: ignore[no-untyped-call]
            return
        import httpx

        base_url, headers = await self._endpoint()
        async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=60) as http:
            while True:
                ended: dict[str, str] = {}
                for batch_id in self.batch_ids:
                    try:
                        status = await self._status(http, batch_id)
                    except _PermanentError as error:
                        log.error("batch %s: %s", batch_id, error.message)
                        yield TriggerEvent(  # type: ignore[no-untyped-call]
                            {
                                "status": "failed",
                                "ended": {},
                                "batch_id": batch_id,
                                "error_class": error.error_class,
                                "message": error.message,
                            }
                        )
                        return
                    if status in FINISHED:  # the statuses a batch ends in
                        ended[batch_id] = status
                if ended:
                    yield TriggerEvent({"status": "ended", "ended": ended})  # type: ignore[no-untyped-call]
                    return
                await asyncio.sleep(self.poll_s)

    async def _endpoint(self) -> tuple[str, dict[str, str]]:
        from airflow.sdk import BaseHook

        from replayable.models.endpoint import settings_from_fields

        conn = await BaseHook.aget_connection(self.conn_id)
        settings = settings_from_fields(
            conn.host, conn.port, conn.schema, conn.password, conn.extra_dejson
        )
        headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        return settings.base_url, headers

    async def _status(self, http: Any, batch_id: str) -> str | None:
        """The batch's status; None to read again at the next poll; raise
        :class:`_PermanentError` for an answer that reading again cannot change."""
        try:
            response = await http.get(f"/batches/{batch_id}")
        except Exception as error:  # read again at the next poll
            log.warning("batch %s: could not read its status: %s", batch_id, type(error).__name__)
            return None
        status = response.status_code
        if 400 <= status < 500 and status not in RETRYABLE_STATUS:
            raise _PermanentError(
                f"http_{status}",
                f"the provider answered {status} for batch {batch_id}: {response.text[:300]}",
            )
        try:
            response.raise_for_status()
            return str(response.json()["status"])
        except Exception as error:  # read again at the next poll
            log.warning("batch %s: could not read its status: %s", batch_id, type(error).__name__)
            return None


class _PermanentError(Exception):
    """An answer about a batch that reading it again will not change."""

    def __init__(self, error_class: str, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.message = message
