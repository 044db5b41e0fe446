"""The webhook receivers: ``/webhooks/NAME``, standing in for a downstream system.

A delivery is stored once per ``Idempotency-Key`` and answered as the fault config says
(``webhook_statuses``, ``webhook_status_always``); :mod:`~devtools.model_server.handler`
describes what each answer holds.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from devtools.model_server.errors import HttpError

if TYPE_CHECKING:
    from devtools.model_server.state import ServerState

_WEBHOOK_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,100}")


def webhook_path(name: str) -> str:
    """Return the path of webhook receiver ``name``; raise ``ValueError`` if it is invalid."""
    if not _WEBHOOK_NAME_RE.fullmatch(name):
        raise ValueError(
            f"invalid webhook name {name!r}: use 1 to 100 of A-Z, a-z, 0-9, '.', '_', '-'"
        )
    return f"/webhooks/{name}"


def receive(
    state: ServerState, command: str, name: str, key: str | None, body: bytes
) -> tuple[int, object]:
    """Answer ``command`` on receiver ``name``: its events (GET) or a delivery (POST).

    Return the status and the JSON payload; raise :class:`HttpError` for a refused or
    failed delivery, which the stats count as failed.
    """
    if not _WEBHOOK_NAME_RE.fullmatch(name):
        raise HttpError(404, f"unknown endpoint /webhooks/{name}")
    if command == "GET":
        return 200, {"name": name, "events": state.stats.webhook_events(name)}
    if command != "POST":
        raise HttpError(405, f"use GET, POST on /webhooks/{name}", headers={"Allow": "GET, POST"})
    try:
        if not key:
            raise HttpError(
                400, "an Idempotency-Key header is required", code="missing_idempotency_key"
            )
        try:
            event = json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise HttpError(400, f"request body is not valid JSON: {exc}") from None
        config, status = state.next_webhook_status()
        if status is not None and status >= 400:
            raise config.injected(status, "webhook delivery")
        reply = state.stats.store_webhook(name, key, event, status or 200)
    except HttpError:
        state.stats.fail_webhook()
        raise
    return reply.status, reply.payload
