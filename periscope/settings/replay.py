"""Settings of `periscope replay` and of /v1/owners' replays (env prefix PERISCOPE_, e.g.
PERISCOPE_REPLAY_LOOKBACK).

The engine settings are the joiner's own (periscope.settings.engine: PERISCOPE_WINDOW,
PERISCOPE_IDLE_WINDOW, PERISCOPE_LATENESS, PERISCOPE_HEARTBEAT, ...), so one environment gives the live
joiner and replay the same engine configuration, and so the same outputs. Durations accept the
project's duration strings (`90s`, `10m`, `2h`) or plain seconds.
"""

from __future__ import annotations

from pydantic import Field

from periscope.bus.settings import ServiceSettings
from periscope.config import NonNegativeDuration
from periscope.settings.engine import EngineSettings


class ReplaySettings(ServiceSettings, EngineSettings):
    replay_lookback: NonNegativeDuration = Field(default=3600.0, description=(
        "allocation snapshots and inventory are read from this far before the first instant replayed (and "
        "further back, until each node's last snapshot before it is found)"))
    replay_window_lookback: NonNegativeDuration = Field(default=600.0, description=(
        "telemetry and XIDs are read from this far before --from, so window and idle state are warm there"))
    replay_late_slack: NonNegativeDuration = Field(default=300.0, description=(
        "a partition is read until a record this far past --to (records arrive a little out of order)"))
    replay_workers: int = Field(default=0, ge=0, le=1024, description=(
        "worker processes replaying nodes side by side (0: one per CPU this process may use; 1: none)"))

    def ms(self, name: str) -> int:
        value: float = getattr(self, name)
        return round(value * 1000)
