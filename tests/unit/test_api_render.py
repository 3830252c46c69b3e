"""Wire formats: RFC 3339 UTC times, null for unknown numbers; the idle rule over published windows."""

from __future__ import annotations

import math

import pytest

from periscope.contract.values import num, parse_time_ms
from periscope.contract.values import time_json as rfc3339
from periscope.core import idle
from periscope.core.model import WindowStat
from services.api.windows import stat
from tests.unit.test_api_samples import MIN, T0, T0_TEXT, idle_windows, pod, row


def test_rfc3339_is_utc_with_milliseconds() -> None:
    assert rfc3339(T0) == T0_TEXT
    assert rfc3339(T0 - 789) == "2026-11-22T04:05:06.000Z"
    assert rfc3339(0) is None  # 0 = unknown in the domain
    assert rfc3339(10**18) is None  # beyond datetime: unknown rather than a crash


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        (T0_TEXT, T0),
        ("2026-11-22T04:05:06Z", T0 - 789),
        ("2026-11-22T05:05:06.789+01:00", T0),
        ("2026-11-22T04:05:06.789", T0),  # naive = UTC
    ],
)
def test_parse_time(text: str, ms: int) -> None:
    assert parse_time_ms(text) == ms


def test_parse_time_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="RFC 3339"):
        parse_time_ms("yesterday")


def test_non_finite_numbers_become_null() -> None:
    assert num(math.nan) is None and num(math.inf) is None and num(None) is None and num(2.5) == 2.5


def _verdict(
    *windows: WindowStat, first_seen: int = T0 - 60 * MIN, threshold: float = 5.0, window_ms: int = 10 * MIN
) -> idle.IdleVerdict | None:
    r = row(first_seen_ms=first_seen, gpu_fraction=0.25)
    stats = [stat(w) for w in windows]
    rule = idle.IdleRule(threshold, window_ms)
    return idle.row_verdict(pod("u", "ml", "p", "n", r, as_of=T0), r, stats, rule)


def _w(start: int, pct: float | None, samples: int = 60) -> WindowStat:
    if pct is None:
        return WindowStat(start, samples)
    return WindowStat(start, samples, pct * samples, samples)


def test_idle_since_reaches_back_through_the_idle_run_beyond_the_window() -> None:
    base = T0 - T0 % MIN
    windows = [_w(base - k * MIN, 50.0 if k == 40 else 1.0) for k in range(45, -1, -1)]
    v = _verdict(*windows)
    assert v is not None and v.avg_util_pct == pytest.approx(1.0)
    assert v.since_ms == base - 39 * MIN  # the busy window at -40m ends the run
    assert v.wasted_gpu_hours == pytest.approx((T0 - v.since_ms) / 3_600_000 * 0.25)


def test_unknown_util_is_not_idle() -> None:
    base = T0 - T0 % MIN
    assert _verdict(*[_w(base - k * MIN, None) for k in range(30)]) is None


def test_too_young_to_judge_over_the_window() -> None:
    assert _verdict(*idle_windows(0.0, 5), first_seen=T0 - 5 * MIN) is None
    assert _verdict(*idle_windows(0.0, 5), first_seen=T0 - 5 * MIN, window_ms=4 * MIN) is not None


def test_average_over_the_window_decides_not_one_window() -> None:
    base = T0 - T0 % MIN
    windows = [_w(base - k * MIN, 12.0 if k == 0 else 2.0) for k in range(9, -1, -1)]  # one busy minute
    v = _verdict(*windows)
    assert v is not None and v.avg_util_pct == pytest.approx((9 * 2 + 12) / 10)
    assert _verdict(*windows, threshold=3.0) is None


def test_released_rows_are_never_idle() -> None:
    r = row(active=False)
    stats = [stat(w) for w in idle_windows(0.0)]
    assert idle.row_verdict(pod("u", "ml", "p", "n", r), r, stats, idle.IdleRule(5.0, 10 * MIN)) is None
