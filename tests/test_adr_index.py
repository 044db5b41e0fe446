"""docs/adr/README.md indexes every decision note once, each with a status."""

from __future__ import annotations

import re

from helpers import ROOT

ADR = ROOT / "docs" / "adr"
INDEX = ADR / "README.md"
# A row of the index: | [0083](0083-a-redrive-selects-without-closing.md) | title | status |
ROW = re.compile(
    r"^\|\s*\[(?P<number>\d{4})\]\((?P<file>[^)]+)\)\s*\|[^|]+\|(?P<status>[^|]+)\|\s*$"
)
STATUS = re.compile(r"(accepted|amended by|superseded by)\b")


def _rows() -> list[re.Match[str]]:
    return [row for line in INDEX.read_text().splitlines() if (row := ROW.match(line))]


def test_every_adr_file_is_listed_in_the_index_once():
    listed = [row["file"] for row in _rows()]
    files = sorted(path.name for path in ADR.glob("[0-9][0-9][0-9][0-9]-*.md"))
    assert files, f"no ADRs found in {ADR}"
    assert sorted(set(listed)) == sorted(listed), "an ADR is listed twice"
    assert sorted(set(files) - set(listed)) == [], "ADRs missing from docs/adr/README.md"


def test_every_file_the_index_lists_exists_under_its_number():
    for row in _rows():
        assert (ADR / row["file"]).is_file(), f"{row['file']} is listed but does not exist"
        assert row["file"].startswith(f"{row['number']}-"), row.group(0)


def test_every_listed_adr_has_a_status_naming_only_later_adrs():
    numbers = {row["number"] for row in _rows()}
    for row in _rows():
        status = row["status"].strip()
        assert STATUS.match(status), f"{row['number']}: status {status!r}"
        for later in re.findall(r"\b\d{4}\b", status):
            assert later in numbers, f"{row['number']}: {status!r} names an unknown ADR"
            assert later > row["number"], f"{row['number']}: {status!r} names an earlier ADR"
