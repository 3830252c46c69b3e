"""Per pod-device row state: latest attributed usage, tumbling windows on event time, idle detection.

A row keeps only the windows it still needs: the closed ones that overlap the idle span (for idle
detection, packed to the three numbers it reads once published), the closed ones not yet published,
and the open one. A window closes when a sample of a
later window arrives for the row, or when the row goes inactive; the engine publishes each closed
window once (`AttributionRow.windows` holds those closed since the row's previous publication) and
then calls `mark_published`. Subscribers keep the longer history themselves.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from math import inf, nan

from periscope.core.accounting import forget_published, with_account
from periscope.core.idle import DEFAULT_RULE, idle_since, is_idle, wasted_gpu_hours
from periscope.core.model import AttributionRow, MigRef, WindowStat
from periscope.core.usage import Usage
from periscope.core.windows import (
    FB_MAX,
    IDLE_START,
    IDLE_UTIL_SAMPLES,
    IDLE_UTIL_SUM,
    IW,
    POWER_SUM,
    SAMPLES,
    START,
    UTIL_SAMPLES,
    UTIL_SUM,
    W,
)


@dataclass(frozen=True, slots=True)
class RowConfig:
    window_ms: int = 60_000
    window_keep_ms: int = 3_600_000  # at most this much window history, even when idle detection wants more
    idle_window_ms: int = DEFAULT_RULE.window_ms
    idle_threshold_pct: float = DEFAULT_RULE.threshold_pct
    charge_gap_ms: int = 60_000  # accounting: a sample is charged for at most this much time before it


def _windows() -> array[float]:
    return array("d")


@dataclass(slots=True)
class RowState:
    pod_uid: str
    namespace: str
    pod: str
    container: str
    device_id: str
    gpu_uuid: str
    mig: MigRef | None
    first_seen_ms: int
    last_seen_ms: int = 0
    sample_ms: int = 0
    active: bool = True
    sources: tuple[str, ...] = ()
    usage: Usage | None = None
    # Windows in full, W doubles each, oldest first: the unpublished closed ones and the last one (open
    # while the row is active; once published it stays here, since the row may come back within it).
    windows: array[float] = field(default_factory=_windows)
    # Older published windows that overlap the idle span, IW doubles each, oldest first.
    idle_windows: array[float] = field(default_factory=_windows)
    published_ms: int = -1  # start of the newest window published as closed (-1: none yet)
    low_since_ms: int = 0  # start of the current run of below-threshold samples (0 = none)
    idle: bool = False
    idle_since_ms: int = 0
    avg_util_pct: float | None = None
    unresolved: str = ""  # why gpu_uuid is "" (the device ID names no known GPU)
    # GPU-hours accounting (periscope.core.accounting): per window, what was charged (the windows not
    # yet published and the last one); the pending below-threshold run; whether idle was booked.
    ledger: array[float] = field(default_factory=_windows)
    low_gpu_ms: float = 0.0
    idle_booked: bool = False
    # What the last sample charged per ms, for `charge_end`: (share, basis), None once inactive (the
    # unit's own pair where the row holds it alone: one object for every such row); the power (W) and
    # used scale it was charged with.
    charged: tuple[float, str] | None = None
    charged_power: float | None = None
    charged_scale: float = 1.0
    # _closed_sums' cache: first window summed, last closed window, util sum, util samples (4 doubles:
    # 70 bytes less than a tuple of floats).
    _closed: array[float] = field(default_factory=lambda: array("d", (inf, nan, 0.0, 0.0)), compare=False,
                                  repr=False)

    def observe(self, t_ms: int, usage: Usage, sources: tuple[str, ...], cfg: RowConfig) -> None:
        self.usage, self.sources, self.active = usage, sources, True
        if t_ms > self.last_seen_ms:
            self.last_seen_ms = t_ms
        self.sample_ms = t_ms
        start = t_ms - t_ms % cfg.window_ms
        w = self.windows
        if not w or w[-W + START] < start:
            w.extend((start, 0.0, 0.0, 0.0, 0.0, 0.0))
        # (An older start never comes: the engine processes a node's samples in event-time order.)
        i = len(w) - W
        if start <= self.published_ms:
            # The row went inactive and came back within one window: that window is open again and is
            # published once more when it closes (subscribers replace a window by its start).
            self.published_ms = start - 1
        w[i + SAMPLES] += 1
        util = usage.util_pct
        if util is not None:
            w[i + UTIL_SUM] += util
            w[i + UTIL_SAMPLES] += 1
            if util < cfg.idle_threshold_pct:
                if not self.low_since_ms:
                    self.low_since_ms = t_ms
            else:
                self.low_since_ms = 0
        if usage.fb_used_mib is not None and usage.fb_used_mib > w[i + FB_MAX]:
            w[i + FB_MAX] = usage.fb_used_mib
        if usage.power_w is not None:
            w[i + POWER_SUM] += usage.power_w
        # _pack and _trim, only when their first step would do something (usually neither does).
        if i and w[START] <= self.published_ms:
            self._pack()
        oldest = t_ms - min(cfg.idle_window_ms, cfg.window_keep_ms) - cfg.window_ms
        iw = self.idle_windows
        if (iw and iw[IDLE_START] <= oldest) or (
                len(w) > W and w[START] <= self.published_ms and w[START] <= oldest):
            self._trim(cfg)
        self._update_idle(t_ms, cfg)

    def _pack(self) -> None:
        """Published windows other than the last keep only what idle detection reads."""
        w, cut = self.windows, 0
        while cut + W < len(w) and w[cut + START] <= self.published_ms:
            self.idle_windows.extend((w[cut + START], w[cut + UTIL_SUM], w[cut + UTIL_SAMPLES]))
            cut += W
        if cut:
            del w[:cut]

    def _trim(self, cfg: RowConfig) -> None:
        """Drop the oldest published windows that idle detection no longer needs."""
        # A window is needed while it ends after both t - idle span and t - keep span, that is while
        # its start is after `oldest`.
        oldest = self.sample_ms - min(cfg.idle_window_ms, cfg.window_keep_ms) - cfg.window_ms
        iw, cut = self.idle_windows, 0
        while cut < len(iw) and iw[cut + IDLE_START] <= oldest:
            cut += IW
        if cut:
            del iw[:cut]
        w, cut = self.windows, 0
        published = self.published_ms
        while ((cut + W < len(w) or (cut < len(w) and not self.active)) and w[cut + START] <= published
               and w[cut + START] <= oldest):
            cut += W
        if cut:
            del w[:cut]

    def _update_idle(self, t_ms: int, cfg: RowConfig) -> None:
        since = t_ms - cfg.idle_window_ms
        # The windows overlapping [since, t], oldest first: closed ones, then the sample's own (last).
        s, n = self._closed_sums(since, cfg.window_ms)
        w = self.windows
        s += w[-W + UTIL_SUM]
        n += w[-W + UTIL_SAMPLES]
        self.avg_util_pct = round(s / n, 3) if n else None
        idle = is_idle(self.avg_util_pct, self.first_seen_ms, t_ms, cfg.idle_threshold_pct,
                       cfg.idle_window_ms)
        if idle and not self.idle:
            self.idle_since_ms = idle_since(self.low_since_ms or since, self.first_seen_ms)
        if not idle:
            self.idle_since_ms = 0
        self.idle = idle

    def _closed_sums(self, since: float, window_ms: int) -> tuple[float, float]:
        """Util sum and util samples of the closed windows that end after `since`, added oldest first.

        Those windows are a run at the end of the closed ones, whose numbers no longer change, and
        `since` only advances: the sums are kept until a window closes, the first of the run ends, or
        trimming removes it, so most samples add nothing up (the same additions in the same order
        when they do, so the result is the same to the last bit)."""
        iw, w = self.idle_windows, self.windows
        last = w[-2 * W + START] if len(w) >= 2 * W else iw[-IW + IDLE_START] if iw else -inf
        head = iw[IDLE_START] if iw else w[START] if len(w) > W else inf
        first, last_was, s, n = self._closed
        if last == last_was and (first == inf or (head <= first and first + window_ms > since)):
            return s, n
        s = n = 0.0
        first = inf
        for i in range(0, len(iw), IW):
            if iw[i + IDLE_START] + window_ms > since:
                first = min(first, iw[i + IDLE_START])
                s += iw[i + IDLE_UTIL_SUM]
                n += iw[i + IDLE_UTIL_SAMPLES]
        for i in range(0, len(w) - W, W):
            if w[i + START] + window_ms > since:
                first = min(first, w[i + START])
                s += w[i + UTIL_SUM]
                n += w[i + UTIL_SAMPLES]
        c = self._closed
        c[0], c[1], c[2], c[3] = first, last, s, n
        return s, n

    def deactivate(self) -> bool:
        """The row's device is no longer held: its open window closes (published with the row)."""
        if not self.active:
            return False
        self.active, self.idle, self.idle_since_ms = False, False, 0
        return True

    def wasted_gpu_hours(self) -> float:
        if not self.idle or self.usage is None:
            return 0.0
        # Rounded to the micro-GPU-hour as published (a bare float's last digits are noise).
        return round(wasted_gpu_hours(self.idle_since_ms, self.sample_ms, self.usage.gpu_fraction), 6)

    def closed_unpublished(self) -> tuple[WindowStat, ...]:
        w = self.windows
        end = len(w) - W if self.active else len(w)
        if end <= 0:
            return ()  # only the open window (every sample of an active row, but a window's first)
        led = self.ledger
        return tuple(with_account(led, _stat(w, i)) for i in range(0, end, W)
                     if w[i + START] > self.published_ms)

    def unpublished(self) -> tuple[WindowStat, ...]:
        """Every window not published yet, the open one included (what a replay's end still holds)."""
        w, led = self.windows, self.ledger
        return tuple(with_account(led, _stat(w, i)) for i in range(0, len(w), W)
                     if w[i + START] > self.published_ms)

    def mark_published(self, upto_start_ms: int, cfg: RowConfig) -> None:
        """The windows up to `upto_start_ms` were published: keep them only while idle detection needs
        them."""
        if upto_start_ms > self.published_ms:
            self.published_ms = upto_start_ms
            forget_published(self.ledger, upto_start_ms)
            self._pack()
            self._trim(cfg)
            # A window opened (each array grew, keeping the spare room an append leaves) and one was
            # published (they shrank, keeping it): copied to their size they hold ~200 bytes less per row
            # until the next window, a minute of event time, for three short copies.
            self.windows, self.idle_windows = self.windows[:], self.idle_windows[:]
            self.ledger = self.ledger[:]

    def to_row(self) -> AttributionRow:
        u = self.usage
        live = u is not None and self.active
        p = u.dcgm if live and u else None
        # Positional, in ROW_FIELDS order: this runs for every row of every sample, and CPython matches
        # 25 keywords at about 20 times the cost of 25 positions (bench/README.md, "positional").
        return AttributionRow(
            self.container, self.device_id, self.gpu_uuid,
            u.sharing if u else "exclusive", u.share_basis if u else "none", self.mig,
            u.util_pct if live and u else None, u.fb_used_mib if live and u else None,
            u.power_w if live and u else None,
            self.active, self.idle, self.first_seen_ms, self.last_seen_ms, self.sources, self.idle_since_ms,
            self.avg_util_pct, self.wasted_gpu_hours() if self.idle else 0.0, u.gpu_fraction if u else 1.0,
            self.closed_unpublished() if len(self.windows) > W or not self.active else (),
            self.sample_ms, self.unresolved,
            p.sm_active_pct if p else None, p.sm_occupancy_pct if p else None,
            p.tensor_active_pct if p else None, p.dram_active_pct if p else None,
        )


# The order `to_row` passes AttributionRow's fields in (tests/unit/test_core_field_order.py pins it to
# the dataclass, so a field added or moved fails there, not silently here).
ROW_FIELDS = (
    "container", "device_id", "gpu_uuid", "sharing", "share_basis", "mig", "util_pct", "fb_used_mib",
    "power_w", "active", "idle", "first_seen_ms", "last_seen_ms", "sources", "idle_since_ms", "avg_util_pct",
    "wasted_gpu_hours", "gpu_fraction", "windows", "sample_ms", "unresolved", "sm_active_pct",
    "sm_occupancy_pct", "tensor_active_pct", "dram_active_pct",
)


def _stat(w: array[float], i: int) -> WindowStat:
    return WindowStat(
        start_ms=int(w[i + START]), samples=int(w[i + SAMPLES]), util_sum=round(w[i + UTIL_SUM], 3),
        util_samples=int(w[i + UTIL_SAMPLES]), fb_max_mib=w[i + FB_MAX],
        power_sum_w=round(w[i + POWER_SUM], 3),
    )
