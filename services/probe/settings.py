"""Settings of the node probe (env prefix PERISCOPE_, e.g. PERISCOPE_NODE_NAME).

Durations accept the project's duration strings (`1s`, `500ms`, `5s`) or plain seconds. Paths that
derive from the kubelet root are filled in after validation when left empty, so overriding
KUBELET_ROOT alone moves the socket and the checkpoint with it.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from pydantic import field_validator, model_validator

from periscope.clock import clock_from_setting
from periscope.config import ServiceSettings, seconds


class ProbeSettings(ServiceSettings):
    node_name: str = ""
    kubelet_root: str = "/var/lib/kubelet"
    podresources_socket: str = ""
    checkpoint_path: str = ""
    proc_root: str = "/proc"
    tick: float = 1.0
    allocation_interval: float = 5.0
    # The inventory is republished at least this often even when nothing changed: the API believes GPU
    # states only of GPUs an inventory on the topic reported, so one must stay within its retention.
    inventory_interval: float = 3600.0
    # How often PodResources `List` is asked when nothing signals a change (the checkpoint file changed,
    # the socket was replaced, the checkpoint is unusable, a call failed). Unset: twice the tick, at most
    # allocation_interval. It bounds how late a pod's end or a DRA claim shows in the snapshot.
    podresources_interval: float | None = None
    nvml_backend: str = "pynvml"
    buffer_limit: int = 1000
    health_host: str = "127.0.0.1"
    health_port: int = 9401
    # How long one publish may take before the broker counts as unreachable.
    send_timeout: float = 5.0
    # /readyz is 503 while buffered events have waited longer than this for the broker.
    stale_after: float = 30.0
    # Event-time source: "wall", or "sim:<origin_ms>:<speed>" when a simulated cluster runs faster.
    clock: str = "wall"
    # The node's dcgm-exporter (`http://HOST:9400/metrics`): MIG utilization and DCGM's profiling fields.
    # Empty (the default): not scraped. Scraped every dcgm_interval (unset: 5 s, or the tick if longer:
    # the exporter itself refreshes every 30 s by default; a MIG node's scrape costs ~5-8 ms of CPU, see
    # bench/README.md), in a task of its own, each scrape bounded by dcgm_timeout and dcgm_max_bytes;
    # values two failed scrapes old are dropped.
    dcgm_exporter_url: str = ""
    dcgm_interval: float | None = None
    dcgm_timeout: float = 0.5
    dcgm_max_bytes: int = 8 * 1024 * 1024

    @field_validator("tick", "allocation_interval", "send_timeout", "stale_after", "inventory_interval",
                     mode="before")
    @classmethod
    def _parse_duration(cls, value: Any) -> Any:
        return seconds(value)

    @field_validator("tick", "allocation_interval", "send_timeout", "stale_after", "inventory_interval")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be a positive duration")
        return value

    @field_validator("dcgm_timeout", mode="before")
    @classmethod
    def _parse_timeout(cls, value: Any) -> Any:
        return seconds(value)

    @field_validator("dcgm_timeout")
    @classmethod
    def _timeout(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be a positive duration")
        return value

    @field_validator("dcgm_exporter_url")
    @classmethod
    def _dcgm_url(cls, value: str) -> str:
        value = value.strip()
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL (e.g. http://127.0.0.1:9400/metrics)")
        return value

    @field_validator("dcgm_max_bytes")
    @classmethod
    def _max_bytes(cls, value: int) -> int:
        if value < 1024:
            raise ValueError("must be at least 1024")
        return value

    def dcgm_every(self) -> float:
        """The dcgm-exporter scrape period in effect (see dcgm_interval)."""
        return self.dcgm_interval if self.dcgm_interval is not None else max(self.tick, 5.0)

    @field_validator("podresources_interval", "dcgm_interval", mode="before")
    @classmethod
    def _optional_duration(cls, value: Any) -> Any:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        parsed = seconds(value)
        if isinstance(parsed, (int, float)) and parsed <= 0:
            raise ValueError("must be a positive duration")
        return parsed

    def podresources_every(self) -> float:
        """The PodResources List period in effect (see podresources_interval)."""
        if self.podresources_interval is not None:
            return self.podresources_interval
        return min(2 * self.tick, self.allocation_interval)

    @field_validator("buffer_limit")
    @classmethod
    def _limit(cls, value: int) -> int:
        if value < 2:
            raise ValueError("must be at least 2")
        return value

    @field_validator("health_port")
    @classmethod
    def _port(cls, value: int) -> int:
        if not 0 <= value <= 65535:
            raise ValueError("must be a TCP port (0-65535)")
        return value

    @field_validator("nvml_backend")
    @classmethod
    def _backend(cls, value: str) -> str:
        if value != "pynvml" and not (value.startswith("fake:") and len(value) > len("fake:")):
            raise ValueError("must be 'pynvml' or 'fake:<state-file>'")
        return value

    @field_validator("clock")
    @classmethod
    def _clock(cls, value: str) -> str:
        clock_from_setting(value)  # raises ValueError naming the bad part
        return value

    @model_validator(mode="after")
    def _derive_paths(self) -> ProbeSettings:
        root = Path(self.kubelet_root)
        if not self.podresources_socket:
            self.podresources_socket = str(root / "pod-resources" / "kubelet.sock")
        if not self.checkpoint_path:
            self.checkpoint_path = str(root / "device-plugins" / "kubelet_internal_checkpoint")
        if not self.node_name:
            self.node_name = socket.gethostname()
        return self
