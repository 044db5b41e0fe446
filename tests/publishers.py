"""Outbox helpers shared by the tests: pending events, and a publisher killed mid-way."""

from __future__ import annotations

import multiprocessing
import os
import signal
from typing import Any

from replayable import db
from replayable.airflow.sinks import WebhookSettings, WebhookSink
from replayable.outbox import Event, PublishLimits, publish
from replayable.retry import CallRetry

KILL_AFTER = 5  # deliveries: the killed publisher's first claimed group


def add_events(conn: Any, n: int, event_type: str = "document.ready") -> list[str]:
    """Insert ``n`` pending events, as finish_items would."""
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO replayable.outbox (event_id, event_key, event_type, aggregate_id, payload)"
            " SELECT replayable.outbox_event_id('t:' || i), 't:' || i, %s, 'doc' || i,"
            " jsonb_build_object('n', i) FROM generate_series(1, %s) AS i",
            (event_type, n),
        )
    conn.commit()
    return [r[0] for r in _rows(conn)]


def _rows(conn: Any) -> list[tuple[str]]:
    with conn.cursor() as cur:
        cur.execute("SELECT event_id FROM replayable.outbox ORDER BY seq")
        found = cur.fetchall()
    conn.commit()
    return list(found)


def _publish_then_die(dsn: str, url: str, lease_s: float) -> None:
    """A publisher process that is killed after its first delivery group, before the mark."""
    sent = 0

    class Dying(WebhookSink):
        def deliver(self, event: Event) -> None:
            nonlocal sent
            super().deliver(event)
            sent += 1
            if sent == KILL_AFTER:
                os.kill(os.getpid(), signal.SIGKILL)

    limits = PublishLimits(claim_size=KILL_AFTER, lease_s=lease_s)
    with Dying(WebhookSettings(url, timeout_s=1.0, retry=CallRetry(max_attempts=1))) as hook:
        publish(db.Database(dsn), hook, owner="doomed", publication="doomed", limits=limits)


def kill_a_publisher_after_sending(dsn: str, url: str, lease_s: float) -> None:
    """Run a publisher in its own process; SIGKILL it after it delivered ``KILL_AFTER`` events.

    Its rows stay leased (pending, unmarked) for ``lease_s``: sent, not marked published.
    """
    process = multiprocessing.get_context("spawn").Process(
        target=_publish_then_die, args=(dsn, url, lease_s)
    )
    process.start()
    process.join(timeout=60)
    assert process.exitcode == -signal.SIGKILL
