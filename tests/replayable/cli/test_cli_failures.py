"""``replayable failed`` and ``dead-letters``, and text from hostile files kept harmless."""

import json

import pytest
from cli_ledger import A, B, fill_ledger, run_json

from replayable.cli import main


@pytest.fixture
def ledger(conn):
    """A, B and C in a few stages and runs: r1 touched A and B, r2 touched C."""
    fill_ledger(conn)


def test_failed_lists_only_items_whose_current_status_is_failed(ledger, dsn, capsys):
    items = run_json(capsys, dsn, "failed")["items"]
    assert sorted((i["stage"], i["doc_id"]) for i in items) == [("embed", A), ("extract", B)]
    only_429 = run_json(capsys, dsn, "failed", "--error-class", "http_429")["items"]
    assert [(i["stage"], i["error_class"]) for i in only_429] == [("embed", "http_429")]


def test_failed_table_prints_error_text_literally(ledger, dsn, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["--dsn", dsn, "failed", "--stage", "embed"]) == 0
    out = capsys.readouterr().out
    assert "429 [slow] down" in out
    assert "aaaaaaaaaaaa " in out and "a.pdf" in out


def test_dead_letters_lists_open_ones_by_default(ledger, dsn, capsys):
    letters = run_json(capsys, dsn, "dead-letters")["dead_letters"]
    assert [(d["stage"], d["status"], d["owner"]) for d in letters] == [
        ("extract", "open", "alice")
    ]
    every = run_json(capsys, dsn, "dead-letters", "--status", "all")
    assert every["matched"] == 2


# A file name that, printed raw, writes the clipboard (OSC 52), clears the screen and moves the
# cursor (CSI), recolours what follows, and reverses the rest of the line (RLO).
HOSTILE_NAME = (
    "\x1b]52;c;ZWNobyBwd25lZA==\x07inv\x1b[2J\x1b[1;1H\x1b[31moice\u202efdp.exe\x9b0m.pdf"
)
HOSTILE_ERROR = "bad \x1b]8;;http://evil.example\x07link\x1b]8;;\x07 \x1b[1A\x1b[2Kdone"
RAW = ("\x1b", "\x07", "\x9b", "\u202e")


@pytest.fixture
def hostile(conn, tmp_path):
    """A real file with a hostile name, discovered into the ledger, failed and dead-lettered."""
    from replayable.pipeline import discover

    (tmp_path / HOSTILE_NAME).write_bytes(b"%PDF-1.4 not really")
    found = discover(
        conn, str(tmp_path), dag_id="d", run_id="r1", roots=[str(tmp_path)], max_bytes=2**20
    )
    assert found == 1
    with conn.cursor() as cur:
        cur.execute("SELECT doc_id, uri FROM replayable.documents")
        doc_id, uri = cur.fetchone()
        assert uri.endswith(HOSTILE_NAME)
        cur.execute(
            "INSERT INTO replayable.stage_runs (stage, item_key, doc_id, status, attempts,"
            " error_class, last_error, code_version, config_hash, run_id, is_current)"
            " VALUES ('extract', 'k', %s, 'failed', 1, 'http_503', %s, '1', 'c', %s, true)",
            (doc_id, HOSTILE_ERROR, "run\x1b[8m"),
        )
        cur.execute(
            "INSERT INTO replayable.dead_letters (stage, item_key, doc_id, error_class,"
            " error_kind, error, attempts, code_version, run_id, owner, note)"
            " VALUES ('embed', 'k', %s, 'http_400', 'terminal', %s, 1, '1', 'r1', %s, %s)",
            (doc_id, HOSTILE_ERROR, "\u202eecila", HOSTILE_ERROR),
        )
    conn.commit()
    return uri


@pytest.mark.parametrize("command", ["failed", "dead-letters"])
def test_tables_print_no_escape_sequence_from_a_hostile_file_name(
    hostile, dsn, capsys, monkeypatch, command
):
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["--dsn", dsn, command]) == 0
    captured = capsys.readouterr()
    for raw in RAW:
        assert raw not in captured.out + captured.err, repr(raw)
    assert "inv" in captured.out and "oice" in captured.out and "\ufffd" in captured.out


@pytest.mark.parametrize("command", ["failed", "dead-letters"])
def test_json_escapes_them_and_keeps_the_text_exact(hostile, dsn, capsys, command):
    assert main(["--dsn", dsn, "--json", command]) == 0
    out = capsys.readouterr().out
    for raw in RAW:
        assert raw not in out, repr(raw)
    assert "\\u001b]52;c;" in out
    data = json.loads(out)
    rows = data["items"] if command == "failed" else data["dead_letters"]
    assert [row["uri"] for row in rows] == [hostile]
    assert HOSTILE_ERROR in {row.get("last_error") or row.get("error") for row in rows}
