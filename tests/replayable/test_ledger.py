import time

import pytest

from replayable import db
from replayable.ledger import Ledger, RunContext
from replayable.retry import Classified, ErrorKind

DOC = "d" * 64


@pytest.fixture
def doc(conn):
    db.execute_values(conn, "upsert_documents", [(DOC, "/x.pdf", 10)])
    conn.commit()
    return DOC


def make(conn, owner="w1", lease_s=60.0, max_attempts=3):
    return Ledger(
        conn,
        "extract",
        "1.0",
        "cfg",
        RunContext(owner=owner, run_id="r1"),
        lease_s=lease_s,
        max_attempts=max_attempts,
    )


def status(conn, key="k"):
    with conn.cursor() as cur:
        cur.execute(
            "SELECT status, attempts, error_class FROM replayable.stage_runs WHERE item_key = %s",
            (key,),
        )
        row = cur.fetchone()
    conn.commit()
    return row


def dead_letters(conn):
    with conn.cursor() as cur:
        cur.execute(
            "SELECT item_key, error_class, attempts, traceback, status FROM replayable.dead_letters"
        )
        rows = cur.fetchall()
    conn.commit()
    return rows


RETRYABLE = Classified("http_503", ErrorKind.RETRYABLE, "503")
TERMINAL = Classified("encrypted", ErrorKind.TERMINAL, "locked")


def test_registering_twice_keeps_state_and_attempts(conn, doc):
    ledger = make(conn)
    ledger.register([("k", doc)])
    assert ledger.claim("k") == 1
    ledger.register([("k", doc)])
    assert status(conn) == ("running", 1, None)


def test_a_live_lease_is_skipped_by_another_worker(conn, doc):
    first, second = make(conn, "w1"), make(conn, "w2")
    first.register([("k", doc)])
    assert first.claim("k") == 1
    assert second.claim("k") is None


def test_an_expired_lease_is_taken_over(conn, doc):
    first, second = make(conn, "w1", lease_s=0.1), make(conn, "w2")
    first.register([("k", doc)])
    first.claim("k")
    time.sleep(0.2)
    assert second.claim("k") == 2


def test_only_the_lease_holder_can_complete(conn, doc):
    first, second = make(conn, "w1", lease_s=0.1), make(conn, "w2")
    first.register([("k", doc)])
    first.claim("k")
    time.sleep(0.2)
    second.claim("k")
    assert first.complete("k", conn=conn) is False
    assert second.complete("k", conn=conn) is True
    conn.commit()
    assert status(conn)[0] == "done"


def test_a_done_item_cannot_be_claimed_again(conn, doc):
    ledger = make(conn)
    ledger.register([("k", doc)])
    ledger.claim("k")
    ledger.complete("k", conn=conn)
    conn.commit()
    assert ledger.claim("k") is None


def test_retryable_failures_dead_letter_at_the_attempt_cap(conn, doc):
    ledger = make(conn, max_attempts=2)
    ledger.register([("k", doc)])
    ledger.claim("k")
    assert ledger.fail("k", RETRYABLE, "tb1") == "failed"
    assert dead_letters(conn) == []
    ledger.claim("k")
    assert ledger.fail("k", RETRYABLE, "tb2") == "dead"
    assert dead_letters(conn) == [("k", "http_503", 2, "tb2", "open")]
    assert ledger.claim("k") is None


def test_a_terminal_error_dead_letters_at_once(conn, doc):
    ledger = make(conn)
    ledger.register([("k", doc)])
    ledger.claim("k")
    assert ledger.fail("k", TERMINAL, "tb") == "dead"
    assert status(conn) == ("dead", 1, "encrypted")
    assert len(dead_letters(conn)) == 1


def test_release_gives_the_attempt_back(conn, doc):
    ledger = make(conn)
    ledger.register([("k", doc)])
    ledger.claim("k")
    ledger.release("k", Classified("http_401", ErrorKind.SYSTEMIC, "no"))
    assert status(conn) == ("failed", 0, "http_401")


def test_states_reads_the_whole_batch_in_one_query(conn, doc):
    ledger = make(conn)
    ledger.register([("a", doc), ("b", doc)])
    ledger.claim("a")
    states = ledger.states(["a", "b", "missing"])
    assert {k: s.status for k, s in states.items()} == {"a": "running", "b": "pending"}
    assert states["a"].lease_live
