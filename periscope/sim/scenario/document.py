"""A scenario file as pydantic models: the YAML keys, their vocabularies and the rules inside one object.

The models mirror the file exactly (docs/scenarios.md), so their JSON Schema is what an editor
checks a scenario file against (docs/scenario.schema.json), and they are also what the simulator
reads: a time field is held in ms under a `_ms` name (`start_ms` for the file's `start`), and the
small queries the simulator asks (which resources a node advertises, a container's utilisation at a
moment, the timeline of Xid errors and faults) are methods here. Validation is strict (no "3" for 3,
no `yes` for true) and unknown keys are errors. A rule that needs two fields of one object (MIG
layout against memory, exactly one of xid or fault) is a model validator raising `Invalid` with the
path inside that object; rules across sections (a pod's node exists, a pin names a real MIG
instance) are in `rules`. A field's `description` doubles as the words of its error ("'x' is not
<description>").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, PrivateAttr, model_validator

from periscope.sim.scenario.specs import (
    DNS_LABEL,
    DNS_NAME,
    LAX,
    UUID_RE,
    ComponentSpec,
    Count,
    Document,
    Duration,
    GpuSpec,
    Index,
    Invalid,
    Namespace,
    NodeName,
    Pin,
    Text,
    Util,
)

# ---------------------------------------------------------------- vocabularies

Fault = Literal["kubelet-restart", "checkpoint-corrupt", "probe-restart", "joiner-restart", "watcher-restart",
                "joiner-stop"]
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
NODE_FAULTS = ("kubelet-restart", "checkpoint-corrupt", "probe-restart")
# joiner-stop: the joiner is down for `duration` (its consumer group falls behind), then starts again.
FAULT_DEFAULT_MS = {"kubelet-restart": 2000, "checkpoint-corrupt": 5000, "joiner-stop": 60_000}
GPU_RESOURCE = "nvidia.com/gpu"
SHARED_RESOURCE = "nvidia.com/gpu.shared"


def _absent_as(empty: Any, shape: Any, *spelled: str) -> Any:
    """A section the file may leave out or write as null (`pods:`) or as one of `spelled`, read as `empty`."""
    absent = (None, *spelled)
    return BeforeValidator(lambda v: empty if v in absent else v, json_schema_input_type=shape | None)


# ---------------------------------------------------------------- nodes


class Sharing(Document):
    strategy: Strategy = "none"
    replicas: Annotated[int, Field(ge=2, le=64)] | None = None
    rename: bool | None = None  # unset: follows what the node's pods ask for (resolved by `rules`)

    @model_validator(mode="after")
    def _replicas(self) -> Sharing:
        if self.strategy == "none":
            for key in ("replicas", "rename"):
                if key in self.model_fields_set:
                    raise Invalid(key, "only applies to time-slicing or mps")
        elif self.replicas is None:
            raise Invalid("replicas", "required")
        return self


class Node(Document):
    name: NodeName
    gpus: Annotated[tuple[GpuSpec, ...], Field(min_length=1)]
    sharing: Annotated[Sharing, _absent_as({}, Literal["none"] | Sharing, "none")] = Field(
        default_factory=Sharing
    )
    checkpoint: Checkpoint = "v2"

    @model_validator(mode="after")
    def _shareable(self) -> Node:
        if self.sharing.strategy != "none" and all(g.mig for g in self.gpus):
            raise Invalid("sharing", f"{self.sharing.strategy} needs a GPU without MIG on this node")
        return self

    @property
    def shared_resource(self) -> str:
        return SHARED_RESOURCE if self.sharing.rename else GPU_RESOURCE

    def resources(self) -> tuple[str, ...]:
        """Extended resources the node's device plugin advertises (mixed MIG strategy)."""
        # Without sharing `rename` is unset, so `shared_resource` is the plain nvidia.com/gpu.
        whole = [self.shared_resource] if any(not g.mig for g in self.gpus) else []
        return tuple(dict.fromkeys(whole + [f"nvidia.com/mig-{p}" for g in self.gpus for p in g.mig]))


# ---------------------------------------------------------------- pods


class Container(Document):
    name: Annotated[str, Field(pattern=DNS_LABEL, description="a valid container name")]
    resource: Text = GPU_RESOURCE
    count: Count = 1
    util_pct: Util = 0.0
    memory_mib: Annotated[float, Field(ge=0)] = 0.0  # per device held
    processes: Annotated[int, Field(ge=0, le=64)] = 1
    devices: Annotated[tuple[Pin, ...], LAX] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Container:
        steps = self.util
        for k in range(1, len(steps)):
            if steps[k][0] <= steps[k - 1][0]:
                raise Invalid(f"util_pct[{k}][0]", "step offsets must increase")
        if self.processes == 0 and any(p > 0 for _, p in steps):
            raise Invalid("util_pct", "a container with processes: 0 cannot use the GPU")
        if self.devices is not None and len(self.devices) != self.count:
            raise Invalid("devices", f"pins {len(self.devices)} devices but count is {self.count}")
        return self

    @property
    def util(self) -> tuple[tuple[int, float], ...]:
        """The steps [(offset_ms from scenario start, pct)]; a bare number is one step at 0s."""
        return ((0, self.util_pct),) if isinstance(self.util_pct, float) else tuple(self.util_pct)

    def util_at(self, t_ms: int) -> float:
        """The step value in force at scenario time t (0 before the first step)."""
        return next((pct for at, pct in reversed(self.util) if at <= t_ms), 0.0)


class Owner(Document):
    kind: Text
    name: Text


class Pod(Document):
    namespace: Namespace = "default"
    name: Annotated[str, Field(pattern=DNS_NAME, description="a valid pod name (lowercase DNS name)")]
    uid: Annotated[str, Field(pattern=f"^{UUID_RE}$", description="a pod UID (lowercase uuid)")] | None = None
    node: Text
    owner: Owner | None = None
    start_ms: Duration = Field(0, alias="start")
    stop_ms: Duration | None = Field(None, alias="stop")
    containers: Annotated[tuple[Container, ...], LAX, Field(min_length=1)]
    qos: Qos = "burstable"
    labels: dict[str, Text] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Pod:
        for j, c in enumerate(self.containers):
            if any(o.name == c.name for o in self.containers[:j]):
                raise Invalid(f"containers[{j}].name", f"container {c.name!r} is listed twice")
        return self

    def alive_at(self, t_ms: int) -> bool:
        return self.start_ms <= t_ms and (self.stop_ms is None or t_ms < self.stop_ms)


# ---------------------------------------------------------------- events, users, policy


class Xid(Document):
    node: Text
    gpu: Index
    code: Annotated[int, Field(ge=1, le=999)]
    mig: Index | None = None  # index into the GPU's `mig:` list when the error names an instance


class Event(Document):
    at_ms: Duration = Field(alias="at")
    xid: Xid | None = None
    fault: Fault | None = None
    node: Text | None = None
    duration_ms: Duration | None = Field(None, alias="duration")

    @model_validator(mode="after")
    def _one_kind(self) -> Event:
        if (self.xid is None) == (self.fault is None):
            raise Invalid("", "needs exactly one of xid or fault")
        if self.xid is not None:
            for key in ("node", "duration"):
                if key in self.model_fields_set or f"{key}_ms" in self.model_fields_set:
                    raise Invalid(key, "only applies to faults (an xid names its node inside xid:)")
        elif self.fault in NODE_FAULTS and self.node is None:
            raise Invalid("node", "required")
        elif self.fault not in NODE_FAULTS and self.node is not None:
            raise Invalid("node", f"{self.fault} is cluster-wide and takes no node")
        if self.fault is not None and self.duration_ms is not None and self.fault not in FAULT_DEFAULT_MS:
            raise Invalid("duration", f"only applies to {', '.join(FAULT_DEFAULT_MS)}")
        return self


class UserSpec(Document):
    """A user the simulated apiserver knows: TokenReview accepts `token` as `name`, and
    SubjectAccessReview allows reading pods in `namespaces` (everything, with `cluster`)."""

    name: Text
    token: Text
    namespaces: Annotated[tuple[Namespace, ...], LAX] = ()
    cluster: bool = False  # may read every namespace


class Policy(Document):
    name: Annotated[str, Field(pattern=DNS_NAME, description="a valid name")] = "cluster-policy"
    state: PolicyState = "ready"
    components: Annotated[
        dict[Component, Annotated[ComponentSpec, _absent_as({}, ComponentSpec)]],
        _absent_as({}, dict[Component, ComponentSpec | None]),
    ] = {}


class Scenario(Document):
    """The whole file; `name` defaults to the file's stem, `tick` to 1s."""

    name: Text | None = None
    seed: Index = 0
    duration_ms: Duration = Field(alias="duration")
    tick_ms: Duration = Field(1000, alias="tick")
    nodes: Annotated[tuple[Node, ...], Field(min_length=1)]
    pods: Annotated[tuple[Pod, ...], _absent_as((), list[Pod]), LAX] = ()
    events: Annotated[tuple[Event, ...], _absent_as((), list[Event]), LAX] = ()
    users: Annotated[tuple[UserSpec, ...], _absent_as((), list[UserSpec]), LAX] = ()
    policy: Policy | None = None
    _source: str = PrivateAttr("")  # the file or built-in name it was read from, as the user named it
    _location: str = PrivateAttr("")  # the built-in name or the file's absolute path

    @property
    def source(self) -> str:
        return self._source

    @property
    def location(self) -> str:
        """Where a process in any working directory loads this scenario from ("" if not from a file)."""
        return self._location

    def node(self, name: str) -> Node:
        return {n.name: n for n in self.nodes}[name]

    @property
    def xids(self) -> tuple[XidSpec, ...]:
        """The Xid errors to inject, in time order."""
        return tuple(
            XidSpec(e.at_ms, e.xid.node, e.xid.gpu, e.xid.code, e.xid.mig)
            for e in sorted(self.events, key=lambda e: e.at_ms)
            if e.xid is not None
        )

    @property
    def faults(self) -> tuple[FaultSpec, ...]:
        """The faults to inject, in time order, each with its length (the fault's default when unset)."""
        return tuple(
            FaultSpec(e.at_ms, e.fault, e.node, FAULT_DEFAULT_MS.get(e.fault, 0) if e.duration_ms is None
                      else e.duration_ms)
            for e in sorted(self.events, key=lambda e: e.at_ms)
            if e.fault is not None
        )


# ---------------------------------------------------------------- the timeline the simulator fires


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

