"""Text that reaches a terminal: what came from outside is made harmless before it is printed.

Names and messages from an API answer, a kubelet, a checkpoint or the user's own flags can carry
escape sequences that move the cursor, retitle the window, rewrite what is already on screen or hide
text (ANSI CSI/OSC sequences, C0/C1 control characters, Unicode direction overrides). `printable`
drops them; `shown` also clips a value to a length a one-line message can carry.
"""

from __future__ import annotations

import re

# ESC-introduced sequences first (CSI `ESC [ ... final`, OSC/DCS/APC/PM/SOS strings up to BEL or ST,
# two-character escapes), so their parameters go with them; then any control character left: C0
# (tab and newline too: a value is printed on one line), DEL, C1, and the bidirectional overrides and
# isolates that make a terminal show text in another order than it is.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x9b[0-?]*[ -/]*[@-~]"
    r"|\x1b[ -/]*[0-~]?"
)
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: object) -> str:
    """`text` as a string without escape sequences or control characters."""
    s = text if isinstance(text, str) else str(text)
    if s.isprintable():  # the common case: nothing to do
        return s
    return _CONTROLS.sub("", _ESCAPES.sub("", s))


def shown(text: object, limit: int = 80) -> str:
    """`printable(text)` clipped to about `limit` characters, saying how long it was."""
    s = printable(text)
    if len(s) <= limit:
        return s
    return f"{s[: limit - 20]}... ({len(s)} characters)"
