"""Allocated but idle: the one rule, for the engine's rows and for the API's /v1/idle.

A device held by a pod is idle at instant t when the pod has held it for the whole window before t
(first seen at or before t - window) and its average utilization over that window is known and below
the threshold. "Unknown" is not "idle": a row without utilization readings (a MIG slice without
profiling data) is never called idle. It is idle since the start of the run of low readings that ends
at t, never before it was first seen; the GPU-hours it wastes are that span times its share of the GPU.

The engine's rows apply the rule at every sample, over the windows they hold (the open one included);
the API applies it over the closed windows the joiner published (`from_windows`), for any threshold and
window its caller asks, the rule's defaults (`IdleRule`) when the caller names none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from periscope.core.model import AttributionRow, PodAttribution
from periscope.core.windows import START, UTIL_SAMPLES, UTIL_SUM

HOUR_MS = 3_600_000


@dataclass(frozen=True, slots=True)
class IdleRule:
    threshold_pct: float = 5.0  # idle below this average utilization ...
    window_ms: int = 600_000  # ... over this span


DEFAULT_RULE = IdleRule()


@dataclass(frozen=True, slots=True)
class IdleVerdict:
    since_ms: int
    avg_util_pct: float | None
    wasted_gpu_hours: float


def is_idle(avg_util_pct: float | None, first_seen_ms: int, t_ms: int, threshold_pct: float,
            window_ms: int) -> bool:
    """The rule (its parameters apart, not an `IdleRule`: the engine asks for every row of every sample)."""
    return t_ms - first_seen_ms >= window_ms and avg_util_pct is not None and avg_util_pct < threshold_pct


def idle_since(low_since_ms: int, first_seen_ms: int) -> int:
    """Idle since the start of the run of low readings, never before the row was first seen."""
    return max(low_since_ms, first_seen_ms)


def wasted_gpu_hours(since_ms: int, t_ms: int, gpu_fraction: float) -> float:
    return max(0, t_ms - since_ms) / HOUR_MS * gpu_fraction


# A row's windows as flat numbers in WindowStat's order (periscope.core.windows): the rule reads only the
# start and the utilization sums, so the API's longer tuples (with accounting) serve as they are.
Windows = Sequence[Sequence[float]]


def _avg(windows: Windows) -> float | None:
    samples = sum(w[UTIL_SAMPLES] for w in windows)
    if samples <= 0:
        return None
    return sum(w[UTIL_SUM] for w in windows) / samples


def from_windows(
    windows: Windows, *, active: bool, first_seen_ms: int, as_of_ms: int, gpu_fraction: float,
    rule: IdleRule = DEFAULT_RULE, window_len_ms: int = 60_000,
) -> IdleVerdict | None:
    """The rule over a row's closed windows (any order; `window_len_ms`: their length when fewer than
    two tell it). Only closed windows are published, not the current one: the span ends where the
    newest closed window ends (never more than one window before `as_of_ms`, so a row whose windows
    stopped coming is not judged on old ones), and a window counts when it overlaps the span, so that a
    span shorter than a window is judged by the newest closed window. The low run reaches back through
    the trailing windows below the threshold (so a pod idle for an hour under a 10m window says the
    hour)."""
    if not active or not as_of_ms or not windows:
        return None
    ws = sorted(windows, key=lambda w: w[START])
    starts = [int(w[START]) for w in ws]
    # Windows are aligned tumbling windows, so the smallest gap between two held starts is their length.
    length = min((b - a for a, b in pairwise(starts)), default=window_len_ms)
    end = min(as_of_ms, max(starts[-1] + length, as_of_ms - length))
    cutoff = end - rule.window_ms
    selected = [w for w, s in zip(ws, starts, strict=True) if s + length > cutoff and s < end]
    avg = _avg(selected)
    if not is_idle(avg, first_seen_ms or starts[0], end, rule.threshold_pct, rule.window_ms):
        return None
    low = int(selected[0][START])
    for w, s in zip(reversed(ws), reversed(starts), strict=True):
        if s >= low:
            continue
        wavg = _avg([w])
        if wavg is not None and wavg >= rule.threshold_pct:
            break
        low = s
    since = idle_since(low, first_seen_ms)
    return IdleVerdict(since, avg, wasted_gpu_hours(since, as_of_ms, gpu_fraction))


def row_verdict(pod: PodAttribution, row: AttributionRow, windows: Windows,
                rule: IdleRule = DEFAULT_RULE) -> IdleVerdict | None:
    """`from_windows` for a published row: as of its pod's latest state (or its own latest sample)."""
    return from_windows(windows, active=row.active, first_seen_ms=row.first_seen_ms,
                        as_of_ms=pod.as_of_ms or row.last_seen_ms or row.sample_ms,
                        gpu_fraction=row.gpu_fraction, rule=rule)
