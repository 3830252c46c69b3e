"""The frozen specs a scenario file parses into, and the vocabularies its fields draw from.

A `Scenario` holds the simulated cluster's nodes (with their GPUs, MIG instances, sharing and checkpoint
format), the pods placed on them with each container's utilisation steps, the Xid errors and faults to
inject, and an optional GPU Operator ClusterPolicy. Everything here is plain immutable data plus the small
queries the simulator asks of it (which resources a node advertises, a container's utilisation at a
moment, MIG profile arithmetic); parsing and validation live in the other `scenario_*` modules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FAULTS = ("kubelet-restart", "checkpoint-corrupt", "probe-restart", "joiner-restart", "watcher-restart")
NODE_FAULTS = ("kubelet-restart", "checkpoint-corrupt", "probe-restart")
FAULT_DEFAULT_MS = {"kubelet-restart": 2000, "checkpoint-corrupt": 5000}
SHARING = ("none", "time-slicing", "mps")
CHECKPOINT_FORMATS = ("v2", "v1", "none")
QOS = ("guaranteed", "burstable", "besteffort")
POLICY_STATES = ("ready", "notReady", "ignored")
# ClusterPolicy spec keys that carry an `enabled` switch (GPU Operator clusterpolicy_types.go).
COMPONENTS = (
    "driver",
    "toolkit",
    "devicePlugin",
    "dcgmExporter",
    "dcgm",
    "nodeStatusExporter",
    "gfd",
    "migManager",
    "validator",
    "gds",
    "gdrcopy",
    "vfioManager",
    "sandboxDevicePlugin",
    "vgpuManager",
    "vgpuDeviceManager",
    "cdi",
    "kataManager",
    "ccManager",
)
GPU_RESOURCE = "nvidia.com/gpu"
SHARED_RESOURCE = "nvidia.com/gpu.shared"
MIG_PROFILE = re.compile(r"^([1-7])g\.(\d+)gb(\+me)?$")


class ScenarioError(ValueError):
    """A scenario that cannot run; the message names the file, the path in it and the problem."""


# ---------------------------------------------------------------- specs


@dataclass(frozen=True, slots=True)
class GpuSpec:
    model: str
    memory_mib: int
    uuid: str | None = None
    mig: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SharingSpec:
    strategy: str = "none"  # none | time-slicing | mps
    replicas: int = 1
    rename: bool = False  # advertise nvidia.com/gpu.shared instead of nvidia.com/gpu


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    gpus: tuple[GpuSpec, ...]
    sharing: SharingSpec = SharingSpec()
    checkpoint: str = "v2"

    @property
    def shared_resource(self) -> str:
        return SHARED_RESOURCE if self.sharing.rename else GPU_RESOURCE

    def resources(self) -> tuple[str, ...]:
        """Extended resources the node's device plugin advertises (mixed MIG strategy)."""
        out: list[str] = []
        if any(not g.mig for g in self.gpus):
            out.append(self.shared_resource if self.sharing.strategy != "none" else GPU_RESOURCE)
        for g in self.gpus:
            out.extend(f"nvidia.com/mig-{p}" for p in g.mig if f"nvidia.com/mig-{p}" not in out)
        return tuple(out)


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    name: str
    resource: str = GPU_RESOURCE
    count: int = 1
    util: tuple[tuple[int, float], ...] = ((0, 0.0),)  # [(offset_ms from scenario start, pct)]
    memory_mib: float = 0.0  # per device held
    processes: int = 1
    devices: tuple[str, ...] | None = None

    def util_at(self, t_ms: int) -> float:
        """The step value in force at scenario time t (0 before the first step)."""
        value = 0.0
        for at, pct in self.util:
            if at > t_ms:
                break
            value = pct
        return value


@dataclass(frozen=True, slots=True)
class PodSpec:
    name: str
    node: str
    containers: tuple[ContainerSpec, ...]
    namespace: str = "default"
    uid: str | None = None
    owner_kind: str = ""
    owner_name: str = ""
    start_ms: int = 0
    stop_ms: int | None = None
    qos: str = "burstable"
    labels: tuple[tuple[str, str], ...] = ()

    def alive_at(self, t_ms: int) -> bool:
        return self.start_ms <= t_ms and (self.stop_ms is None or t_ms < self.stop_ms)


@dataclass(frozen=True, slots=True)
class XidSpec:
    at_ms: int
    node: str
    gpu: int
    code: int
    mig: int | None = None  # index into the GPU's `mig:` list when the error names an instance


@dataclass(frozen=True, slots=True)
class FaultSpec:
    at_ms: int
    fault: str
    node: str | None = None
    duration_ms: int = 0


@dataclass(frozen=True, slots=True)
class ComponentSpec:
    enabled: bool | None = None  # None = not set in the spec (operator default)
    desired: int | None = None
    ready: int | None = None
    present: bool | None = None  # whether its DaemonSet exists; default: when effectively enabled


@dataclass(frozen=True, slots=True)
class PolicySpec:
    name: str = "cluster-policy"
    state: str = "ready"
    components: tuple[tuple[str, ComponentSpec], ...] = ()


@dataclass(frozen=True, slots=True)
class UserSpec:
    """A user the simulated apiserver knows: TokenReview accepts `token` as `name`, and
    SubjectAccessReview allows reading pods in `namespaces` (everything, with `cluster`)."""

    name: str
    token: str
    namespaces: tuple[str, ...] = ()
    cluster: bool = False


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    seed: int
    duration_ms: int
    tick_ms: int
    nodes: tuple[NodeSpec, ...]
    pods: tuple[PodSpec, ...] = ()
    xids: tuple[XidSpec, ...] = ()
    faults: tuple[FaultSpec, ...] = ()
    policy: PolicySpec | None = None
    source: str = ""
    users: tuple[UserSpec, ...] = ()

    def node(self, name: str) -> NodeSpec:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)


# ---------------------------------------------------------------- MIG profiles


def mig_slices(profile: str) -> int:
    m = MIG_PROFILE.match(profile)
    return int(m.group(1)) if m else 0


def mig_memory_mib(profile: str) -> int:
    m = MIG_PROFILE.match(profile)
    return int(m.group(2)) * 1024 if m else 0
