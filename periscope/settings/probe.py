"""Settings of the node probe (env prefix PERISCOPE_, e.g. PERISCOPE_NODE_NAME).

Durations accept the project's duration strings (`1s`, `500ms`, `5s`) or plain seconds. Paths that
derive from the kubelet root are filled in after validation when left empty, so overriding
KUBELET_ROOT alone moves the socket and the checkpoint with it.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from periscope.bus.settings import ServiceSettings
from periscope.clock import clock_from_setting
from periscope.config import PositiveDuration, positive, seconds


class ProbeSettings(ServiceSettings):
    node_name: str = Field(default="", description="this node's name (the record key); empty: the host name")
    kubelet_root: str = Field(default="/var/lib/kubelet", description="the kubelet's state directory")
    podresources_socket: str = Field(default="", description=(
        "the kubelet PodResources socket; empty: <kubelet_root>/pod-resources/kubelet.sock"))
    checkpoint_path: str = Field(default="", description=(
        "the device manager checkpoint; empty: <kubelet_root>/device-plugins/kubelet_internal_checkpoint"))
    proc_root: str = Field(default="/proc", description="the host's /proc (processes' cgroups)")
    tick: PositiveDuration = Field(default=1.0, description="telemetry period")
    allocation_interval: PositiveDuration = Field(default=5.0, description=(
        "an unchanged allocation snapshot is published again after this long"))
    inventory_interval: PositiveDuration = Field(default=3600.0, description=(
        "the inventory is republished at least this often even when nothing changed: the API believes GPU "
        "states only of GPUs an inventory on the topic reported, so one must stay within its retention"))
    podresources_interval: float | None = Field(default=None, description=(
        "how often PodResources `List` is asked when nothing signals a change (the checkpoint file changed, "
        "the socket was replaced, the checkpoint is unusable, a call failed); unset: twice the tick, at most "
        "allocation_interval. It bounds how late a pod's end or a DRA claim shows in the snapshot"))
    nvml_backend: str = Field(default="pynvml", description=(
        "`pynvml` (the NVIDIA driver's NVML), or `fake:<state-file>`: a registered NVML fake (the "
        "development kit's simulated GPUs), found through the `periscope.nvml` entry points"))
    buffer_limit: int = Field(default=1000, ge=2, le=1_000_000, description=(
        "events kept while the broker is unreachable (the oldest telemetry goes first)"))
    health_host: str = Field(default="127.0.0.1", description="address of /healthz, /readyz and /metrics")
    health_port: int = Field(default=9401, ge=0, le=65535, description="their port")
    send_timeout: PositiveDuration = Field(default=5.0, description=(
        "how long one publish may take before the broker counts as unreachable"))
    stale_after: PositiveDuration = Field(default=30.0, description=(
        "/readyz is 503 while buffered events have waited longer than this for the broker"))
    clock: str = Field(default="wall", description=(
        "event-time source: `wall`, or `sim:<origin_ms>:<speed>` when a simulated cluster runs faster"))
    dcgm_exporter_url: str = Field(default="", description=(
        "the node's dcgm-exporter (`http://HOST:9400/metrics`): MIG utilization and DCGM's profiling fields; "
        "empty: not scraped"))
    # The exporter itself refreshes every 30 s by default, hence a period of its own; a MIG node's
    # scrape costs ~5-8 ms of CPU, in a task of its own (bench/README.md).
    dcgm_interval: float | None = Field(default=None, description=(
        "how often the dcgm-exporter is scraped; unset: 5 s, or the tick if longer. Values two failed "
        "scrapes old are dropped"))
    dcgm_timeout: PositiveDuration = Field(default=0.5, description=(
        "how long one dcgm-exporter scrape may take"))
    dcgm_max_bytes: int = Field(default=8 * 1024 * 1024, description=(
        "the largest dcgm-exporter exposition read (at least 1024)"))

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
        return positive(parsed) if isinstance(parsed, int | float) else parsed

    def podresources_every(self) -> float:
        """The PodResources List period in effect (see podresources_interval)."""
        if self.podresources_interval is not None:
            return self.podresources_interval
        return min(2 * self.tick, self.allocation_interval)

    @field_validator("nvml_backend")
    @classmethod
    def _backend(cls, value: str) -> str:
        # `<name>:<argument>`: a stand-in registered under the `periscope.nvml` entry points; whether one
        # is installed under that name is known only when the probe opens it (services.probe.nvml_source).
        name, sep, argument = value.partition(":")
        if value != "pynvml" and not (sep and name.isidentifier() and argument):
            raise ValueError("must be 'pynvml' or '<registered fake>:<argument>' such as 'fake:<state-file>'")
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
