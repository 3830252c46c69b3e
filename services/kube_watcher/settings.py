"""Settings of the kube_watcher (env prefix PERISCOPE_, e.g. PERISCOPE_OPERATOR_NAMESPACE).

Durations accept the project's duration strings (`90s`, `5m`) or plain seconds.
"""

from __future__ import annotations

from typing import Any

from pydantic import field_validator

from periscope.config import ServiceSettings, seconds


class WatcherSettings(ServiceSettings):
    kubeconfig: str | None = None  # unset: in-cluster service account
    operator_namespace: str = "gpu-operator"  # where the GPU Operator's operand DaemonSets live
    leader_election: bool = False
    lease_namespace: str = "default"
    lease_name: str = "periscope-kube-watcher"
    lease_duration: float = 15.0
    lease_renew: float = 5.0
    identity: str = ""  # leader-election identity; default: hostname + process id
    health_host: str = "127.0.0.1"
    health_port: int = 9402
    watch_timeout: float = 300.0  # server-side timeoutSeconds of one watch request
    unavailable_retry: float = 30.0  # how often to look again for a missing CRD / API group
    list_page_size: int = 500  # objects per page of a (re)list (limit/continue), as client-go's default
    clock: str = "wall"  # "wall" or "sim:<origin_ms>:<speed>" (simulated cluster)

    @field_validator("lease_duration", "lease_renew", "watch_timeout", "unavailable_retry", mode="before")
    @classmethod
    def _parse_duration(cls, value: Any) -> Any:
        return seconds(value)

    @field_validator("lease_duration", "lease_renew", "watch_timeout", "unavailable_retry")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be a positive duration")
        return value

    @field_validator("list_page_size")
    @classmethod
    def _page(cls, value: int) -> int:
        if value < 1:
            raise ValueError("must be at least 1")
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
