"""Settings of the query API service (env prefix PERISCOPE_, e.g. PERISCOPE_API_PORT).

Durations accept the project's duration strings (`24h`, `30s`) or plain seconds. The idle rule
/v1/idle judges by when its caller names none is the joiner's own (PERISCOPE_IDLE_WINDOW,
PERISCOPE_IDLE_THRESHOLD: periscope.settings.engine).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from periscope.bus.settings import ServiceSettings
from periscope.clock import clock_from_setting
from periscope.config import NonNegativeDuration, PositiveDuration
from periscope.settings.engine import IdleSettings


class ApiSettings(ServiceSettings, IdleSettings):
    api_host: str = Field(default="127.0.0.1", description="listen address")
    api_port: int = Field(default=8080, ge=0, le=65535, description="listen port")
    api_group_prefix: str = Field(default="periscope-api-", description=(
        "each replica joins its own consumer group (prefix + random suffix) and reads every output topic "
        "from the beginning without committing, so replicas stay stateless and identical"))
    api_retention: PositiveDuration = Field(default=86_400.0, description=(
        "how long the view keeps what is over (released pods, cleared findings, XIDs, vanished GPUs), in "
        "event time; replay answers older questions from the input topics"))
    api_window_retention: PositiveDuration = Field(default=3600.0, description=(
        "how long (event time) each row keeps its merged window stats, which /v1/idle judges over and "
        "/v1/pods/{uid} lists (the joiner sends each window once, as it closes: only the API holds them)"))
    api_stale_after: PositiveDuration = Field(default=30.0, description=(
        "/readyz turns 503 when no new attribution reached the view for longer than this (or the broker is "
        "unreachable): a stale view is not ready, even though it keeps answering"))
    api_future_skew: PositiveDuration = Field(default=600.0, description=(
        "records with an event time further ahead of the API's clock than this are refused"))
    api_require_inventory: bool = Field(default=True, description=(
        "refuse GPU states and findings naming a GPU no probe's inventory reported"))
    clock: str = Field(default="wall", description=(
        "event-time clock: `wall`, or `sim:<origin_ms>:<speed>` under `periscope up` (a faster simulation)"))
    api_auth: Literal["none", "kubernetes"] = Field(default="none", description=(
        "`kubernetes`: check bearer tokens with TokenReview and namespaces with SubjectAccessReview against "
        "the apiserver of `kubeconfig` (empty: in-cluster); `none`: no access control"))
    api_auth_cache_ttl: PositiveDuration = Field(default=30.0, description=(
        "how long a review's answer is kept (a rejected token's: at most 5s)"))
    api_auth_cache_size: int = Field(default=10_000, ge=1, le=10_000_000, description="reviews' answers kept")
    api_auth_review_budget: int = Field(default=1_000, ge=1, le=1_000_000, description=(
        "SubjectAccessReviews per user per cache TTL (beyond: 429 with Retry-After)"))
    api_auth_failure_budget: int = Field(default=20, ge=1, le=1_000_000, description=(
        "rejected bearer tokens per client address per minute (beyond: 429 with Retry-After)"))
    kubeconfig: str = Field(default="", description="the apiserver to review access with; empty: in-cluster")
    api_owners_concurrency: int = Field(default=2, ge=1, le=64, description=(
        "GET /v1/owners replays running at once"))
    api_owners_queue: int = Field(default=8, ge=0, le=10_000, description=(
        "/v1/owners queries waiting for a replay; beyond: 429 with Retry-After"))
    api_owners_timeout: PositiveDuration = Field(default=30.0, description=(
        "longest a /v1/owners query waits and runs in all; then 503 with Retry-After"))
    api_owners_cache_ttl: NonNegativeDuration = Field(default=10.0, description=(
        "an identical /v1/owners query within this long gets the same answer without a replay (0s: no "
        "cache)"))
    api_tls_certfile: str = Field(default="", description="HTTPS certificate (PEM), with api_tls_keyfile")
    api_tls_keyfile: str = Field(default="", description="its private key (PEM)")

    @field_validator("clock")
    @classmethod
    def _clock(cls, v: str) -> str:
        clock_from_setting(v)
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
        return self.api_auth_cache_ttl

    @property
    def future_skew_ms(self) -> int:
        return round(self.api_future_skew * 1000)

    @property
    def owners_timeout_s(self) -> float:
        return self.api_owners_timeout

    @property
    def owners_cache_ttl_s(self) -> float:
        return self.api_owners_cache_ttl

    @property
    def retention_ms(self) -> int:
        return round(self.api_retention * 1000)

    @property
    def window_retention_ms(self) -> int:
        return round(self.api_window_retention * 1000)
