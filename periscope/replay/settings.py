"""Settings of `periscope replay` (env prefix PERISCOPE_, e.g. PERISCOPE_REPLAY_LOOKBACK).

The row settings use the joiner's own variable names (PERISCOPE_WINDOW, PERISCOPE_IDLE_WINDOW, ...), so
one environment gives the live joiner and replay the same engine configuration, and so the same output.
Durations accept the project's duration strings (`90s`, `10m`, `2h`).
"""

from __future__ import annotations

from typing import Any

from pydantic import field_validator

from periscope.config import ServiceSettings
from periscope.core.duration import parse_duration_ms
from periscope.core.engine import EngineConfig
from periscope.core.rows import RowConfig

_DURATIONS = ("replay_lookback", "replay_window_lookback", "replay_late_slack", "window", "window_keep",
              "idle_window")


class ReplaySettings(ServiceSettings):
    # Allocation snapshots and inventory are read from this far before the first instant replayed
    # (and further back, until each node's last snapshot before it is found).
    replay_lookback: str = "1h"
    # Telemetry and XIDs are read from this far before --from, so window and idle state are warm at --from.
    replay_window_lookback: str = "10m"
    # A partition is read until a record this far past --to (records arrive a little out of order).
    replay_late_slack: str = "5m"
    # The joiner's row settings (same environment variables).
    window: str = "1m"
    window_keep: str = "1h"
    idle_window: str = "10m"
    idle_threshold: float = 5.0

    @field_validator(*_DURATIONS)
    @classmethod
    def _duration(cls, value: str) -> str:
        if parse_duration_ms(value) < 0:  # raises ValueError with a readable message
            raise ValueError("must not be negative")
        return value

    @field_validator("idle_threshold")
    @classmethod
    def _pct(cls, value: float) -> float:
        if not 0 <= value <= 100:
            raise ValueError("must be a percentage between 0 and 100")
        return value

    def ms(self, name: str) -> int:
        value: Any = getattr(self, name)
        return parse_duration_ms(str(value))

    def engine_config(self) -> EngineConfig:
        rows = RowConfig(window_ms=self.ms("window"), window_keep_ms=self.ms("window_keep"),
                         idle_window_ms=self.ms("idle_window"), idle_threshold_pct=self.idle_threshold)
        return EngineConfig(rows=rows)
