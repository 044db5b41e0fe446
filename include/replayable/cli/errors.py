"""The one error a command raises for the person at the terminal to fix."""

from __future__ import annotations


class UsageError(Exception):
    """A problem the person at the terminal can fix; ``main`` prints it and exits 2."""
