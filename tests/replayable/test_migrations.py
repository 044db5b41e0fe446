"""Migration file names: one number each, applied in the order their names sort.

A database records the migrations it applied by file name (``schema_migrations``), so a
file is never renamed. ``db._migrations`` applies the files in name order; these tests keep
that order the intended one: every name is a four-digit number and a name, the numbers run
from 0001 without a gap or a repeat, and so a new migration can only be the next number.
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
# Two branches each added a 0003 before they were merged; databases have recorded both
# names, so they stay. No other number may repeat.
KNOWN_DUPLICATES = {"0003": ("0003_dead_letter_history.sql", "0003_request_rates.sql")}


def _problems(names: Iterable[str]) -> list[str]:
    """What is wrong with a folder of migration file names; empty when nothing is."""
    names = sorted(names)
    problems = [f"{name}: not NNNN_snake_case.sql" for name in names if not NAME.fullmatch(name)]
    numbers = [match["number"] for name in names if (match := NAME.fullmatch(name))]
    for number, count in sorted(Counter(numbers).items()):
        sharing = tuple(name for name in names if name.startswith(f"{number}_"))
        if count > 1 and KNOWN_DUPLICATES.get(number) != sharing:
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
    """The 0003 pair applies as existing databases recorded it, dead-letter history first."""
    versions = [version for version, _ in db._migrations()]
    assert versions == sorted(path.stem for path in MIGRATIONS.glob("*.sql"))
    assert versions.index("0003_dead_letter_history") + 1 == versions.index("0003_request_rates")
    assert versions[-1] > "0003_request_rates"


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ("0004_another_outbox.sql", "0004 is shared by 0004_another_outbox.sql, 0004_outbox.sql"),
        ("0003_third.sql", "0003 is shared by"),
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
