"""The ledger against a real Postgres: batch claims, leases, finishing, current state, counts."""

import threading

import psycopg2
import pytest

from checks import rows
from replayable import db
from replayable import ledger as ledger_module
from replayable.ledger import Ledger, Outcome, Revival, RunContext
from replayable.retry import Classified, ErrorKind

pytestmark = pytest.mark.db

DOCS = [f"{i:x}" * 64 for i in range(1, 7)]
DOC = DOCS[0]


def make(database, owner="w1", lease_s=60.0, max_attempts=3, version="1.0", **ctx):
    return Ledger(
        database,
        "extract",
        version,
        "cfg",
        f"spec-{version}",
        RunContext(owner=owner, run_id="r1", **ctx),
        lease_s=lease_s,
        max_attempts=max_attempts,
    )


def status(conn, key="k"):
    found = rows(
        conn,
        "SELECT status, attempts, error_class FROM replayable.stage_runs WHERE item_key = %s",
        key,
    )
    return found[0] if found else None


def finish(database, ledger, *outcomes):
    return database.transaction(lambda conn: ledger.finish(conn, list(outcomes)))


# Current items by (stage or code version, status, error class): from the counters, zero
# entries dropped, and recomputed from the current rows themselves.
_COUNTED = {
    by: (
        f"SELECT {by}, status, error_class, sum(n) FROM replayable.stage_counts"  # noqa: S608
        " GROUP BY 1, 2, 3 HAVING sum(n) <> 0",
        f"SELECT {by}, status, error_class, count(*) FROM replayable.stage_runs"  # noqa: S608
        " WHERE is_current GROUP BY 1, 2, 3",
    )
    for by in ("stage", "code_version")
}


def counts(conn, by="stage"):
    """Current items by (``by``, status, error_class) from the counters."""
    return {(key, state, cls): int(n) for key, state, cls, n in rows(conn, _COUNTED[by][0])}


def recount(conn, by="stage"):
    """The same counts computed from the current rows themselves."""
    return {(key, state, cls or ""): int(n) for key, state, cls, n in rows(conn, _COUNTED[by][1])}


RETRYABLE = Classified("http_503", ErrorKind.RETRYABLE, "503")
TERMINAL = Classified("encrypted", ErrorKind.TERMINAL, "locked")
SYSTEMIC = Classified("http_401", ErrorKind.SYSTEMIC, "no key")


def test_a_claim_registers_new_items_already_leased_in_one_round_trip(conn, database, docs):
    states = make(database).claim([("k", DOC)])
    assert states["k"].mine and states["k"].attempts == 1 and states["k"].lease_live
    assert status(conn, "k") == ("running", 1, None)


def test_a_second_claim_of_a_live_lease_is_not_granted(conn, database, docs):
    make(database, owner="w1").claim([("k", DOC)])
    again = make(database, owner="w2").claim([("k", DOC)])
    assert not again["k"].mine and again["k"].status == "running"
    assert status(conn, "k")[1] == 1


def test_claiming_again_after_a_lost_response_keeps_the_attempt_count(conn, database, docs):
    """A claim retried by the same worker (its first answer lost) takes no second attempt."""
    ledger = make(database)
    ledger.claim([("k", DOC)])
    assert ledger.claim([("k", DOC)])["k"].mine
    assert status(conn, "k")[1] == 1


def test_done_items_are_not_claimed_again(conn, database, docs):
    ledger = make(database)
    ledger.claim([("k", DOC)])
    finish(database, ledger, Outcome.done("k"))
    again = make(database, owner="w2").claim([("k", DOC)])
    assert again["k"].status == "done" and not again["k"].mine


def test_a_new_item_whose_outputs_are_stored_is_registered_done_by_its_claim(conn, database, docs):
    """One write, no lease, no attempt: nothing is left for a worker to do (ADR 0125)."""
    states = make(database).claim([("k", DOC), ("j", DOCS[1])], ready={"k"})
    assert states["k"].status == "done" and not states["k"].mine and not states["k"].lease_live
    assert states["j"].mine and states["j"].status == "running"
    assert rows(
        conn,
        "SELECT status, attempts, lease_owner, lease_expires, started_at, finished_at IS NOT NULL"
        " FROM replayable.stage_runs WHERE item_key = 'k'",
    ) == [("done", 0, None, None, None, True)]
    assert (
        counts(conn)
        == recount(conn)
        == {
            ("extract", "done", ""): 1,
            ("extract", "running", ""): 1,
        }
    )


def test_an_existing_item_found_ready_is_claimed_as_any_other(conn, database, docs):
    """Only a new key is recorded done at the claim; a failed one is leased and processed,
    so its attempts and its dead letter stay the runner's business."""
    ledger = make(database)
    ledger.claim([("k", DOC)])
    finish(database, ledger, Outcome("k", "failed", RETRYABLE))
    again = make(database, owner="w2").claim([("k", DOC)], ready={"k"})
    assert again["k"].mine and again["k"].status == "running"
    assert status(conn, "k") == ("running", 2, "http_503")


def test_an_expired_lease_can_be_taken_over_and_the_old_owner_cannot_finish(conn, database, docs):
    first = make(database, owner="w1", lease_s=0.05)
    first.claim([("k", DOC)])
    import time

    time.sleep(0.1)
    second = make(database, owner="w2")
    taken = second.claim([("k", DOC)])["k"]
    # Taken over unstarted: the attempt is spent when the new holder starts it (ADR 0084).
    assert taken.mine and taken.unstarted and taken.attempts == 1
    assert second.start(["k"]) == {"k": 2}
    assert second.start(["k"]) == {}  # started once only
    states = finish(database, first, Outcome.done("k"))
    assert states["k"].status == "running" and not states["k"].mine
    assert status(conn, "k") == ("running", 2, None)


def test_a_later_try_of_the_same_task_takes_over_its_earlier_try(conn, database, docs):
    """Airflow starts try 2 only after giving up on try 1, so try 2 need not wait for its lease."""
    ctx = {"dag_id": "d", "map_index": 3}
    make(database, owner="try1", try_number=1, **ctx).claim([("k", DOC)])
    second = make(database, owner="try2", try_number=2, **ctx)
    states = second.claim([("k", DOC)])
    assert states["k"].mine and states["k"].unstarted
    assert second.start(["k"]) == {"k": 2}
    other_task = make(database, owner="x", try_number=5, dag_id="d", map_index=4)
    assert not other_task.claim([("k", DOC)])["k"].mine


def test_a_retryable_failure_is_failed_until_the_attempt_cap_then_dead(conn, database, docs):
    ledger = make(database, max_attempts=2)
    ledger.claim([("k", DOC)])
    assert finish(database, ledger, Outcome("k", "failed", RETRYABLE))["k"].status == "failed"
    ledger.claim([("k", DOC)])
    assert finish(database, ledger, Outcome("k", "failed", RETRYABLE, "tb"))["k"].status == "dead"
    assert rows(conn, "SELECT error_class, attempts, traceback FROM replayable.dead_letters") == [
        ("http_503", 2, "tb")
    ]


def test_a_terminal_failure_is_dead_at_once_with_one_open_letter(conn, database, docs):
    ledger = make(database)
    ledger.claim([("k", DOC)])
    assert finish(database, ledger, Outcome("k", "failed", TERMINAL, "tb"))["k"].status == "dead"
    assert rows(conn, "SELECT status, attempts FROM replayable.dead_letters") == [("open", 1)]


def test_releasing_an_item_taken_over_unstarted_gives_back_no_attempt(conn, database, docs):
    make(database, owner="w1", lease_s=0.05).claim([("k", DOC)])
    import time

    time.sleep(0.1)
    second = make(database, owner="w2")
    assert second.claim([("k", DOC)])["k"].unstarted
    finish(database, second, Outcome("k", "release", SYSTEMIC))
    assert status(conn, "k") == ("failed", 1, "http_401")


def test_a_release_gives_the_attempt_back(conn, database, docs):
    ledger = make(database)
    ledger.claim([("k", DOC)])
    finish(database, ledger, Outcome("k", "release", SYSTEMIC))
    assert status(conn, "k") == ("failed", 0, "http_401")
    assert rows(conn, "SELECT count(*) FROM replayable.dead_letters") == [(0,)]


def test_a_revive_reopens_dead_items_with_a_fresh_budget_and_closes_their_letters(
    conn, database, docs
):
    ledger = make(database, max_attempts=1)
    ledger.claim([("k", DOC)])
    finish(database, ledger, Outcome("k", "failed", RETRYABLE))
    assert not ledger.claim([("k", DOC)])["k"].mine
    states = ledger.claim([("k", DOC)], revive=Revival(by="ana", reason="parser fixed"))
    assert states["k"].mine and states["k"].attempts == 1
    assert rows(
        conn, "SELECT status, resolved_by, resolution, note FROM replayable.dead_letters"
    ) == [("redriven", "ana", "parser fixed", None)]
    assert rows(conn, "SELECT actor, action FROM replayable.dead_letter_history") == [
        ("ana", "redriven")
    ]


def test_renewal_returns_only_the_leases_still_held(conn, database, docs):
    ledger = make(database)
    ledger.claim([("a", DOCS[0]), ("b", DOCS[1])])
    finish(database, ledger, Outcome.done("a"))
    assert ledger.renew(["a", "b"]) == {"b"}


def test_a_new_code_version_becomes_the_current_row_and_history_stays(conn, database, docs):
    old = make(database, version="1.0")
    old.claim([("k1", DOC)])
    finish(database, old, Outcome.done("k1"))
    make(database, version="1.1").claim([("k2", DOC)])
    assert rows(
        conn,
        "SELECT item_key, status, is_current FROM replayable.stage_runs ORDER BY item_key",
    ) == [("k1", "done", False), ("k2", "running", True)]
    assert counts(conn) == {("extract", "running", ""): 1}


def test_counters_match_the_current_rows_after_every_kind_of_transition(conn, database, docs):
    ledger = make(database, max_attempts=2)
    ledger.claim([(f"k{i}", d) for i, d in enumerate(DOCS)])
    finish(
        database,
        ledger,
        Outcome.done("k0"),
        Outcome("k1", "failed", RETRYABLE),
        Outcome("k2", "failed", TERMINAL),
        Outcome("k3", "release", SYSTEMIC),
    )
    ledger.renew(["k4", "k5"])
    make(database, version="2.0").claim([("k0-v2", DOCS[0])])
    assert counts(conn) == recount(conn)
    assert counts(conn)[("extract", "running", "")] == 3


def test_concurrent_transitions_keep_the_counters_exact(conn, dsn, docs):
    """Eight workers claim and finish overlapping items at once; the counts stay exact."""
    keys = [(f"k{i}", DOCS[i % len(DOCS)] if i < len(DOCS) else DOCS[0]) for i in range(6)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def worker(n: int) -> None:
        handle = db.Database(dsn)
        try:
            ledger = make(handle, owner=f"w{n}", lease_s=0.01)
            barrier.wait()
            for _ in range(5):
                states = ledger.claim(keys)
                mine = [k for k, s in states.items() if s.mine]
                outcome = "failed" if n % 2 else "done"
                error = RETRYABLE if outcome == "failed" else None
                handle.transaction(
                    lambda c, mine=mine, o=outcome, e=error: ledger.finish(
                        c, [Outcome(k, o, e) for k in mine]
                    )
                )
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)
        finally:
            handle.close()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    assert counts(conn) == recount(conn)
    assert sum(counts(conn).values()) == len(DOCS)


def test_a_transaction_survives_a_dropped_connection(conn, dsn, docs):
    """The server ends the session mid-batch; the ledger reconnects and the claim goes through."""
    handle = db.Database(dsn)
    ledger = make(handle)
    ledger.claim([("a", DOCS[0])])
    pid = handle.conn.get_backend_pid()
    rows(conn, "SELECT pg_terminate_backend(%s)", pid)
    states = ledger.claim([("b", DOCS[1])])
    assert states["b"].mine
    assert handle.conn.get_backend_pid() != pid
    handle.close()


def race_two_code_versions(dsn, rounds: int = 12) -> list[BaseException]:
    """Eight workers, half at code version 1.0 and half at 2.0, claim and finish the same
    documents at once, so each document's current row moves back and forth between the two
    versions' keys; return the errors their claims and finishes raised (each worker goes on)."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def worker(n: int) -> None:
        version = "1.0" if n % 2 else "2.0"
        keys = [(f"{version}-{doc}", doc) for doc in DOCS]
        handle = db.Database(dsn)
        ledger = make(handle, owner=f"w{n}", lease_s=0.01, version=version)
        barrier.wait()
        try:
            for i in range(rounds):
                try:
                    states = ledger.claim(keys)
                    mine = [k for k, s in states.items() if s.mine]
                    outcome = "failed" if (n + i) % 3 == 0 else "done"
                    error = RETRYABLE if outcome == "failed" else None
                    handle.transaction(
                        lambda c, mine=mine, o=outcome, e=error: ledger.finish(
                            c, [Outcome(k, o, e) for k in mine]
                        )
                    )
                except psycopg2.Error as error:
                    errors.append(error)
        finally:
            handle.close()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return errors


def test_runs_of_two_code_versions_racing_for_the_same_documents_keep_the_counters_exact(
    conn, dsn, docs
):
    """The current row of every document moves between two versions' keys under concurrency;
    the counters kept by the triggers still match a recount of the current rows."""
    race_two_code_versions(dsn)
    # Both versions registered a row for every document: the flag had two rows to move between.
    assert rows(
        conn, "SELECT count(DISTINCT code_version), count(*) FROM replayable.stage_runs"
    ) == [(2, 2 * len(DOCS))]
    assert rows(
        conn, "SELECT count(DISTINCT doc_id), count(*) FROM replayable.stage_runs WHERE is_current"
    ) == [(len(DOCS), len(DOCS))]
    assert counts(conn, "code_version") == recount(conn, "code_version")


def test_claims_of_two_code_versions_racing_for_the_same_documents_all_go_through(conn, dsn, docs):
    """A run at a new code version racing one at the old version over the same documents
    claims without errors: neither run's task fails because the other moved the current row."""
    assert race_two_code_versions(dsn) == []


def test_claims_of_two_code_versions_racing_need_no_retry(conn, dsn, docs, monkeypatch):
    """A claim locks its documents in the stage before it moves their current rows, so two
    claims of one document take turns instead of colliding on the current-row index: with no
    retry at all, the race above raises nothing."""
    monkeypatch.setattr(ledger_module, "_CLAIM_RACE_RETRIES", 1)
    assert race_two_code_versions(dsn) == []
