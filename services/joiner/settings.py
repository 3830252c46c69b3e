"""Settings of the joiner (env prefix PERISCOPE_, e.g. PERISCOPE_IDLE_WINDOW).

Durations accept the project's duration strings (`1m`, `10m`, `500ms`) or plain seconds. The
attribution knobs (windows, idle detection, lateness, heartbeat) become the pure core's `EngineConfig`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from periscope.clock import clock_from_setting
from periscope.config import ServiceSettings, seconds
from periscope.core.changes import ChangeConfig
from periscope.core.engine import EngineConfig
from periscope.core.rows import RowConfig
from periscope.core.watermark import ALL_STREAMS, OWNER_STREAMS


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


class JoinerSettings(ServiceSettings):
    app_id: str = "periscope-joiner"  # Faust application id: consumer group and changelog topic prefix
    window: float = 60.0  # tumbling window of the per-row aggregates (event time)
    window_keep: float = 3600.0  # how much window history each row keeps
    idle_window: float = 600.0  # a row is idle when its average utilization over this span ...
    idle_threshold: float = Field(default=5.0, ge=0.0, le=100.0)  # ... stays below this percentage
    lateness: float = 1.0  # how far behind a node's newest probe event a sample may arrive
    # Event-time alignment across a node's input topics (periscope/core/watermark.py): a sample or an
    # XID is joined only once the node's other inputs were read through its time or are at their end.
    # `all` joins in event-time order whatever the delivery (live outputs equal replay's); `owners` waits
    # for allocations and pods only; `off` joins on arrival (a lagging worker names wrong owners).
    align: Literal["all", "owners", "off"] = "all"
    max_hold: float = 600.0  # an input stream silent this long (event time) stops holding the others
    # A record whose event time is further ahead of the broker's time of the record is dead-lettered: one
    # record stamped years ahead would otherwise move its node's event time so far that every real
    # sample after it looks late. The broker's time is read through `clock` (see periscope.clock).
    future_skew: float = 600.0
    clock: str = "wall"  # "wall", or "sim:<origin_ms>:<speed>" under `periscope up` (a faster simulation)
    # An unchanged pod attribution or GPU state is published again after this much event time (changes
    # beyond the core's thresholds, ownership and closed windows are published at once).
    heartbeat: float = Field(default=5.0, ge=0.0)
    state_persist_interval: float = 5.0  # at most this often, telemetry-driven row state is persisted
    web_host: str = "127.0.0.1"
    web_port: int = Field(default=9403, ge=0, le=65535)  # 0: any free port (printed at start)
    data_dir: str = ""  # Faust's datadir; empty: a fresh temporary directory per process
    # Consumer-group liveness. A dead worker's partitions move after this long; some brokers also hold
    # every first JoinGroup for half of it, so it bounds the start-up time too.
    session_timeout: float = 10.0
    standby_replicas: int = Field(default=0, ge=0)  # Faust table standbys on other workers
    # /readyz is 503 when no input record was handled for longer than this since the last partition
    # assignment (probes tick every second, so a working pipeline never goes that long).
    stale_after: float = Field(default=30.0, gt=0.0)

    @field_validator(
        "window", "window_keep", "idle_window", "lateness", "heartbeat", "state_persist_interval",
        "session_timeout", "stale_after", "max_hold", "future_skew", mode="before",
    )
    @classmethod
    def _parse_duration(cls, value: Any) -> Any:
        return seconds(value)

    @field_validator("window", "window_keep", "idle_window", "state_persist_interval", "max_hold",
                     "future_skew")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be a positive duration")
        return value

    @field_validator("lateness")
    @classmethod
    def _not_negative(cls, value: float) -> float:
        if value < 0:
            raise ValueError("must not be negative")
        return value

    @field_validator("session_timeout")
    @classmethod
    def _session(cls, value: float) -> float:
        if value < 1:
            raise ValueError("must be at least 1s")
        return value

    @field_validator("clock")
    @classmethod
    def _clock(cls, value: str) -> str:
        clock_from_setting(value)  # raises ValueError naming the bad part
        return value

    @field_validator("app_id")
    @classmethod
    def _app_id(cls, value: str) -> str:
        value = value.strip()
        if not value or any(c.isspace() or c == "/" for c in value):
            raise ValueError("must be a non-empty name without spaces or '/'")
        return value

    @model_validator(mode="after")
    def _windows(self) -> JoinerSettings:
        if self.window_keep < self.window:
            raise ValueError("window_keep must be at least one window")
        if _ms(self.window) < 1:
            raise ValueError("window must be at least 1ms")
        return self

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            rows=RowConfig(
                window_ms=_ms(self.window),
                window_keep_ms=_ms(self.window_keep),
                idle_window_ms=_ms(self.idle_window),
                idle_threshold_pct=self.idle_threshold,
            ),
            lateness_ms=_ms(self.lateness),
            changes=ChangeConfig(heartbeat_ms=_ms(self.heartbeat)),
            align={"all": ALL_STREAMS, "owners": OWNER_STREAMS, "off": frozenset()}[self.align],
            max_hold_ms=_ms(self.max_hold),
        )
