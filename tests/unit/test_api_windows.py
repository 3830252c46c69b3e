"""Window merging: the joiner sends each closed window once (at least once), the API keeps the history."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from periscope.core import idle
from periscope.core.model import PodAttribution, WindowStat
from periscope.settings.api import ApiSettings
from services.api import windows
from services.api.view import View
from tests.unit.test_api_app import client, get
from tests.unit.test_api_samples import GPU_A0, GPU_A1, MIN, T0, pod, row

BASE = T0 - T0 % MIN


def _w(k: int, pct: float = 1.0, samples: int = 60) -> WindowStat:
    """The window starting k minutes after BASE (k < 0: before)."""
    return WindowStat(BASE + k * MIN, samples, pct * samples, samples, 1024.0, 100.0 * samples)


def _starts(series: bytes) -> list[int]:
    return [(s[0] - BASE) // MIN for s in windows.unpack(series)]


def test_series_give_back_exactly_what_was_merged_in_the_narrowest_exact_layout() -> None:
    narrow = [_w(k, float(k)) for k in range(5)]
    s = windows.merge(b"", narrow, 0)
    assert windows.windows(s) == tuple(narrow) and len(s) == 27 + 5 * 20  # uint16 counts, float32 sums
    # 0.1 and 81559.123 are not float32 values: those columns widen instead of rounding them.
    odd = WindowStat(BASE + 9 * MIN, 7, 0.1, 3, 81559.123, 387.25 * 7)
    wide = windows.merge(s, [odd], 0)
    assert windows.windows(wide) == (*narrow, odd) and len(wide) == 27 + 6 * 28
    assert [w.util_sum for w in windows.windows(wide)] == [w.util_sum for w in (*narrow, odd)]
    # Any int64 count and float64 sum survives, and so does a start 60 days on.
    huge = WindowStat(BASE + 10 * MIN, 2**40, math.inf, 70_000, -1.0, 0.0)
    late = WindowStat(BASE + 60 * 24 * 60 * MIN, 1, 0.5, -1, 2.0**-30, 1e300)
    got = windows.windows(windows.merge(s, [huge, late], 0))
    assert got == (*narrow, huge, late) and windows.count(windows.merge(s, [huge, late], 0)) == 7
    nan = windows.windows(windows.merge(b"", [WindowStat(BASE, 1, math.nan)], 0))[0]
    assert math.isnan(nan.util_sum)


def test_an_hour_of_windows_is_compressed_and_still_given_back_exactly() -> None:
    hour = [WindowStat(BASE + k * MIN, 60, 4450.0 + 40 * (k % 2), 60, 4096.0 + k, 22450.0 + k)
            for k in range(60)]
    s = b""
    for w in hour:  # one at a time, as the joiner delivers them
        s = windows.merge(s, [w], 0)
        assert windows.windows(s)[-1] == w
    assert windows.windows(s) == tuple(hour) and windows.count(s) == 60
    assert len(s) < 60 * 20 // 2  # regular telemetry deflates well
    assert windows.windows(windows.pack([windows.stat(w) for w in hour])) == tuple(hour)
    # A late repeat inside the compressed part replaces it; pruning keeps the rest exact.
    again = replace(hour[3], util_sum=1.5)
    s = windows.merge(s, [again], 0)
    assert windows.windows(s) == (*hour[:3], again, *hour[4:])
    assert windows.windows(windows.prune(s, BASE + 50 * MIN)) == tuple(hour[50:])
    # Values that do not deflate are kept uncompressed, as exact.
    noisy = [WindowStat(BASE + k * MIN, k * 7919 % 65_521, (k * 2654435761 % 2**32) / 7.0, k,
                        k * 1.000001, -k / 3.0) for k in range(20)]
    assert windows.windows(windows.merge(b"", noisy, 0)) == tuple(noisy)


def test_a_sliding_hour_stays_exact_as_the_oldest_window_is_pruned_each_minute() -> None:
    span = 20
    s, held = b"", []
    for k in range(3 * span):
        w = WindowStat(BASE + k * MIN, 60, float(k % 3), 60, 4096.0, 100.0 * k)
        s = windows.merge(s, [w], BASE + (k - span + 1) * MIN)
        held = [*held, w][-span:]
        assert windows.windows(s) == tuple(held) and windows.count(s) == len(held)
    # A late repeat and the view-wide sweep see only what is held.
    again = replace(held[5], util_sum=7.0)
    s = windows.merge(s, [again], held[0].start_ms)
    assert windows.windows(s) == (*held[:5], again, *held[6:])
    assert windows.windows(windows.prune(s, held[-3].start_ms)) == tuple(held[-3:])
    assert windows.prune(s, held[-1].start_ms + 1) == b""


def test_a_repeat_replaces_the_held_copy_and_order_of_arrival_does_not_matter() -> None:
    s = b""
    for k in (3, 1, 2, 0):  # out of order
        s = windows.merge(s, [_w(k)], 0)
    s = windows.merge(s, [_w(2, 50.0)], 0)  # delivered again, different: the repeat wins
    s = windows.merge(s, [_w(1)], 0)  # delivered again, the same
    assert _starts(s) == [0, 1, 2, 3] and windows.count(s) == 4
    assert windows.windows(s)[2] == _w(2, 50.0)
    assert windows.merge(s, [], 0) is s  # nothing new: the same series


def test_windows_before_the_cutoff_are_pruned_and_not_taken() -> None:
    s = windows.merge(b"", [_w(k) for k in range(10)], 0)
    s = windows.merge(s, [_w(10), _w(2)], BASE + 5 * MIN)  # _w(2) arrives late and is too old
    assert _starts(s) == [5, 6, 7, 8, 9, 10]
    assert _starts(windows.prune(s, BASE + 8 * MIN)) == [8, 9, 10]
    assert windows.prune(s, BASE) is s and windows.prune(s, BASE + 11 * MIN) == b""


def _closing(k: int, *, util: float = 80.0, as_of: int | None = None, device: str = GPU_A0) -> PodAttribution:
    """The record the joiner publishes when window k closes: that window only, as of just after it."""
    t = BASE + (k + 1) * MIN + 500 if as_of is None else as_of
    return pod("u1", "ml", "a", "gpu-a", row(device, util_pct=util, windows=(_w(k),), last_seen_ms=t),
               as_of=t)


def test_the_view_merges_each_rows_windows_across_records() -> None:
    v = View()
    for k in range(5):
        assert v.apply(_closing(k))
    (key,) = v.row_keys()
    assert v.windows(key) == tuple(_w(k) for k in range(5))
    # A heartbeat without windows replaces the row's numbers and keeps its windows.
    beat = pod("u1", "ml", "a", "gpu-a", row(GPU_A0, util_pct=7.0), as_of=BASE + 6 * MIN)
    assert v.apply(beat)
    assert v.row(key)[1].util_pct == 7.0 and len(v.windows(key)) == 5
    assert v.row(key)[1].windows == ()  # the row itself does not hold them twice
    # At-least-once: the same record again changes nothing; a late older one only adds its window.
    assert not v.apply(beat)
    assert not v.apply(_closing(3))
    late = replace(_closing(5), rows=(row(GPU_A0, windows=(_w(-1),)),), as_of_ms=BASE + 2 * MIN)
    assert v.apply(late)
    assert v.row(key)[1].util_pct == 7.0  # the older record's numbers did not win
    assert [w.start_ms for w in v.windows(key)] == [BASE + k * MIN for k in range(-1, 5)]


def test_a_row_that_leaves_the_pod_takes_its_windows_with_it() -> None:
    v = View()
    v.apply(_closing(0))
    v.apply(_closing(1, device=GPU_A1))
    assert [(k[4], len(v.windows(k))) for k in v.row_keys()] == [(GPU_A1, 1)]
    v.apply(_closing(2))
    assert [(k[4], len(v.windows(k))) for k in v.row_keys()] == [(GPU_A0, 1)]


def test_retention_follows_event_time() -> None:
    v = View(window_retention_ms=10 * MIN)
    for k in range(30):
        v.apply(_closing(k))
    (key,) = v.row_keys()
    # Merging prunes by the pod's own time: as of minute 30.5, windows from minute 20.5 on are kept.
    assert [(w.start_ms - BASE) // MIN for w in v.windows(key)] == list(range(21, 30))
    # A quiet row is pruned by the view-wide sweep.
    assert v.prune_windows(BASE + 25 * MIN) == 1 and len(v.windows(key)) == 5
    assert v.prune_windows(BASE + 25 * MIN) == 0


def test_window_retention_is_a_setting() -> None:
    assert ApiSettings().window_retention_ms == 3_600_000
    assert ApiSettings(api_window_retention="90m").window_retention_ms == 90 * MIN
    with pytest.raises(ValueError, match="longer than 0s"):
        ApiSettings(api_window_retention="0s")


def test_the_render_cache_is_bounded() -> None:
    v = View(render_cache=3)
    for i in range(10):
        v.apply(pod(f"u{i}", "ml", f"p{i}", "gpu-a", row(GPU_A0)))
    for k in v.row_keys():
        assert v.row_json(k)["pod_uid"] == k[2]
    assert len(v._rendered) == 3


async def test_pod_detail_and_idle_read_the_merged_windows() -> None:
    v = View()
    first = BASE - 40 * MIN
    for k in range(-30, 0):  # 30 idle minutes, each window delivered once as it closed
        t = BASE + (k + 1) * MIN + 500
        r = row(GPU_A0, util_pct=2.0, first_seen_ms=first, last_seen_ms=t, windows=(_w(k, 2.0),))
        v.apply(pod("u1", "ml", "a", "gpu-a", r, as_of=t))
    # The newest record (a heartbeat) carries no windows.
    beat = row(GPU_A0, util_pct=2.0, first_seen_ms=first)
    v.apply(pod("u1", "ml", "a", "gpu-a", beat, as_of=BASE + 30_000))
    async with client(v) as c:
        (detail,) = (await get(c, "/v1/pods/u1"))["rows"]
        assert len(detail["windows"]) == 30 and detail["windows"][-1]["avg_util_pct"] == 2.0
        assert detail["windows"][0]["start"] == "2026-11-22T03:35:00.000Z"
        (idle,) = (await get(c, "/v1/idle?threshold_pct=5&window=10m"))["items"]
        assert idle["avg_util_pct"] == pytest.approx(2.0)
        assert idle["idle_since"] == "2026-11-22T03:35:00.000Z"  # back through all 30 merged windows
        assert (await get(c, "/v1/idle?threshold_pct=1&window=10m"))["items"] == []


def test_a_span_shorter_than_a_window_is_judged_by_the_closed_window_it_overlaps() -> None:
    """The current window is never published, so ?window=30s looks at the newest closed one."""
    r = row(first_seen_ms=T0 - 60 * MIN)
    p = pod("u1", "ml", "a", "gpu-a", r, as_of=T0)  # T0 is 6.789 s into the minute starting at BASE
    quiet = [windows.stat(_w(k, 2.0)) for k in range(-10, 0)]
    v = idle.row_verdict(p, r, quiet, idle.IdleRule(5.0, 30_000))
    assert v is not None and v.avg_util_pct == 2.0 and v.since_ms == BASE - 10 * MIN
    busy_last = [*quiet[:-1], windows.stat(_w(-1, 50.0))]
    assert idle.row_verdict(p, r, busy_last, idle.IdleRule(5.0, 30_000)) is None
    # Late in the current minute (45 s in), the newest closed window still decides.
    later = pod("u1", "ml", "a", "gpu-a", r, as_of=BASE + 45_000)
    v = idle.row_verdict(later, r, quiet, idle.IdleRule(5.0, 30_000))
    assert v is not None and v.wasted_gpu_hours == pytest.approx((45_000 + 10 * MIN) / 3_600_000)
    # Windows that stopped coming (none closed in the last minute) are not judged as if current.
    stalled = pod("u1", "ml", "a", "gpu-a", r, as_of=BASE + 5 * MIN)
    assert idle.row_verdict(stalled, r, quiet, idle.IdleRule(5.0, 30_000)) is None
    # Over 10m the window straddling the span's start counts too: 10 windows, not 9.
    mixed = [windows.stat(_w(k, 14.0 if k == -10 else 4.0)) for k in range(-10, 0)]
    assert idle.row_verdict(p, r, mixed, idle.IdleRule(5.0, 10 * MIN)) is None  # (14 + 9 x 4) / 10 = 5.0
    v = idle.row_verdict(p, r, mixed, idle.IdleRule(5.1, 10 * MIN))
    assert v is not None and v.avg_util_pct == pytest.approx(5.0)
