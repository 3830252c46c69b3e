"""Durations as users write them (`90s`, `10m`, `2h`, `1h30m`, `500ms`) <-> milliseconds.

Hand-written on purpose: these are the Go/Prometheus-style durations operators type in kubectl and
PromQL. pydantic's timedelta takes ISO 8601 (`PT90S`) or `[-][DD]D[,][HH:MM:]SS`, not `1h30m`, and
the small parsers on PyPI differ on `m` (minutes or months) and on `ms`; twenty lines are cheaper to
keep exact than a dependency to pin and wrap.
"""

from __future__ import annotations

import re

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
# A century. Nothing Periscope measures or keeps is longer, a longer value is a typo, and bounding it
# keeps every sum and difference of times far inside what a 64-bit integer (Kafka's timestamps, the
# protobuf fields) and a datetime can hold.
MAX_DURATION_MS = 36_500 * 86_400_000
_MAX_TEXT = 64  # characters: `1h30m15s500ms` is 13; a longer text is not a duration anyone typed


def _clip(text: str) -> str:
    """`text` quoted for an error message, in at most about 70 characters whatever it holds (repr writes
    a character outside the basic plane or a control character as up to ten)."""
    shown = repr(text)
    if len(shown) <= 42:
        return shown
    head = text[:30]
    while len(repr(head)) > 40:
        head = head[:-1]
    return f"{head!r}... ({len(text)} characters)"


def parse_duration_ms(text: str) -> int:
    """Parse a duration of at most MAX_DURATION_MS; raise ValueError with a readable message (quoting
    at most the first 30 characters of the text) when it is not one."""
    s = text.strip().lower()
    if not s:
        raise ValueError("empty duration")
    if len(s) > _MAX_TEXT:  # bounded, so no float below overflows
        raise ValueError(f"not a duration: {_clip(text)} (longer than {_MAX_TEXT} characters)")
    pos, total = 0, 0.0
    for m in _PART.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_MS[m.group(2)]
        pos = m.end()
    if pos != len(s):
        raise ValueError(f"not a duration: {_clip(text)} (use e.g. 90s, 10m, 2h)")
    if total > MAX_DURATION_MS:
        raise ValueError(f"too long: {_clip(text)} (at most {MAX_DURATION_MS // 86_400_000}d)")
    return round(total)


def format_duration_ms(ms: int) -> str:
    if ms % 3_600_000 == 0 and ms:
        return f"{ms // 3_600_000}h"
    if ms % 60_000 == 0 and ms:
        return f"{ms // 60_000}m"
    if ms % 1000 == 0:
        return f"{ms // 1000}s"
    return f"{ms}ms"
