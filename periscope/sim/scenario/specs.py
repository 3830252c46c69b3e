"""The frozen specs a scenario file becomes, and the vocabularies its fields draw from.

A `Scenario` holds the simulated cluster's nodes (with their GPUs, MIG instances, sharing and checkpoint
format), the pods placed on them with each container's utilisation steps, the Xid errors and faults to
inject, the apiserver's users, and an optional GPU Operator ClusterPolicy. Everything here is plain
immutable data plus the small queries the simulator asks of it (which resources a node advertises, a
container's utilisation at a moment, MIG profile arithmetic). The file format is `document`;
`GpuSpec` and `ComponentSpec` have the file's shape exactly, so they are its models too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

Fault = Literal["kubelet-restart", "checkpoint-corrupt", "probe-restart", "joiner-restart", "watcher-restart"]
Strategy = Literal["none", "time-slicing", "mps"]
Checkpoint = Literal["v2", "v1", "none"]
Qos = Literal["guaranteed", "burstable", "besteffort"]
PolicyState = Literal["ready", "notReady", "ignored"]
# ClusterPolicy spec keys that carry an `enabled` switch (GPU Operator clusterpolicy_types.go).
Component = Literal[
    "driver", "toolkit", "devicePlugin", "dcgmExporter", "dcgm", "nodeStatusExporter", "gfd", "migManager",
    "validator", "gds", "gdrcopy", "vfioManager", "sandboxDevicePlugin", "vgpuManager", "vgpuDeviceManager",
    "cdi", "kataManager", "ccManager",
]
FAULTS: tuple[str, ...] = get_args(Fault)
NODE_FAULTS = ("kubelet-restart", "checkpoint-corrupt", "probe-restart")
FAULT_DEFAULT_MS = {"kubelet-restart": 2000, "checkpoint-corrupt": 5000}
SHARING: tuple[str, ...] = get_args(Strategy)
CHECKPOINT_FORMATS: tuple[str, ...] = get_args(Checkpoint)
QOS: tuple[str, ...] = get_args(Qos)
POLICY_STATES: tuple[str, ...] = get_args(PolicyState)
COMPONENTS: tuple[str, ...] = get_args(Component)
GPU_RESOURCE = "nvidia.com/gpu"
SHARED_RESOURCE = "nvidia.com/gpu.shared"
MIG_PROFILE = re.compile(r"^([1-7])g\.(\d+)gb(\+me)?$")
GpuUuid = Annotated[
    str,
    Field(
        pattern=r"^GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}$",
        description="a GPU UUID (GPU-<lowercase uuid>)",
    ),
]
MigProfile = Annotated[str, Field(pattern=MIG_PROFILE.pattern, description="a MIG profile such as 1g.10gb")]


class ScenarioError(ValueError):
    """A scenario that cannot run; the message names the file, the path in it and the problem."""


class Invalid(ValueError):
    """One problem at a path relative to the object whose rule found it (`mig`, `containers[1].name`)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(problem)
        self.path, self.problem = path, problem


class Document(BaseModel):
    """A part of a scenario file: strict types, no unknown keys, immutable once read."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def describe_value(v: Any) -> str:
    """A value as an error message shows it (`got 'lots'`, `got a list`)."""
    if v is None:
        return "nothing (null)"
    if isinstance(v, bool):
        return f"boolean {str(v).lower()}"
    if isinstance(v, dict):
        return "a mapping"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, str):
        return f"{v!r}"
    return f"{type(v).__name__} {v!r}"


# ---------------------------------------------------------------- specs


class GpuSpec(Document):
    model: Annotated[str, Field(min_length=1)]
    memory_mib: Annotated[int, Field(ge=1, le=10_000_000)]
    uuid: GpuUuid | None = None
    mig: tuple[MigProfile, ...] = ()

    @model_validator(mode="after")
    def _mig_fits(self) -> GpuSpec:
        slices = sum(mig_slices(p) for p in self.mig)
        if slices > 7:
            raise Invalid("mig", f"needs {slices} compute slices; a GPU has 7")
        needed = sum(mig_memory_mib(p) for p in self.mig)
        if needed > self.memory_mib:
            raise Invalid("mig", f"needs {needed} MiB; the GPU has {self.memory_mib} MiB")
        return self


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


class ComponentSpec(Document):
    enabled: bool | None = None  # None = not set in the spec (operator default)
    desired: Annotated[int, Field(ge=0)] | None = None
    ready: Annotated[int, Field(ge=0)] | None = None
    present: bool | None = None  # whether its DaemonSet exists; default: when effectively enabled

    @model_validator(mode="after")
    def _ready(self) -> ComponentSpec:
        if self.desired is not None and self.ready is not None and self.ready > self.desired:
            raise Invalid("ready", f"{self.ready} is more than desired ({self.desired})")
        return self


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
