"""Text taken from documents, made safe to show on a terminal.

A file name, an error message or a note can carry terminal escape sequences: OSC 52 writes the
operator's clipboard, CSI sequences move the cursor, clear the screen or recolour what
follows, so a crafted PDF name could fake the CLI's output. :func:`for_terminal` replaces
every escape sequence (7-bit and 8-bit: CSI, OSC, DCS, SOS, PM, APC, and the short ones),
every remaining C0 or C1 control character and every bidirectional override or isolate with
one visible U+FFFD, so that the operator sees that something was there. JSON output needs no
stripping: ``json.dumps`` escapes all of these (``\\u001b``) when ``ensure_ascii`` is on.
"""

from __future__ import annotations

import re

REPLACEMENT = "\ufffd"

_STRING_END = r"(?:\x07|\x1b\\|\x9c|$)"  # BEL, ST (7- or 8-bit), or the end of the text
_ESCAPES = re.compile(
    "|".join(
        (
            rf"\x1b\][^\x07\x1b\x9c]*{_STRING_END}",  # OSC, e.g. OSC 52 (clipboard), OSC 8
            rf"\x1b[PX^_][^\x07\x1b\x9c]*{_STRING_END}",  # DCS, SOS, PM, APC strings
            r"\x1b\[[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?",  # CSI: cursor, erase, colour
            r"\x1b[\x20-\x2f]*[\x30-\x7e]?",  # every other escape (and a lone ESC)
            rf"\x9d[^\x07\x1b\x9c]*{_STRING_END}",  # 8-bit OSC
            rf"[\x90\x98\x9e\x9f][^\x07\x1b\x9c]*{_STRING_END}",  # 8-bit DCS, SOS, PM, APC
            r"\x9b[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?",  # 8-bit CSI
        )
    ),
    re.S,
)
# C0 (tab and line breaks included: every field is shown on one line), DEL, C1, and the
# bidirectional controls that reorder what follows them on the line.
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def for_terminal(text: str) -> str:
    """``text`` with every escape sequence and control character replaced by U+FFFD."""
    return _CONTROLS.sub(REPLACEMENT, _ESCAPES.sub(REPLACEMENT, text))
