"""What the tests share that is not a fixture: paths, the ledger's test helpers, the session's
process bookkeeping.

Fixtures live in the ``conftest.py`` of the folder whose tests use them; a test imports
plain functions and constants from here (``from helpers import ROOT``), never from a conftest.
"""

from __future__ import annotations

from pathlib import Path

# The repository's root: tests/ is one level below it.
ROOT = Path(__file__).resolve().parents[2]
