"""Per pod-device row state: latest attributed usage, tumbling windows on event time, idle detection."""

from __future__ import annotations

from dataclasses import dataclass, field

from periscope.core.model import AttributionRow, MigRef, WindowStat
from periscope.core.usage import Usage


@dataclass(frozen=True, slots=True)
class RowConfig:
    window_ms: int = 60_000
    window_keep_ms: int = 3_600_000
    idle_window_ms: int = 600_000
    idle_threshold_pct: float = 5.0


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
    # windows: [start_ms, samples, util_sum, util_samples, fb_max, power_sum], oldest first
    windows: list[list[float]] = field(default_factory=list)
    low_since_ms: int = 0  # start of the current run of below-threshold samples (0 = none)
    idle: bool = False
    idle_since_ms: int = 0
    avg_util_pct: float | None = None
    # to_row cache of the closed windows' stats: (first start, count) -> tuple
    _closed_key: tuple[float, int] = (0.0, -1)
    _closed: tuple[WindowStat, ...] = ()

    def observe(self, t_ms: int, usage: Usage, sources: tuple[str, ...], cfg: RowConfig) -> None:
        self.usage, self.sources, self.active = usage, sources, True
        self.last_seen_ms = max(self.last_seen_ms, t_ms)
        self.sample_ms = t_ms
        start = t_ms - t_ms % cfg.window_ms
        if not self.windows or self.windows[-1][0] < start:
            self.windows.append([start, 0, 0.0, 0, 0.0, 0.0])
            cutoff = t_ms - cfg.window_keep_ms
            while self.windows and self.windows[0][0] + cfg.window_ms <= cutoff:
                self.windows.pop(0)
        w = self.windows[-1] if self.windows[-1][0] == start else self._window(start)
        w[1] += 1
        if usage.util_pct is not None:
            w[2] += usage.util_pct
            w[3] += 1
            if usage.util_pct < cfg.idle_threshold_pct:
                if not self.low_since_ms:
                    self.low_since_ms = t_ms
            else:
                self.low_since_ms = 0
        if usage.fb_used_mib is not None:
            w[4] = max(w[4], usage.fb_used_mib)
        if usage.power_w is not None:
            w[5] += usage.power_w
        self._update_idle(t_ms, cfg)

    def _window(self, start: int) -> list[float]:
        # A sample for an older window (reordered within the allowed lateness).
        self._closed_key = (0.0, -1)  # a closed window may change: drop the to_row cache
        for w in self.windows:
            if w[0] == start:
                return w
        w = [start, 0, 0.0, 0, 0.0, 0.0]
        self.windows.append(w)
        self.windows.sort(key=lambda x: x[0])
        return w

    def _update_idle(self, t_ms: int, cfg: RowConfig) -> None:
        since = t_ms - cfg.idle_window_ms
        s = n = 0.0
        for w in self.windows:
            if w[0] + cfg.window_ms > since:  # the window overlaps [since, t]
                s += w[2]
                n += w[3]
        self.avg_util_pct = round(s / n, 3) if n else None
        eligible = t_ms - self.first_seen_ms >= cfg.idle_window_ms
        idle = eligible and self.avg_util_pct is not None and self.avg_util_pct < cfg.idle_threshold_pct
        if idle and not self.idle:
            self.idle_since_ms = self.low_since_ms if self.low_since_ms else since
            self.idle_since_ms = max(self.idle_since_ms, self.first_seen_ms)
        if not idle:
            self.idle_since_ms = 0
        self.idle = idle

    def deactivate(self) -> bool:
        if not self.active:
            return False
        self.active, self.idle, self.idle_since_ms = False, False, 0
        return True

    def wasted_gpu_hours(self) -> float:
        if not self.idle or self.usage is None:
            return 0.0
        return round((self.sample_ms - self.idle_since_ms) / 3_600_000 * self.usage.gpu_fraction, 6)

    def _window_stats(self) -> tuple[WindowStat, ...]:
        if not self.windows:
            return ()
        # Closed windows do not change: convert them once, and only the open one every tick.
        key = (self.windows[0][0], len(self.windows))
        if key != self._closed_key:
            self._closed = tuple(_stat(w) for w in self.windows[:-1])
            self._closed_key = key
        return (*self._closed, _stat(self.windows[-1]))

    def to_row(self) -> AttributionRow:
        u = self.usage
        return AttributionRow(
            container=self.container,
            device_id=self.device_id,
            gpu_uuid=self.gpu_uuid,
            sharing=u.sharing if u else "exclusive",
            share_basis=u.share_basis if u else "none",
            mig=self.mig,
            util_pct=u.util_pct if u and self.active else None,
            fb_used_mib=u.fb_used_mib if u and self.active else None,
            power_w=u.power_w if u and self.active else None,
            active=self.active,
            idle=self.idle,
            first_seen_ms=self.first_seen_ms,
            last_seen_ms=self.last_seen_ms,
            sources=self.sources,
            idle_since_ms=self.idle_since_ms,
            avg_util_pct=self.avg_util_pct,
            wasted_gpu_hours=self.wasted_gpu_hours(),
            gpu_fraction=u.gpu_fraction if u else 1.0,
            windows=self._window_stats(),
            sample_ms=self.sample_ms,
        )


def _stat(w: list[float]) -> WindowStat:
    return WindowStat(int(w[0]), int(w[1]), round(w[2], 3), int(w[3]), w[4], round(w[5], 3))
