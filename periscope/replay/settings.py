"""Settings of `periscope replay` (env prefix PERISCOPE_, e.g. PERISCOPE_REPLAY_LOOKBACK).

The engine settings use the joiner's own variable names and formats (PERISCOPE_WINDOW,
PERISCOPE_IDLE_WINDOW, PERISCOPE_LATENESS, PERISCOPE_HEARTBEAT, ...), so one environment gives the live
joiner and replay the same engine configuration, and so the same outputs. Durations accept the
project's duration strings (`90s`, `10m`, `2h`) or plain seconds.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from periscope.config import ServiceSettings, seconds
from periscope.core.changes import ChangeConfig
from periscope.core.engine import EngineConfig
from periscope.core.rows import RowConfig

_DURATIONS = ("replay_lookback", "replay_window_lookback", "replay_late_slack", "window", "window_keep",
              "idle_window", "lateness", "heartbeat")


class ReplaySettings(ServiceSettings):
    # Allocation snapshots and inventory are read from this far before the first instant replayed
    # (and further back, until each node's last snapshot before it is found).
    replay_lookback: float = 3600.0
    # Telemetry and XIDs are read from this far before --from, so window and idle state are warm at --from.
    replay_window_lookback: float = 600.0
    # A partition is read until a record this far past --to (records arrive a little out of order).
    replay_late_slack: float = 300.0
    # Worker processes replaying nodes side by side (0: one per CPU this process may use; 1: none).
    replay_workers: int = Field(default=0, ge=0)
    # The joiner's engine settings (same environment variables, same defaults).
    window: float = 60.0
    window_keep: float = 3600.0
    idle_window: float = 600.0
    idle_threshold: float = Field(default=5.0, ge=0.0, le=100.0)
    lateness: float = 1.0
    heartbeat: float = 5.0  # an unchanged output is published again after this much event time

    @field_validator(*_DURATIONS, mode="before")
    @classmethod
    def _parse(cls, value: Any) -> Any:
        return seconds(value)

    @field_validator(*_DURATIONS)
    @classmethod
    def _not_negative(cls, value: float) -> float:
        if value < 0:
            raise ValueError("must not be a negative duration")
        return value

    def ms(self, name: str) -> int:
        value: float = getattr(self, name)
        return round(value * 1000)

    def engine_config(self) -> EngineConfig:
        rows = RowConfig(window_ms=max(1, self.ms("window")), window_keep_ms=self.ms("window_keep"),
                         idle_window_ms=self.ms("idle_window"), idle_threshold_pct=self.idle_threshold)
        return EngineConfig(rows=rows, lateness_ms=self.ms("lateness"),
                            changes=ChangeConfig(heartbeat_ms=self.ms("heartbeat")))
