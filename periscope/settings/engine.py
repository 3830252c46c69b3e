"""The attribution knobs the joiner and `periscope replay` share, and the idle rule the API shares with
them: the same variables (PERISCOPE_WINDOW, PERISCOPE_IDLE_WINDOW, ...), so one environment gives the
live joiner, replay and /v1/idle the same answers. Durations accept `90s`, `10m`, `2h` or plain seconds."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings

from periscope.config import MODEL_CONFIG, NonNegativeDuration, PositiveDuration
from periscope.core.changes import ChangeConfig
from periscope.core.engine import DEFAULT_CONFIG, EngineConfig
from periscope.core.idle import DEFAULT_RULE, IdleRule
from periscope.core.rows import RowConfig


def ms(value: float) -> int:
    return round(value * 1000)


class IdleSettings(BaseSettings):
    model_config = MODEL_CONFIG

    idle_window: PositiveDuration = Field(default=DEFAULT_RULE.window_ms / 1000, description=(
        "a row is idle when its average utilization over this span stays below idle_threshold (the "
        "joiner's flags; /v1/idle's default window)"))
    idle_threshold: float = Field(default=DEFAULT_RULE.threshold_pct, ge=0.0, le=100.0, description=(
        "percent utilization below which a row counts as idle (/v1/idle's default threshold)"))

    def idle_rule(self) -> IdleRule:
        return IdleRule(threshold_pct=self.idle_threshold, window_ms=ms(self.idle_window))


class EngineSettings(IdleSettings):
    window: PositiveDuration = Field(default=60.0, description=(
        "tumbling window of the per-row aggregates (event time)"))
    window_keep: PositiveDuration = Field(default=3600.0, description=(
        "how much window history each row keeps"))
    lateness: NonNegativeDuration = Field(default=DEFAULT_CONFIG.lateness_ms / 1000, description=(
        "how far behind a node's newest probe event a sample may arrive and still count"))
    heartbeat: NonNegativeDuration = Field(default=5.0, description=(
        "an unchanged pod attribution or GPU state is published again after this much event time "
        "(changes beyond the core's thresholds, ownership and closed windows are published at once)"))

    @model_validator(mode="after")
    def _windows(self) -> EngineSettings:
        if ms(self.window) < 1:
            raise ValueError("window must be at least 1ms")
        if self.window_keep < self.window:
            raise ValueError("window_keep must be at least one window")
        return self

    def engine_config(self, **more: Any) -> EngineConfig:
        """The core's configuration from these settings (`more`: EngineConfig fields a service adds)."""
        return EngineConfig(
            rows=RowConfig(window_ms=ms(self.window), window_keep_ms=ms(self.window_keep),
                           idle_window_ms=ms(self.idle_window), idle_threshold_pct=self.idle_threshold),
            lateness_ms=ms(self.lateness), changes=ChangeConfig(heartbeat_ms=ms(self.heartbeat)), **more)
