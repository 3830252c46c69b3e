"""Allocated-but-idle: the joiner's own flags, or a recomputation for a caller's threshold and window.

The joiner publishes each row's tumbling window stats as the windows close (`AttributionRow.windows`),
and the view merges them per row for its window retention (PERISCOPE_API_WINDOW_RETENTION, 1h), so
/v1/idle can answer "idle below P % over the last W" for any P and any W up to that retention, without
keeping telemetry in the API.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from periscope.core.model import AttributionRow, PodAttribution
from services.api.windows import Stat

DEFAULT_THRESHOLD_PCT = 5.0
DEFAULT_WINDOW_MS = 10 * 60_000
_HOUR_MS = 3_600_000
DEFAULT_BUCKET_MS = 60_000  # the joiner's default window (PERISCOPE_WINDOW), for a row with one window


@dataclass(frozen=True, slots=True)
class IdleVerdict:
    since_ms: int
    avg_util_pct: float | None
    wasted_gpu_hours: float


def _avg(windows: Sequence[Stat]) -> float | None:
    samples = sum(w[3] for w in windows)
    if samples <= 0:
        return None
    return sum(w[2] for w in windows) / samples


def joiner_verdict(row: AttributionRow) -> IdleVerdict | None:
    """The joiner's own decision, as published."""
    if not (row.active and row.idle):
        return None
    return IdleVerdict(row.idle_since_ms, row.avg_util_pct, row.wasted_gpu_hours)


def recompute(
    pod: PodAttribution, row: AttributionRow, windows: Sequence[Stat], threshold_pct: float, window_ms: int
) -> IdleVerdict | None:
    """Idle iff the row is active, was allocated for the whole window, and its average utilization over
    its merged closed windows (services.api.windows.Stat, any order) that overlap the span
    [as_of - window, as_of] is below the threshold.

    A row without utilization samples (e.g. a MIG slice without profiling data) is never called idle:
    "unknown" is not "idle". idle_since extends back through the trailing run of below-threshold windows
    (so a pod idle for an hour under a 10m window reports the hour), never before the row was first seen.
    """
    if not row.active:
        return None
    as_of = pod.as_of_ms or row.last_seen_ms or row.sample_ms
    ws = sorted(windows, key=lambda w: w[0])
    if not as_of or not ws:
        return None
    # Windows are aligned tumbling windows, so the smallest gap between two held starts is their length.
    length = min((b[0] - a[0] for a, b in pairwise(ws)), default=DEFAULT_BUCKET_MS)
    # Only closed windows are published, not the current one: the span ends where the newest closed
    # window ends (never more than one window before as_of, so a row whose windows stopped coming is
    # not judged on old ones), and a window counts when it overlaps the span, so that a span shorter
    # than a window is judged by the newest closed window.
    end = min(as_of, max(ws[-1][0] + length, as_of - length))
    cutoff = end - window_ms
    known_from = row.first_seen_ms or ws[0][0]
    if known_from > cutoff:
        return None  # not held long enough to judge over this window
    selected = [w for w in ws if w[0] + length > cutoff and w[0] < end]
    avg = _avg(selected)
    if avg is None or avg >= threshold_pct:
        return None
    since = selected[0][0]
    for w in reversed(ws):
        if w[0] >= since:
            continue
        wavg = _avg([w])
        if wavg is not None and wavg >= threshold_pct:
            break
        since = w[0]
    since = max(since, row.first_seen_ms)
    wasted = max(0, as_of - since) / _HOUR_MS * row.gpu_fraction
    return IdleVerdict(since, avg, wasted)
