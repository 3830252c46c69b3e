"""Settings of the joiner (env prefix PERISCOPE_, e.g. PERISCOPE_IDLE_WINDOW).

Durations accept the project's duration strings (`1m`, `10m`, `500ms`) or plain seconds. The
attribution knobs (windows, idle detection, lateness, heartbeat: periscope.settings.engine) become the
pure core's `EngineConfig`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from periscope.bus.settings import ServiceSettings
from periscope.clock import clock_from_setting
from periscope.config import Duration, PositiveDuration
from periscope.core.engine import EngineConfig
from periscope.core.watermark import ALL_STREAMS, OWNER_STREAMS
from periscope.settings.engine import EngineSettings, ms


class JoinerSettings(ServiceSettings, EngineSettings):
    app_id: str = Field(default="periscope-joiner", description=(
        "Faust application id: the consumer group and the prefix of the changelog topics"))
    align: Literal["all", "owners", "off"] = Field(default="all", description=(
        "event-time alignment across a node's input topics (periscope/core/watermark.py): a sample or an XID "
        "is joined only once the node's other inputs were read through its time or are at their end. `all` "
        "joins in event-time order whatever the delivery (live outputs equal replay's); `owners` waits for "
        "allocations and pods only; `off` joins on arrival (a lagging worker names wrong owners)"))
    max_hold: PositiveDuration = Field(default=600.0, description=(
        "an input stream silent this long (event time) stops holding the others"))
    # One record stamped years ahead would otherwise move its node's event time so far that every real
    # sample after it looks late.
    future_skew: PositiveDuration = Field(default=600.0, description=(
        "a record whose event time is further ahead of the broker's time of the record is dead-lettered; "
        "the broker's time is read through `clock`"))
    clock: str = Field(default="wall", description=(
        "how the broker's time is read: `wall`, or `sim:<origin_ms>:<speed>` under `periscope up` (a faster "
        "simulation)"))
    state_persist_interval: PositiveDuration = Field(default=5.0, description=(
        "telemetry-driven row state is persisted once per interval, each node at its own point in it (so "
        "that nodes started together do not all persist at once), and once its samples moved on by the "
        "interval too (a worker catching up on many nodes moves each slower than the clock; a node whose "
        "samples stand still persists after 6 intervals), 6 times as far apart while the worker catches up "
        "on the node; pod, allocation and inventory changes at once"))
    web_host: str = Field(default="127.0.0.1", description="address of /healthz, /readyz and /metrics")
    web_port: int = Field(default=9403, ge=0, le=65535, description=(
        "their port; 0: any free port (printed at start)"))
    data_dir: str = Field(default="", description=(
        "Faust's datadir; empty: a fresh temporary directory per process"))
    session_timeout: Duration = Field(default=10.0, description=(
        "consumer-group liveness: a dead worker's partitions move after this long; some brokers also hold "
        "every first JoinGroup for half of it, so it bounds the start-up time too (at least 1s)"))
    standby_replicas: int = Field(default=0, ge=0, le=16, description="Faust table standbys on other workers")
    stale_after: PositiveDuration = Field(default=30.0, description=(
        "/readyz is 503 when no input record was handled for longer than this since the last partition "
        "assignment (probes tick every second, so a working pipeline never goes that long)"))

    @field_validator("clock")
    @classmethod
    def _clock(cls, value: str) -> str:
        clock_from_setting(value)  # raises ValueError naming the bad part
        return value

    @field_validator("session_timeout")
    @classmethod
    def _session(cls, value: float) -> float:
        if value < 1:
            raise ValueError("must be at least 1s")
        return value

    @field_validator("app_id")
    @classmethod
    def _app_id(cls, value: str) -> str:
        value = value.strip()
        if not value or any(c.isspace() or c == "/" for c in value):
            raise ValueError("must be a non-empty name without spaces or '/'")
        return value

    def engine_config(self, **more: Any) -> EngineConfig:
        return super().engine_config(
            align={"all": ALL_STREAMS, "owners": OWNER_STREAMS, "off": frozenset()}[self.align],
            max_hold_ms=ms(self.max_hold), **more)
