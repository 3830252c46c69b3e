"""Settings of the kube_watcher (env prefix PERISCOPE_, e.g. PERISCOPE_OPERATOR_NAMESPACE).

Durations accept the project's duration strings (`90s`, `5m`) or plain seconds.
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from periscope.bus.settings import ServiceSettings
from periscope.config import PositiveDuration


class WatcherSettings(ServiceSettings):
    kubeconfig: str | None = Field(default=None, description=(
        "a kubeconfig file; unset: the in-cluster service account"))
    operator_namespace: str = Field(default="gpu-operator", description=(
        "where the GPU Operator's operand DaemonSets live"))
    leader_election: bool = Field(default=False, description=(
        "run as one of several replicas, one active (a Lease)"))
    lease_namespace: str = Field(default="default", description="namespace of the leader-election Lease")
    lease_name: str = Field(default="periscope-kube-watcher", description="name of the leader-election Lease")
    lease_duration: PositiveDuration = Field(default=15.0, description=(
        "how long a leader's Lease holds without renewal"))
    lease_renew: PositiveDuration = Field(default=5.0, description="how often the leader renews its Lease")
    identity: str = Field(default="", description="leader-election identity; empty: host name + process id")
    health_host: str = Field(default="127.0.0.1", description="address of /healthz, /readyz and /metrics")
    health_port: int = Field(default=9402, description="their port")
    watch_timeout: PositiveDuration = Field(default=300.0, description=(
        "server-side timeoutSeconds of one watch request"))
    unavailable_retry: PositiveDuration = Field(default=30.0, description=(
        "how often to look again for a missing CRD / API group"))
    list_page_size: int = Field(default=500, description=(
        "objects per page of a (re)list (limit/continue), as client-go's default"))
    clock: str = Field(default="wall", description="`wall` or `sim:<origin_ms>:<speed>` (simulated cluster)")

    @field_validator("list_page_size")
    @classmethod
    def _page(cls, value: int) -> int:
        if not 1 <= value <= 100_000:
            raise ValueError("must be 1 to 100000")
        return value

    @field_validator("health_port")
    @classmethod
    def _port(cls, value: int) -> int:
        if not 0 <= value <= 65535:
            raise ValueError("must be a TCP port (0-65535)")
        return value

    @field_validator("operator_namespace", "lease_namespace", "lease_name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value.strip()

    @model_validator(mode="after")
    def _lease(self) -> WatcherSettings:
        if self.lease_renew >= self.lease_duration:
            raise ValueError("lease_renew must be shorter than lease_duration")
        return self
