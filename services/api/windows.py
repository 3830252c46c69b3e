"""A row's merged tumbling-window stats, packed into one `bytes` object.

The joiner publishes each window once, when it closes (at-least-once: a repeat may come later, and a
PodAttribution may carry no windows at all), so the API merges them per row by `start_ms` (a repeat
replaces the earlier copy) and keeps them for a retention span, pruned by event time.

An hour of one-minute windows per row at 100,000 rows is six million windows, so they are not kept as
objects. A series is a header (the first start in ms, and the layout: one struct code per column) and
fixed-size records, oldest first. Each column takes the narrowest code that holds every value exactly,
so nothing is ever rounded: start - first start as uint32 ms (int64 beyond 49 days), the two counts as
uint16, uint32 or int64, and each sum as float32 when every value survives float32 unchanged (small
integer sums, as integer NVML percentages give), float64 otherwise. 20 bytes a window at best, 44 at
worst; typically 28 for real telemetry (fractional MiB and watts take float64).

Once a row holds `SEAL` windows they are compressed: the records are byte-shuffled (the first byte of
every record, then the second, ...: a column's bytes change little from one minute to the next) and
deflated into one block, kept only when smaller. Windows arriving later are appended uncompressed after
the block until there are `SEAL` of them, then everything is compressed again. Lossless, like the rest.
Pruning the oldest windows (every minute per row, once a row holds a full retention span) only counts
them as skipped in the header, so the block is not recompressed each time; skipped windows are dropped
for good at the next repacking, which comes at the latest once `SEAL` are skipped.

A window that carries GPU-hours accounting (WindowStat's gpu_ms .. request_gpu_ms: what /v1/usage and
the GPU-hours counters sum) adds those seven columns to every record of its series, as float64; the
start column's code says so ("L" or "Q" in place of "I" or "q": the same sizes, unsigned), so a series
without accounting is laid out, and sized, exactly as before. The accounting basis is not kept.

Pure functions over bytes: no I/O, no clock.
"""

from __future__ import annotations

import struct
import zlib
from bisect import bisect_left
from collections.abc import Iterable

from periscope.core.model import WindowStat

# start_ms, samples, util_sum, util_samples, fb_max_mib, power_sum_w, then the accounting: gpu_ms,
# used_gpu_ms, idle_gpu_ms, unmeasured_gpu_ms, fb_mib_ms, energy_j, request_gpu_ms (WindowStat's order)
Stat = tuple[int, int, float, int, float, float, float, float, float, float, float, float, float]
_ACCOUNTED = {"I": "L", "q": "Q"}  # the start column's code when the records carry accounting
_NONE = (0.0,) * 7
Acct = tuple[int, float, float, float]  # start_ms, allocated, used and idle GPU-ms of a window

# Header: first start (ms); the record's struct codes: start offset, counts (samples and util_samples),
# util_sum, fb_max_mib, power_sum_w; how many windows the compressed block holds and its length (0, 0
# when there is none); how many of the first records are pruned (skipped); the first start not skipped.
# Then the block, then the uncompressed records.
_HEAD = struct.Struct("<q5sHHHq")
SEAL = 8  # compress once this many windows are held uncompressed
_F32 = struct.Struct("<f")
_U16_MAX = 2**16 - 1
_U32_MAX = 2**32 - 1
_records: dict[bytes, struct.Struct] = {}


def _record(codes: bytes) -> struct.Struct:
    rec = _records.get(codes)
    if rec is None:
        c = codes.decode()
        acct = "7d" if c[0] in "LQ" else ""
        rec = _records[codes] = struct.Struct(f"<{c[0]}{c[1]}{c[1]}{c[2]}{c[3]}{c[4]}{acct}")
    return rec


def _f32_exact(x: float) -> bool:
    try:
        return _F32.unpack(_F32.pack(x))[0] == x  # NaN never equals itself: it goes wide, unchanged
    except OverflowError:
        return False


def _int_code(lo: int, hi: int) -> str:
    if lo >= 0 and hi <= _U16_MAX:
        return "H"
    return "I" if lo >= 0 and hi <= _U32_MAX else "q"


def _codes(stats: list[Stat], base: int) -> bytes:
    """The narrowest exact layout for `stats`."""
    counts = [c for s in stats for c in (s[1], s[3])]
    start = "I" if stats[-1][0] - base <= _U32_MAX else "q"  # sorted: the last start is the farthest
    if any(s[6:] != _NONE for s in stats):
        start = _ACCOUNTED[start]
    return "".join((
        start,
        _int_code(min(counts), max(counts)),
        *("f" if all(_f32_exact(s[i]) for s in stats) else "d" for i in (2, 4, 5)),
    )).encode()


def _fits(s: Stat, base: int, codes: bytes) -> bool:
    """Whether one more window fits the layout `codes` unchanged."""
    start, count, floats = chr(codes[0]), chr(codes[1]), codes[2:].decode()
    if start in "IL" and not 0 <= s[0] - base <= _U32_MAX:
        return False
    if start in "Iq" and s[6:] != _NONE:
        return False
    if _int_code(min(s[1], s[3]), max(s[1], s[3])) > count:  # "H" < "I" < "q"
        return False
    return all(c == "d" or _f32_exact(v) for c, v in zip(floats, (s[2], s[4], s[5]), strict=True))


def _pack_one(rec: struct.Struct, s: Stat, base: int) -> bytes:
    if len(rec.format) > 8:  # "<" and six columns, then the accounting's "7d"
        return rec.pack(s[0] - base, s[1], s[3], s[2], s[4], s[5], *s[6:])
    return rec.pack(s[0] - base, s[1], s[3], s[2], s[4], s[5])


def stat(w: WindowStat) -> Stat:
    return (w.start_ms, w.samples, w.util_sum, w.util_samples, w.fb_max_mib, w.power_sum_w, w.gpu_ms,
            w.used_gpu_ms, w.idle_gpu_ms, w.unmeasured_gpu_ms, w.fb_mib_ms, w.energy_j, w.request_gpu_ms)


def window(s: Stat) -> WindowStat:
    return WindowStat(*s)


def _shuffle(raw: bytes, size: int) -> bytes:
    return b"".join(raw[j::size] for j in range(size))


def _unshuffle(data: bytes, size: int) -> bytes:
    n = len(data) // size
    out = bytearray(len(data))
    for j in range(size):
        out[j::size] = data[j * n : (j + 1) * n]
    return bytes(out)


def pack(stats: list[Stat]) -> bytes:
    """Stats sorted by start, starts unique -> a series (b"" when there are none)."""
    if not stats:
        return b""
    base = stats[0][0]
    codes = _codes(stats, base)
    rec = _record(codes)
    raw = b"".join(_pack_one(rec, s, base) for s in stats)
    if len(stats) >= SEAL and len(stats) <= _U16_MAX:
        block = zlib.compress(_shuffle(raw, rec.size))
        if len(block) < min(len(raw), _U16_MAX):
            return _HEAD.pack(base, codes, len(stats), len(block), 0, base) + block
    return _HEAD.pack(base, codes, 0, 0, 0, base) + raw


def _body(series: bytes) -> tuple[int, struct.Struct, bytes]:
    """First start, record layout and every record (skipped ones too), uncompressed."""
    base, codes, _, zlen, _, _ = _HEAD.unpack_from(series)
    rec = _record(codes)
    if not zlen:
        return base, rec, series[_HEAD.size :]
    end = _HEAD.size + zlen
    return base, rec, _unshuffle(zlib.decompress(series[_HEAD.size : end]), rec.size) + series[end:]


def unpack(series: bytes) -> list[Stat]:
    """The stats of a series, oldest first."""
    if not series:
        return []
    base, rec, body = _body(series)
    skip: int = _HEAD.unpack_from(series)[4]
    records = rec.iter_unpack(memoryview(body)[skip * rec.size :])
    if len(rec.format) > 8:
        return [(base + r[0], r[1], r[3], r[2], r[4], r[5], *r[6:]) for r in records]  # type: ignore[misc]
    return [(base + o, n, u, un, fb, pw, *_NONE) for o, n, un, u, fb, pw in records]


def _tail(series: bytes) -> tuple[int, struct.Struct]:
    """How many windows follow the compressed block uncompressed, and the record layout."""
    _, codes, _, zlen, _, _ = _HEAD.unpack_from(series)
    rec = _record(codes)
    return (len(series) - _HEAD.size - zlen) // rec.size, rec


def count(series: bytes) -> int:
    if not series:
        return 0
    _, _, zn, _, skip, _ = _HEAD.unpack_from(series)
    return int(zn) + _tail(series)[0] - int(skip)


def _last_start(series: bytes) -> int:
    n, rec = _tail(series)
    if n:
        base: int = _HEAD.unpack_from(series)[0]
        return base + int(rec.unpack_from(series, len(series) - rec.size)[0])
    return unpack(series)[-1][0]


def _first_start(series: bytes) -> int:
    first: int = _HEAD.unpack_from(series)[5]
    return first


def _drop_before(series: bytes, cutoff_ms: int) -> bytes:
    """`series` without the windows starting before `cutoff_ms`: skipped in the header while fewer than
    `SEAL` are, else repacked."""
    held = unpack(series)
    k = bisect_left(held, cutoff_ms, key=lambda s: s[0])
    base, codes, zn, zlen, skip, _ = _HEAD.unpack_from(series)
    if k == len(held) or skip + k >= SEAL:
        return pack(held[k:])
    return _HEAD.pack(base, codes, zn, zlen, skip + k, held[k][0]) + series[_HEAD.size :]


def merge(series: bytes, new: Iterable[WindowStat], cutoff_ms: int) -> bytes:
    """`series` with the windows of `new` merged in by start (a repeat replaces the held copy) and every
    window starting before `cutoff_ms` dropped."""
    incoming = sorted((stat(w) for w in new if w.start_ms >= cutoff_ms), key=lambda s: s[0])
    if series and _first_start(series) < cutoff_ms:
        series = _drop_before(series, cutoff_ms)
    if not incoming:
        return series
    # The common case, one window newer than all held ones: append a record, no repacking.
    if series and len(incoming) == 1 and incoming[0][0] > _last_start(series):
        base, codes = _HEAD.unpack_from(series)[:2]
        if _fits(incoming[0], base, codes) and _tail(series)[0] + 1 < SEAL:
            return series + _pack_one(_record(codes), incoming[0], base)
    by_start = {s[0]: s for s in unpack(series)}
    by_start.update((s[0], s) for s in incoming)
    return pack([by_start[k] for k in sorted(by_start)])


def prune(series: bytes, cutoff_ms: int) -> bytes:
    """`series` without the windows starting before `cutoff_ms`."""
    if not series or _first_start(series) >= cutoff_ms:
        return series
    return _drop_before(series, cutoff_ms)


def windows(series: bytes) -> tuple[WindowStat, ...]:
    return tuple(window(s) for s in unpack(series))


def taken(series: bytes, new: Iterable[WindowStat], cutoff_ms: int) -> list[tuple[Acct, Acct | None]]:
    """What `merge(series, new, cutoff_ms)` takes of `new`'s GPU-hours accounting: per window carrying
    some, (start, allocated, used, idle GPU-ms) and the same of the copy it replaces (None: not held)."""
    incoming = [(w.start_ms, w.gpu_ms, w.used_gpu_ms, w.idle_gpu_ms) for w in new
                if w.start_ms >= cutoff_ms and (w.gpu_ms or w.used_gpu_ms or w.idle_gpu_ms)]
    if not incoming:
        return []
    if not series or min(a[0] for a in incoming) > _last_start(series):
        return [(a, None) for a in incoming]  # the common case: newer than every held window
    held = {s[0]: (s[0], s[6], s[7], s[8]) for s in unpack(series)}
    return [(a, held.get(a[0])) for a in incoming]
