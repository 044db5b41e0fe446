"""Migration file names: one number each, applied in the order their names sort.

A database records the migrations it applied by file name (``schema_migrations``), so a
file that takes a new number is listed in ``db.RENAMED_MIGRATIONS`` under its old name
(ADR 0158). ``db._migrations`` applies the files in name order; these tests keep that order
the intended one: every name is a four-digit number and a name, the numbers run from 0001
without a gap or a repeat, and so a new migration can only be the next number.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

import pytest

from helpers import ROOT
from replayable import db

MIGRATIONS = ROOT / "include" / "replayable" / "sql" / "migrations"
NAME = re.compile(r"(?P<number>\d{4})_[a-z0-9]+(?:_[a-z0-9]+)*\.sql")


def _problems(names: Iterable[str]) -> list[str]:
    """What is wrong with a folder of migration file names; empty when nothing is."""
    names = sorted(names)
    problems = [f"{name}: not NNNN_snake_case.sql" for name in names if not NAME.fullmatch(name)]
    numbers = [match["number"] for name in names if (match := NAME.fullmatch(name))]
    for number, count in sorted(Counter(numbers).items()):
        sharing = tuple(name for name in names if name.startswith(f"{number}_"))
        if count > 1:
            problems.append(f"{number} is shared by {', '.join(sharing)}")
    expected = [f"{n:04d}" for n in range(1, len(set(numbers)) + 1)]
    if sorted(set(numbers)) != expected:
        problems.append(f"numbers {sorted(set(numbers))} do not run 0001, 0002, … without a gap")
    return problems


def test_the_migrations_folder_has_one_number_per_migration_and_no_gap():
    names = [path.name for path in MIGRATIONS.iterdir() if path.suffix == ".sql"]
    assert names, f"no migrations found in {MIGRATIONS}"
    problems = _problems(names)
    assert not problems, "; ".join(problems)


def test_migrations_apply_in_the_order_of_their_names():
    versions = [version for version, _ in db._migrations()]
    assert versions == sorted(path.stem for path in MIGRATIONS.glob("*.sql"))


def test_a_renamed_migration_names_a_file_and_its_old_name_none():
    versions = {version for version, _ in db._migrations()}
    for old, new in db.RENAMED_MIGRATIONS.items():
        assert new in versions and old not in versions


def test_a_database_that_recorded_an_old_name_does_not_apply_the_migration_again(conn):
    """0031_request_rates was 0003_request_rates (ADR 0158): a ledger migrated before the
    rename records the old name, and is up to date."""
    with conn.cursor() as cur:
        cur.execute(
            "UPDATE replayable.schema_migrations SET version = '0003_request_rates'"
            " WHERE version = '0031_request_rates'"
        )
    conn.commit()
    try:
        assert db.migrate(conn) == []
        with conn.cursor() as cur:
            cur.execute(
                "SELECT version FROM replayable.schema_migrations WHERE version LIKE %s",
                ("%_request_rates",),
            )
            assert cur.fetchall() == [("0003_request_rates",)]
    finally:
        with conn.cursor() as cur:
            cur.execute(
                "DELETE FROM replayable.schema_migrations WHERE version = '0003_request_rates'"
            )
            cur.execute(
                "INSERT INTO replayable.schema_migrations (version)"
                " VALUES ('0031_request_rates') ON CONFLICT DO NOTHING"
            )
        conn.commit()


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ("0004_another_outbox.sql", "0004 is shared by 0004_another_outbox.sql, 0004_outbox.sql"),
        ("0003_third.sql", "0003 is shared by 0003_dead_letter_history.sql, 0003_third.sql"),
        ("0099_after_a_gap.sql", "without a gap"),
        ("9_short.sql", "9_short.sql: not NNNN_snake_case.sql"),
        ("0009-Dashes.sql", "0009-Dashes.sql: not NNNN_snake_case.sql"),
    ],
)
def test_a_new_migration_that_breaks_the_order_is_refused(extra, problem):
    names = [path.name for path in MIGRATIONS.glob("*.sql")]
    assert any(problem in found for found in _problems([*names, extra]))


def test_the_next_number_is_accepted():
    names = [path.name for path in MIGRATIONS.glob("*.sql")]
    last = max(int(name[:4]) for name in names)
    assert _problems([*names, f"{last + 1:04d}_next.sql"]) == []
