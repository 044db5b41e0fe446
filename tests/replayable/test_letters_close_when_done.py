"""A document done in a stage has no open letter there, whatever path made it done (ADR 0132).

Every case starts from a document that died in embed under one key (its letter open) and
then meets embed again under another key: a new code version, with or without a revive, with
its vectors already stored (the claim's "ready" path, ADR 0125) or not.
"""

import pytest

from checks import rows
from helpers.ledger import register_documents
from replayable.ledger import Ledger, Outcome, Revival, RunContext
from replayable.retry import Classified, ErrorKind

pytestmark = pytest.mark.db

DOC = "d" * 64
OTHER = "e" * 64
TERMINAL = Classified("http_400", ErrorKind.TERMINAL, "bad input")


@pytest.fixture(autouse=True)
def _docs(conn):
    register_documents(conn, [DOC, OTHER])


def embed(database, version, *, run_id="r1", last=True):
    return Ledger(
        database,
        "embed",
        version,
        "cfg",
        f"spec-{version}",
        RunContext(owner=f"w-{run_id}", dag_id="d", run_id=run_id),
        announce_ready={"embed": version} if last else None,
    )


def died_under_v1(database):
    old = embed(database, "1")
    old.claim([("k1", DOC)])
    database.transaction(lambda c: old.finish(c, [Outcome("k1", "failed", TERMINAL)]))


def letters(conn):
    return rows(
        conn,
        "SELECT item_key, status, resolved_by, resolved_run_id FROM replayable.dead_letters"
        " ORDER BY id",
    )


def current(conn):
    return rows(
        conn,
        "SELECT item_key, status FROM replayable.stage_runs WHERE stage = 'embed'"
        " AND doc_id = %s AND is_current",
        DOC,
    )


def test_a_revive_that_finds_the_new_key_ready_closes_the_letter(conn, database):
    died_under_v1(database)
    states = embed(database, "2", run_id="rd").claim(
        [("k2", DOC)], revive=Revival(by="ana", reason="provider fixed"), ready={"k2"}
    )
    assert states["k2"].status == "done" and not states["k2"].mine
    assert current(conn) == [("k2", "done")]
    assert letters(conn) == [("k1", "redriven", "ana", "rd")]


def test_a_plain_run_that_finds_the_new_key_ready_closes_the_letter(conn, database):
    died_under_v1(database)
    embed(database, "2", run_id="r2").claim([("k2", DOC)], ready={"k2"})
    assert current(conn) == [("k2", "done")]
    assert letters(conn) == [("k1", "redriven", "rerun", "r2")]
    (resolution,) = rows(conn, "SELECT resolution FROM replayable.dead_letters")[0]
    assert resolution.startswith("superseded") and "k2" in resolution


def test_a_plain_run_under_a_new_version_closes_the_letter_when_it_takes_the_new_key(
    conn, database
):
    died_under_v1(database)
    run = embed(database, "2", run_id="r2")
    assert run.claim([("k2", DOC)])["k2"].mine
    assert letters(conn) == [("k1", "redriven", "rerun", "r2")]
    database.transaction(lambda c: run.finish(c, [Outcome.done("k2")]))
    assert current(conn) == [("k2", "done")]
    assert rows(conn, "SELECT count(*) FROM replayable.dead_letters WHERE status = 'open'") == [
        (0,)
    ]


def test_a_new_key_that_dies_too_leaves_one_open_letter_its_own(conn, database):
    died_under_v1(database)
    run = embed(database, "2", run_id="r2")
    run.claim([("k2", DOC)])
    database.transaction(lambda c: run.finish(c, [Outcome("k2", "failed", TERMINAL)]))
    assert current(conn) == [("k2", "dead")]
    assert rows(conn, "SELECT item_key FROM replayable.dead_letters WHERE status = 'open'") == [
        ("k2",)
    ]


def test_a_finish_done_closes_a_letter_opened_for_another_key_meanwhile(conn, database):
    """A letter of an older key that the claim could not see (opened after it) is closed too."""
    run = embed(database, "2", run_id="r2")
    run.claim([("k2", DOC)])
    # Meanwhile a letter for an older key of the document was opened (say, restored by hand).
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO replayable.dead_letters (stage, item_key, doc_id, error_class,"
            " error_kind, error, attempts, code_version)"
            " VALUES ('embed', 'k1', %s, 'http_400', 'terminal', 'bad input', 1, '1')",
            (DOC,),
        )
    conn.commit()
    database.transaction(lambda c: run.finish(c, [Outcome.done("k2")]))
    assert letters(conn) == [("k1", "redriven", "rerun", "r2")]


def test_a_version_that_comes_back_to_a_done_key_closes_the_newer_keys_letter(conn, database):
    first = embed(database, "1")
    first.claim([("k1", DOC)])
    database.transaction(lambda c: first.finish(c, [Outcome.done("k1")]))
    second = embed(database, "2", run_id="r2")
    second.claim([("k2", DOC)])
    database.transaction(lambda c: second.finish(c, [Outcome("k2", "failed", TERMINAL)]))
    # Version 2 is rolled back: version 1's key, done, is the document's current item again.
    embed(database, "1", run_id="r3").claim([("k1", DOC)])
    assert current(conn) == [("k1", "done")]
    assert letters(conn) == [("k2", "redriven", "rerun", "r3")]


def test_a_run_that_comes_back_to_a_dead_key_gives_the_document_its_letter_again(conn, database):
    """Died under version 1, then under version 2 (whose letter replaced the first), then a
    run under version 1 again, which does not revive: the document's current item is the
    dead k1, and its one open letter is k1's again, with its error, announced once more.
    The simulation found this mix (seed 2: two settings over one poisoned document)."""
    died_under_v1(database)
    second = embed(database, "2", run_id="r2")
    second.claim([("k2", DOC)])
    database.transaction(lambda c: second.finish(c, [Outcome("k2", "failed", TERMINAL)]))
    states = embed(database, "1", run_id="r3").claim([("k1", DOC)])
    assert states["k1"].status == "dead" and not states["k1"].mine
    assert current(conn) == [("k1", "dead")]
    open_letters = rows(
        conn,
        "SELECT item_key, error_class, error FROM replayable.dead_letters WHERE status = 'open'",
    )
    assert open_letters == [("k1", "http_400", "bad input")]
    assert rows(
        conn,
        "SELECT count(*) FROM replayable.outbox WHERE event_type = 'document.failed'",
    ) == [(3,)]


def test_closing_a_letter_announces_the_document_once_and_nothing_else(conn, database):
    died_under_v1(database)
    for _ in range(2):  # the claim runs twice (a task retry): the same end state
        embed(database, "2", run_id="r2").claim([("k2", DOC)], ready={"k2"})
    assert rows(conn, "SELECT event_type FROM replayable.outbox ORDER BY event_type") == [
        ("document.failed",),
        ("document.ready",),
    ]
    assert rows(
        conn,
        "SELECT action, actor FROM replayable.dead_letter_history ORDER BY id",
    ) == [("redriven", "rerun")]


def test_other_documents_letters_stay_open(conn, database):
    other = embed(database, "1")
    other.claim([("o1", OTHER)])
    database.transaction(lambda c: other.finish(c, [Outcome("o1", "failed", TERMINAL)]))
    died_under_v1(database)
    embed(database, "2", run_id="r2").claim([("k2", DOC)], ready={"k2"})
    assert rows(conn, "SELECT item_key, status FROM replayable.dead_letters ORDER BY item_key") == [
        ("k1", "redriven"),
        ("o1", "open"),
    ]
