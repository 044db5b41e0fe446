"""for_terminal: no escape sequence or control character from a document reaches a terminal."""

import pytest

from replayable.terminal import REPLACEMENT, for_terminal

OSC52 = "\x1b]52;c;ZWNobyBwd25lZA==\x07"  # writes "echo pwned" to the clipboard
DANGEROUS = [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0))] + [
    "\u061c",
    "\u200e",
    "\u200f",
    *map(chr, range(0x202A, 0x202F)),
    *map(chr, range(0x2066, 0x206A)),
]


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (f"a{OSC52}b.pdf", "a�b.pdf"),
        ("a\x1b]52;c;ZXZpbA==\x1b\\b", "a�b"),  # OSC ended by ST
        ("a\x1b]8;;http://evil.example\x07link\x1b]8;;\x07", "a�link�"),  # OSC 8 hyperlink
        ("a\x1b]0;unterminated title", "a�"),
        ("\x1b[2J\x1b[1;1Hclean", "��clean"),  # clear the screen, move home
        ("\x1b[31mred\x1b[0m", "�red�"),
        ("\x1bPq#0;2;0;0;0\x1b\\x", "�x"),  # DCS (sixel)
        ("\x1b_apc\x1b\\x", "�x"),
        ("\x1b7saved\x1b8", "�saved�"),
        ("\x9b2Jx", "�x"),  # 8-bit CSI
        ("\x9d52;c;ZXZpbA==\x9cx", "�x"),  # 8-bit OSC and ST
        ("name\u202etxt.exe", "name�txt.exe"),  # right-to-left override
        ("line\nbreak\ttab\rreturn\x08back", "line�break�tab�return�back"),
        ("a lone ESC at the end\x1b", "a lone ESC at the end�"),
        ("plain ünïcödé \u2013 fine.pdf", "plain ünïcödé \u2013 fine.pdf"),
    ],
)
def test_escape_sequences_and_controls_become_one_visible_mark(text, shown):
    assert for_terminal(text) == shown


@pytest.mark.parametrize("char", DANGEROUS)
def test_no_control_character_survives(char):
    assert for_terminal(f"x{char}y") in (f"x{REPLACEMENT}y", f"x{REPLACEMENT}")
