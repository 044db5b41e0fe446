"""Source roots: only allowed folders are listed and read, whatever the path says."""

import glob
import itertools
import os

import pytest

from replayable.airflow.params import source_pattern
from replayable.retry import ItemError
from replayable.sources import SourceError, allowed_roots, check_inside, check_source, find_pdfs


def names(found):
    return sorted(os.path.basename(str(getattr(p, "path", p))) for p in found)


@pytest.fixture
def root(tmp_path):
    folder = tmp_path / "root"
    (folder / "sub").mkdir(parents=True)
    for name in ("a.pdf", "sub/b.PDF", "notes.txt"):
        (folder / name).write_bytes(b"%PDF-1.4")
    return folder


def test_a_folder_a_glob_or_a_file_inside_the_roots(root):
    roots = [str(root)]
    assert names(find_pdfs(str(root), roots)) == ["a.pdf", "b.PDF"]
    assert names(find_pdfs(str(root / "*.pdf"), roots)) == ["a.pdf"]
    assert names(find_pdfs(str(root / "**" / "*.PDF"), roots)) == ["b.PDF"]
    assert names(find_pdfs(str(root / "a.pdf"), roots)) == ["a.pdf"]
    with pytest.raises(SourceError, match="source"):
        list(find_pdfs(str(root / "missing"), roots))


@pytest.mark.parametrize("source", ["/etc", "/", "/home/**/*.pdf", "relative/path"])
def test_a_source_outside_the_roots_is_refused_naming_source(root, source):
    with pytest.raises(SourceError, match="source"):
        list(find_pdfs(source, [str(root)]))


def test_dot_dot_cannot_climb_out_of_a_root(root):
    with pytest.raises(SourceError, match="outside"):
        check_source(str(root / ".." / ".."), [str(root)])


def test_symlinks_are_not_followed_out_of_a_root(root, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.pdf").write_bytes(b"%PDF-1.4")
    (root / "link.pdf").symlink_to(outside / "secret.pdf")
    (root / "linkdir").symlink_to(outside, target_is_directory=True)
    assert names(find_pdfs(str(root), [str(root)])) == ["a.pdf", "b.PDF"]
    assert names(find_pdfs(str(root / "*.pdf"), [str(root)])) == ["a.pdf"]
    with pytest.raises(ItemError, match="outside"):
        check_inside(root / "link.pdf", [str(root)])


def test_roots_come_from_the_environment_and_the_project(monkeypatch, tmp_path):
    monkeypatch.setenv("REPLAYABLE_SOURCE_ROOTS", f"{tmp_path}{os.pathsep}")
    roots = allowed_roots()
    assert roots[0].endswith("data") and str(tmp_path.resolve()) in roots


@pytest.mark.parametrize(
    ("source", "ok"),
    [
        ("/srv/pdfs", True),
        ("/srv/pdfs/a/**/*.pdf", True),
        ("/srv/pdfs2", False),
        ("/srv/pdfs/../etc", False),
        ("/etc", False),
        ("/srv/pdfs/..", False),
    ],
)
def test_the_trigger_time_pattern_matches_paths_inside_the_roots(source, ok):
    import re

    assert bool(re.search(source_pattern(["/srv/pdfs"]), source)) is ok


def test_a_glob_does_not_descend_directory_links_so_a_link_loop_ends(root):
    """Two links back to their own folder make a recursive glob finite: each file once."""
    (root / "a").symlink_to(".", target_is_directory=True)
    (root / "sub" / "b").symlink_to("..", target_is_directory=True)
    found = list(itertools.islice(find_pdfs(str(root / "**" / "*.pdf"), [str(root)]), 50))
    assert sorted(os.path.relpath(str(getattr(p, "path", p)), root) for p in found) == ["a.pdf"]


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("**/*.pdf", ["a.pdf", "sub/deeper/d.pdf", "sub/c.pdf"]),
        ("*.pdf", ["a.pdf"]),
        ("*/*.pdf", ["sub/c.pdf"]),
        ("sub/**/*.pdf", ["sub/c.pdf", "sub/deeper/d.pdf"]),
        ("**/[cd].pdf", ["sub/c.pdf", "sub/deeper/d.pdf"]),
        ("s?b/*.PDF", ["sub/b.PDF"]),
        ("**", ["a.pdf", "notes.txt", "sub/b.PDF", "sub/c.pdf", "sub/deeper/d.pdf"]),
        (".hidden/*.pdf", [".hidden/h.pdf"]),
    ],
)
def test_globs_match_as_recursive_glob_does(root, pattern, expected):
    """Wildcards stay inside one path component, ** spans any number, dotfiles need a dot."""
    for name in ("sub/c.pdf", "sub/deeper/d.pdf", ".hidden/h.pdf"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"%PDF-1.4")
    found = find_pdfs(str(root / pattern), [str(root)])
    got = sorted(os.path.relpath(str(getattr(p, "path", p)), root) for p in found)
    assert got == sorted(expected)
    legacy = glob.glob(str(root / pattern), recursive=True)
    assert got == sorted(os.path.relpath(p, root) for p in legacy if os.path.isfile(p))
