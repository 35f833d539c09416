"""Text from rows made safe for where it is shown: the terminal, figures and (see ``html``) the page.

A results file may come from anywhere, so a case name may hold escape sequences that would rewrite
the terminal, mathtext that matplotlib would try to typeset, or a megabyte of text no figure can lay
out. Every label from a row passes through here before it is printed or drawn.
"""

from __future__ import annotations

import re

#: Characters shown as escapes on the terminal: C0 and C1 controls (ESC starts ANSI sequences), DEL,
#: and the bidirectional overrides and isolates that reorder what follows them.
_CONTROLS = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
#: The longest label a figure draws: longer ones are cut, keeping their start and end.
FIGURE_LABEL_CHARS = 80


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str) -> str:
    """``text`` with every control character but the newline shown as an escape (``\\x1b``)."""
    return _CONTROLS.sub(_escape, text)


def one_line_safe(text: str) -> str:
    """``text`` on one line, newlines included shown as escapes (for a label inside a line)."""
    return terminal_safe(text).replace("\n", "\\n")


def shortened(text: str, limit: int = FIGURE_LABEL_CHARS) -> str:
    """``text`` cut to at most ``limit`` characters, keeping its start and end around an ellipsis."""
    if len(text) <= limit:
        return text
    head = (limit - 1) * 2 // 3
    return f"{text[:head]}…{text[len(text) - (limit - 1 - head) :]}"


def figure_label(text: str, limit: int = FIGURE_LABEL_CHARS) -> str:
    """A label for a figure: one line, no control characters, at most ``limit`` characters (matplotlib's
    mathtext is off for every figure, see ``plots.drawing``, so ``$`` is drawn as it is)."""
    return shortened(one_line_safe(text), limit)


__all__ = ["FIGURE_LABEL_CHARS", "figure_label", "one_line_safe", "shortened", "terminal_safe"]
