"""The real-world PDF corpus as a session fixture, shared by stage and end-to-end tests.

A test module names this module in ``pytest_plugins`` and asks for ``realworld_corpus``;
the corpus is built once per session under pytest's temporary folder.
"""

from __future__ import annotations

import pytest

import realworld

INSTALL_HINT = "run tests/install-realworld-tools.sh (packages: tests/realworld-packages.txt)"


@pytest.fixture(scope="session")
def realworld_corpus(tmp_path_factory: pytest.TempPathFactory) -> realworld.Manifest:
    """The corpus folder and its manifest; skips only when no producer is available at all."""
    manifest = realworld.build(tmp_path_factory.mktemp("realworld"))
    if manifest.all_skipped:
        reasons = "; ".join(f"{p.name}: {p.detail}" for p in manifest.producers)
        pytest.skip(f"no real-world PDF producer is available ({reasons}); {INSTALL_HINT}")
    return manifest
