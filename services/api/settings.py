"""Settings of the query API service (env prefix PERISCOPE_, e.g. PERISCOPE_API_PORT)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from periscope.clock import clock_from_setting
from periscope.config import ServiceSettings, seconds
from periscope.core.duration import parse_duration_ms
from services.api.evidence import Evidence
from services.api.owners import OwnersLimits


class ApiSettings(ServiceSettings):
    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8080, ge=0, le=65535)
    # Each replica joins its own consumer group (prefix + random suffix) and reads every output topic
    # from the beginning without committing, so replicas stay stateless and identical.
    api_group_prefix: str = "periscope-api-"
    # How long the view keeps what is over (released pods, cleared findings, XIDs, vanished GPUs),
    # in event time. Replay answers older questions from the input topics.
    api_retention: str = "24h"
    # How long (event time) each row keeps its merged window stats, which /v1/idle recomputes over and
    # /v1/pods/{uid} lists. The joiner sends each window once, as it closes, so only the API holds them.
    api_window_retention: str = "1h"
    # /readyz turns 503 when no new attribution reached the view for longer than this (or the broker
    # is unreachable): a stale view is not ready, even though it keeps answering.
    api_stale_after: float = 30.0
    # Records the API refuses (services.api.evidence): an event time further ahead of its clock than
    # this, and GPU states or findings naming a GPU no probe's inventory reported (unless turned off).
    api_future_skew: str = "10m"
    api_require_inventory: bool = True
    # Event-time clock: "wall", or "sim:<origin_ms>:<speed>" under `periscope up` (a faster simulation).
    clock: str = "wall"

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
    # Access control (services.api.auth): "kubernetes" checks bearer tokens with TokenReview and
    # namespaces with SubjectAccessReview against the apiserver of `kubeconfig` (empty: in-cluster).
    api_auth: Literal["none", "kubernetes"] = "none"
    api_auth_cache_ttl: str = "30s"  # how long a review's answer is kept (a rejected token: at most 5s)
    api_auth_cache_size: int = Field(default=10_000, ge=1)
    # Load the apiserver can get from callers: SubjectAccessReviews per user per cache TTL, and rejected
    # bearer tokens per client address per minute (beyond either: 429 with Retry-After).
    api_auth_review_budget: int = Field(default=1_000, ge=1)
    api_auth_failure_budget: int = Field(default=20, ge=1)
    kubeconfig: str = ""
    # GET /v1/owners replays the input topics per query: this many run at once, this many more wait
    # (beyond: 429 with Retry-After), none waits and runs longer than the timeout (503), and an
    # identical query within the cache TTL gets the same answer without a replay.
    api_owners_concurrency: int = Field(default=2, ge=1, le=64)
    api_owners_queue: int = Field(default=8, ge=0, le=10_000)
    api_owners_timeout: str = "30s"
    api_owners_cache_ttl: str = "10s"
    # HTTPS when both are set (PEM files).
    api_tls_certfile: str = ""
    api_tls_keyfile: str = ""

    @field_validator("clock")
    @classmethod
    def _clock(cls, v: str) -> str:
        clock_from_setting(v)
        return v

    @field_validator("api_retention", "api_window_retention", "api_auth_cache_ttl", "api_owners_timeout",
                     "api_future_skew")
    @classmethod
    def _duration(cls, v: str) -> str:
        if parse_duration_ms(v) <= 0:
            raise ValueError("must be longer than 0s")
        return v

    @field_validator("api_owners_cache_ttl")
    @classmethod
    def _zero_or_more(cls, v: str) -> str:
        if v.strip() not in ("0", "0s") and parse_duration_ms(v) <= 0:
            raise ValueError("must be 0 (no cache) or a positive duration")
        return v

    @model_validator(mode="after")
    def _tls_pair(self) -> ApiSettings:
        if bool(self.api_tls_certfile) != bool(self.api_tls_keyfile):
            raise ValueError("api_tls_certfile and api_tls_keyfile must be set together")
        return self

    @property
    def tls(self) -> bool:
        return bool(self.api_tls_certfile)

    @property
    def auth_ttl_s(self) -> float:
        return parse_duration_ms(self.api_auth_cache_ttl) / 1000

    def evidence(self) -> Evidence:
        clock = clock_from_setting(self.clock)
        return Evidence(clock.now_ms, parse_duration_ms(self.api_future_skew),
                        require_inventory=self.api_require_inventory)

    def owners_limits(self) -> OwnersLimits:
        ttl = self.api_owners_cache_ttl.strip()
        return OwnersLimits(
            concurrency=self.api_owners_concurrency,
            queue=self.api_owners_queue,
            timeout_s=parse_duration_ms(self.api_owners_timeout) / 1000,
            cache_ttl_s=0.0 if ttl in ("0", "0s") else parse_duration_ms(ttl) / 1000,
        )

    @property
    def retention_ms(self) -> int:
        return parse_duration_ms(self.api_retention)

    @property
    def window_retention_ms(self) -> int:
        return parse_duration_ms(self.api_window_retention)
