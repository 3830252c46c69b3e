"""Query values users type: instants and durations, checked to a 400 with the parameter's name.

Anything that parses but cannot be true or rendered (a 400-digit duration, an instant outside years
1..9999 once its offset is applied) is a bad query too, never an error inside the handler: every time the
API writes back is RFC 3339 UTC, so an instant it could not write is refused on the way in.
"""

from __future__ import annotations

from periscope.core.duration import parse_duration_ms
from periscope.wirejson import parse_time_ms
from services.api.errors import ApiError

# The instants RFC 3339 can write: 0001-01-01T00:00:00.000Z .. 9999-12-31T23:59:59.999Z (Unix ms).
MIN_INSTANT_MS = -62_135_596_800_000
MAX_INSTANT_MS = 253_402_300_799_999
MAX_DURATION_MS = 100 * 366 * 86_400_000  # a century: longer than any topic keeps anything
_MAX_TEXT = 64  # longest instant or duration worth parsing ("2026-11-22T04:05:06.789123+14:00" is 32)


def _text(name: str, text: str) -> str:
    if len(text) > _MAX_TEXT:
        raise ApiError(400, f"{name}: too long ({len(text)} characters)")
    return text


def duration_ms(name: str, text: str) -> int:
    """A positive duration (`90s`, `10m`, `2h`) of at most a century."""
    try:
        ms = parse_duration_ms(_text(name, text))
    except (ValueError, OverflowError) as e:  # OverflowError: digits beyond a float
        raise ApiError(400, f"{name}: {e}") from None
    if ms <= 0:
        raise ApiError(400, f"{name}: must be longer than 0s")
    if ms > MAX_DURATION_MS:
        raise ApiError(400, f"{name}: longer than {MAX_DURATION_MS // 86_400_000} days")
    return ms


def instant_ms(name: str, text: str) -> int:
    """An RFC 3339 time that lies in years 1..9999 UTC."""
    try:
        ms = parse_time_ms(_text(name, text))
    except (ValueError, OverflowError) as e:
        raise ApiError(400, f"{name}: {e}") from None
    if not MIN_INSTANT_MS <= ms <= MAX_INSTANT_MS:
        raise ApiError(400, f"{name}: {text!r} is outside years 1 to 9999 UTC")
    return ms


def instant_or_ago_ms(name: str, text: str, now_ms: int) -> int:
    """An RFC 3339 time, or a duration meaning that long before `now_ms`."""
    try:
        return instant_ms(name, text)
    except ApiError as bad_instant:
        try:
            return now_ms - duration_ms(name, text)
        except ApiError:
            if _looks_like_time(text):
                raise bad_instant from None
            raise ApiError(400, f"{name}: not an RFC 3339 time or a duration: {text[:_MAX_TEXT]!r}") from None


def _looks_like_time(text: str) -> bool:
    return len(text) >= 10 and text[4:5] == "-" and text[:4].isdigit()
