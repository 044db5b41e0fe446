"""The README's code map names every module and folder of the library, and nothing that is gone."""

from __future__ import annotations

import re

from helpers import ROOT

PACKAGE = ROOT / "include" / "replayable"


def _code_map() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Code map")
    return text[start : text.index("\n## ", start + 1)]


def _library_rows() -> set[str]:
    """The names in the first column of the rows inside the library."""
    rows = [line for line in _code_map().splitlines() if line.startswith("| `")]
    first = [row.split("|")[1] for row in rows]
    start = next(i for i, cell in enumerate(first) if "`include/replayable/`" in cell)
    end = next(i for i, cell in enumerate(first) if "`devtools/`" in cell)
    return {name for cell in first[start + 1 : end] for name in re.findall(r"`([^`]+)`", cell)}


def test_every_module_and_folder_of_the_library_is_on_the_code_map():
    on_disk = {
        path.name + ("/" if path.is_dir() else "")
        for path in PACKAGE.iterdir()
        if not path.name.startswith(("_", "."))
        and (path.suffix == ".py" or (path.is_dir() and path.name != "templates"))
    }
    assert sorted(on_disk - _library_rows()) == [], "add them to the README's code map"


def test_everything_on_the_code_map_exists():
    for name in _library_rows():
        assert (PACKAGE / name).exists(), f"the README's code map names {name}, which is gone"
    for cell in re.findall(r"^\| (`[^|]+)\|", _code_map(), flags=re.MULTILINE):
        for name in re.findall(r"`([^`]+/)`", cell):
            assert (ROOT / name).exists() or (PACKAGE / name).exists(), name
