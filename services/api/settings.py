"""Settings of the query API service (env prefix PERISCOPE_, e.g. PERISCOPE_API_PORT)."""

from __future__ import annotations

from pydantic import Field, field_validator

from periscope.config import ServiceSettings, seconds
from periscope.core.duration import parse_duration_ms


class ApiSettings(ServiceSettings):
    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8080, ge=0, le=65535)
    # Each replica joins its own consumer group (prefix + random suffix) and reads every output topic
    # from the beginning without committing, so replicas stay stateless and identical.
    api_group_prefix: str = "periscope-api-"
    # How long the view keeps what is over (released pods, cleared findings, XIDs, vanished GPUs),
    # in event time. Replay answers older questions from the input topics.
    api_retention: str = "24h"
    # /readyz turns 503 when no new attribution reached the view for longer than this (or the broker
    # is unreachable): a stale view is not ready, even though it keeps answering.
    api_stale_after: float = 30.0

    @field_validator("api_stale_after", mode="before")
    @classmethod
    def _stale_after(cls, v: object) -> object:
        return seconds(v)

    @field_validator("api_stale_after")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("must be a positive duration")
        return v

    @field_validator("api_retention")
    @classmethod
    def _duration(cls, v: str) -> str:
        if parse_duration_ms(v) <= 0:
            raise ValueError("must be longer than 0s")
        return v

    @property
    def retention_ms(self) -> int:
        return parse_duration_ms(self.api_retention)
