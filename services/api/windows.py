"""A row's merged tumbling-window stats, packed into one `bytes` object.

The joiner publishes each window once, when it closes (at-least-once: a repeat may come later, and a
PodAttribution may carry no windows at all), so the API merges them per row by `start_ms` (a repeat
replaces the earlier copy) and keeps them for a retention span, pruned by event time.

An hour of one-minute windows per row at 100,000 rows is six million windows, so they are not kept as
objects. A series is a header (base start in ms, layout) and fixed-size records, oldest first:

- narrow (24 bytes): start - base as uint32 ms, samples and util_samples as uint32, util_sum,
  fb_max_mib and power_sum_w as float32 - used only while every value survives float32 exactly (small
  integer counts and sums, as integer NVML percentages and MiB give), so nothing is ever rounded;
- wide (48 bytes): start_ms and the counts as int64, the sums as float64 - anything else.

Pure functions over bytes: no I/O, no clock.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from periscope.core.model import WindowStat

# start_ms, samples, util_sum, util_samples, fb_max_mib, power_sum_w: WindowStat's fields in order
Stat = tuple[int, int, float, int, float, float]

_HEAD = struct.Struct("<qB")  # base start_ms, layout
_NARROW_REC = struct.Struct("<IIIfff")  # start - base, samples, util_samples, util_sum, fb_max, power_sum
_WIDE_REC = struct.Struct("<qqqddd")  # start, samples, util_samples, util_sum, fb_max, power_sum
_NARROW, _WIDE = 0, 1
_F32 = struct.Struct("<f")
_U32_MAX = 2**32 - 1


def _f32_exact(x: float) -> bool:
    try:
        return _F32.unpack(_F32.pack(x))[0] == x  # NaN never equals itself: it goes wide, unchanged
    except OverflowError:
        return False


def _narrow_fits(s: Stat, base: int) -> bool:
    start, samples, util_sum, util_samples, fb_max, power_sum = s
    return (
        0 <= start - base <= _U32_MAX
        and 0 <= samples <= _U32_MAX
        and 0 <= util_samples <= _U32_MAX
        and _f32_exact(util_sum)
        and _f32_exact(fb_max)
        and _f32_exact(power_sum)
    )


def stat(w: WindowStat) -> Stat:
    return (w.start_ms, w.samples, w.util_sum, w.util_samples, w.fb_max_mib, w.power_sum_w)


def window(s: Stat) -> WindowStat:
    return WindowStat(s[0], s[1], s[2], s[3], s[4], s[5])


def pack(stats: list[Stat]) -> bytes:
    """Stats sorted by start, starts unique -> a series (b"" when there are none)."""
    if not stats:
        return b""
    base = stats[0][0]
    if all(_narrow_fits(s, base) for s in stats):
        return _HEAD.pack(base, _NARROW) + b"".join(
            _NARROW_REC.pack(s[0] - base, s[1], s[3], s[2], s[4], s[5]) for s in stats
        )
    wide = (_WIDE_REC.pack(s[0], s[1], s[3], s[2], s[4], s[5]) for s in stats)
    return _HEAD.pack(base, _WIDE) + b"".join(wide)


def unpack(series: bytes) -> list[Stat]:
    """The stats of a series, oldest first."""
    if not series:
        return []
    base, layout = _HEAD.unpack_from(series)
    body = memoryview(series)[_HEAD.size :]
    if layout == _NARROW:
        return [(base + o, n, u, un, fb, pw) for o, n, un, u, fb, pw in _NARROW_REC.iter_unpack(body)]
    return [(st, n, u, un, fb, pw) for st, n, un, u, fb, pw in _WIDE_REC.iter_unpack(body)]


def count(series: bytes) -> int:
    if not series:
        return 0
    size = _NARROW_REC.size if series[_HEAD.size - 1] == _NARROW else _WIDE_REC.size
    return (len(series) - _HEAD.size) // size


def _last_start(series: bytes) -> int:
    base, layout = _HEAD.unpack_from(series)
    if layout == _NARROW:
        return base + int(_NARROW_REC.unpack_from(series, len(series) - _NARROW_REC.size)[0])
    return int(_WIDE_REC.unpack_from(series, len(series) - _WIDE_REC.size)[0])


def _first_start(series: bytes) -> int:
    base: int = _HEAD.unpack_from(series)[0]
    return base


def merge(series: bytes, new: Iterable[WindowStat], cutoff_ms: int) -> bytes:
    """`series` with the windows of `new` merged in by start (a repeat replaces the held copy) and every
    window starting before `cutoff_ms` dropped."""
    incoming = sorted((stat(w) for w in new if w.start_ms >= cutoff_ms), key=lambda s: s[0])
    if series and _first_start(series) < cutoff_ms:
        held = [s for s in unpack(series) if s[0] >= cutoff_ms]
        series = pack(held)
    if not incoming:
        return series
    # The common case, one window newer than all held ones: append a record, no repacking.
    if series and len(incoming) == 1 and incoming[0][0] > _last_start(series):
        s = incoming[0]
        base, layout = _HEAD.unpack_from(series)
        if layout == _WIDE:
            return series + _WIDE_REC.pack(s[0], s[1], s[3], s[2], s[4], s[5])
        if _narrow_fits(s, base):
            return series + _NARROW_REC.pack(s[0] - base, s[1], s[3], s[2], s[4], s[5])
    by_start = {s[0]: s for s in unpack(series)}
    by_start.update((s[0], s) for s in incoming)
    return pack([by_start[k] for k in sorted(by_start)])


def prune(series: bytes, cutoff_ms: int) -> bytes:
    """`series` without the windows starting before `cutoff_ms`."""
    if not series or _first_start(series) >= cutoff_ms:
        return series
    return pack([s for s in unpack(series) if s[0] >= cutoff_ms])


def windows(series: bytes) -> tuple[WindowStat, ...]:
    return tuple(window(s) for s in unpack(series))
