"""Row state: idle detection's running sums give what adding up the windows every sample gives."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from periscope.core.rows import IW, RowConfig, RowState, W
from periscope.core.usage import Usage

S = 1000


def _naive_avg(row: RowState, t_ms: int, cfg: RowConfig) -> float | None:
    """The windows overlapping [t - idle span, t], added oldest first, every time."""
    since = t_ms - cfg.idle_window_ms
    s = n = 0.0
    iw, w = row.idle_windows, row.windows
    for i in range(0, len(iw), IW):
        if iw[i] + cfg.window_ms > since:
            s += iw[i + 1]
            n += iw[i + 2]
    for i in range(0, len(w), W):
        if w[i] + cfg.window_ms > since:
            s += w[i + 2]
            n += w[i + 3]
    return round(s / n, 3) if n else None


def _usage(util: float | None) -> Usage:
    return Usage(util, 100.0, 50.0, "exclusive", "exclusive", 1.0, True)


# One step: (seconds to the next sample, its util or None, publish the closed windows?, deactivate?)
_steps = st.lists(st.tuples(st.integers(1, 25), st.one_of(st.none(), st.floats(0, 100)), st.booleans(),
                            st.booleans()), min_size=1, max_size=150)


@settings(max_examples=80, deadline=None)
@given(steps=_steps, keep_s=st.integers(1, 120), idle_s=st.integers(1, 120))
def test_average_matches_adding_up_every_window_each_sample(
        steps: list[tuple[int, float | None, bool, bool]], keep_s: int, idle_s: int) -> None:
    # Spans that are not whole windows too: the first window summed then ends between two windows.
    cfg = RowConfig(window_ms=10 * S, window_keep_ms=keep_s * S, idle_window_ms=idle_s * S,
                    idle_threshold_pct=5.0)
    row = RowState("uid", "ns", "pod", "c", "GPU-0", "GPU-0", None, first_seen_ms=S)
    t = S
    for gap, util, publish, deactivate in steps:
        t += gap * S
        row.observe(t, _usage(util), ("podresources",), cfg)
        assert row.avg_util_pct == _naive_avg(row, t, cfg)
        if publish:
            closed = row.closed_unpublished()
            if closed:
                row.mark_published(closed[-1].start_ms, cfg)
        if deactivate:
            row.deactivate()
            closed = row.closed_unpublished()
            if closed and publish:
                row.mark_published(closed[-1].start_ms, cfg)


def test_a_row_s_windows_take_no_spare_room_once_one_is_published() -> None:
    """A long-running joiner holds these arrays for every row: an append's spare room is given back
    when a window is published (one copy a minute)."""
    import sys
    from array import array

    cfg = RowConfig()
    row = RowState(pod_uid="u", namespace="ns", pod="p", container="c", device_id="d", gpu_uuid="g",
                   mig=None, first_seen_ms=0)
    for t in range(0, 30 * 60_000, 1000):
        row.observe(t, Usage(50.0, 1.0, 1.0, "exclusive", "exclusive", 1.0, True), ("podresources",), cfg)
        if t % cfg.window_ms == 0 and t:
            row.mark_published(t - cfg.window_ms, cfg)
    assert len(row.idle_windows) and len(row.windows)
    for a in (row.windows, row.idle_windows, row.ledger):
        assert sys.getsizeof(a) == sys.getsizeof(array("d", a))
