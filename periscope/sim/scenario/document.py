"""A scenario file as pydantic models: the YAML keys, their types and the rules inside one object.

The models mirror the file exactly (docs/scenarios.md), so their JSON Schema is what an editor
checks a scenario file against (docs/scenario.schema.json). Validation is strict (no "3" for 3, no `yes`
for true) and unknown keys are errors. A rule that needs two fields of one object (MIG layout against
memory, exactly one of xid or fault) is a model validator raising `Invalid` with the path inside that
object; rules across sections (a pod's node exists, a pin names a real MIG instance) are in
`rules`. A field's `description` doubles as the words of its error ("'x' is not <description>").
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Discriminator,
    Field,
    PlainValidator,
    Tag,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import PydanticCustomError

from periscope.core.duration import parse_duration_ms
from periscope.sim.scenario.specs import (
    FAULT_DEFAULT_MS,
    GPU_RESOURCE,
    NODE_FAULTS,
    Checkpoint,
    Component,
    ComponentSpec,
    Document,
    Fault,
    GpuSpec,
    Invalid,
    PolicyState,
    Qos,
    Strategy,
    describe_value,
)

_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_DNS_NAME = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
PIN = r"^(\d+)(?::(\d+))?$"


def _duration_ms(v: Any) -> int:
    """A duration string (`90s`, via periscope.core.duration) or a plain number of seconds, in ms."""
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise PydanticCustomError(
            "duration", "expected a duration such as 30s, got {got}", {"got": describe_value(v)}
        )
    if not isinstance(v, str):
        if v < 0:
            raise PydanticCustomError("duration", "must not be negative")
        return round(v * 1000)
    try:
        return parse_duration_ms(v)
    except ValueError as e:
        raise PydanticCustomError("duration", "{problem}", {"problem": str(e)}) from None


def _pin_text(v: Any) -> Any:
    return str(v) if isinstance(v, int) and not isinstance(v, bool) else v  # YAML reads `devices: [0]`


Duration = Annotated[
    int,
    PlainValidator(_duration_ms),
    WithJsonSchema(
        {
            "description": "a duration such as 90s, 10m, 1h30m or 500ms, or a number of seconds",
            "anyOf": [
                {"type": "number", "minimum": 0},
                {"type": "string", "pattern": r"^\s*((\d+(\.\d+)?)([mM][sS]|[sSmMhHdD]))+\s*$"},
            ],
        }
    ),
]
Text = Annotated[str, Field(min_length=1)]
Count = Annotated[int, Field(ge=1, le=64)]
Pct = Annotated[float, Field(ge=0, le=100)]
Index = Annotated[int, Field(ge=0)]
NodeName = Annotated[str, Field(pattern=_DNS_NAME, description="a valid node name (lowercase DNS name)")]
Namespace = Annotated[str, Field(pattern=_DNS_LABEL, description="a valid namespace")]
Step = Annotated[tuple[Duration, Pct], Field(description="a step [offset, pct] such as [30s, 80]")]
# A bare number is one step at 0s; the callable discriminator keeps each shape's errors apart.
Util = Annotated[
    Annotated[Pct, Tag("<pct>")] | Annotated[list[Step], Field(min_length=1), Tag("<steps>")],
    Discriminator(lambda v: "<steps>" if isinstance(v, list) else "<pct>"),
]
Pin = Annotated[
    str,
    BeforeValidator(_pin_text, json_schema_input_type=int | str),
    Field(pattern=PIN, description='a GPU index ("0") or a GPU:MIG index pair ("0:1")'),
]


# ---------------------------------------------------------------- nodes


class Sharing(Document):
    strategy: Strategy = "none"
    replicas: Annotated[int, Field(ge=2, le=64)] | None = None
    rename: bool | None = None  # unset: follows what the node's pods ask for

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
    gpus: Annotated[list[GpuSpec], Field(min_length=1)]
    sharing: Annotated[
        Sharing | None,
        BeforeValidator(
            lambda v: None if v == "none" else v, json_schema_input_type=Literal["none"] | Sharing | None
        ),
    ] = None
    checkpoint: Checkpoint = "v2"

    @model_validator(mode="after")
    def _shareable(self) -> Node:
        if self.sharing is not None and self.sharing.strategy != "none" and all(g.mig for g in self.gpus):
            raise Invalid("sharing", f"{self.sharing.strategy} needs a GPU without MIG on this node")
        return self


# ---------------------------------------------------------------- pods


class Container(Document):
    name: Annotated[str, Field(pattern=_DNS_LABEL, description="a valid container name")]
    resource: Text = GPU_RESOURCE
    count: Count = 1
    util_pct: Util = 0.0
    memory_mib: Annotated[float, Field(ge=0)] = 0.0  # per device held
    processes: Annotated[int, Field(ge=0, le=64)] = 1
    devices: list[Pin] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Container:
        steps = self.steps()
        for k in range(1, len(steps)):
            if steps[k][0] <= steps[k - 1][0]:
                raise Invalid(f"util_pct[{k}][0]", "step offsets must increase")
        if self.processes == 0 and any(p > 0 for _, p in steps):
            raise Invalid("util_pct", "a container with processes: 0 cannot use the GPU")
        if self.devices is not None and len(self.devices) != self.count:
            raise Invalid("devices", f"pins {len(self.devices)} devices but count is {self.count}")
        return self

    def steps(self) -> tuple[tuple[int, float], ...]:
        return ((0, self.util_pct),) if isinstance(self.util_pct, float) else tuple(self.util_pct)


class Owner(Document):
    kind: Text
    name: Text


class Pod(Document):
    namespace: Namespace = "default"
    name: Annotated[str, Field(pattern=_DNS_NAME, description="a valid pod name (lowercase DNS name)")]
    uid: Annotated[str, Field(pattern=f"^{_UUID}$", description="a pod UID (lowercase uuid)")] | None = None
    node: Text
    owner: Owner | None = None
    start: Duration = 0
    stop: Duration | None = None
    containers: Annotated[list[Container], Field(min_length=1)]
    qos: Qos = "burstable"
    labels: dict[str, Text] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Pod:
        for j, c in enumerate(self.containers):
            if any(o.name == c.name for o in self.containers[:j]):
                raise Invalid(f"containers[{j}].name", f"container {c.name!r} is listed twice")
        return self


# ---------------------------------------------------------------- events, users, policy


class Xid(Document):
    node: Text
    gpu: Index
    code: Annotated[int, Field(ge=1, le=999)]
    mig: Index | None = None  # index into the GPU's `mig:` list when the error names an instance


class Event(Document):
    at: Duration
    xid: Xid | None = None
    fault: Fault | None = None
    node: Text | None = None
    duration: Duration | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Event:
        if (self.xid is None) == (self.fault is None):
            raise Invalid("", "needs exactly one of xid or fault")
        if self.xid is not None:
            for key in ("node", "duration"):
                if key in self.model_fields_set:
                    raise Invalid(key, "only applies to faults (an xid names its node inside xid:)")
        elif self.fault in NODE_FAULTS and self.node is None:
            raise Invalid("node", "required")
        elif self.fault not in NODE_FAULTS and self.node is not None:
            raise Invalid("node", f"{self.fault} is cluster-wide and takes no node")
        if self.fault is not None and self.duration is not None and self.fault not in FAULT_DEFAULT_MS:
            raise Invalid("duration", f"only applies to {', '.join(FAULT_DEFAULT_MS)}")
        return self


class User(Document):
    name: Text
    token: Text
    namespaces: list[Namespace] = []
    cluster: bool = False  # may read every namespace


class Policy(Document):
    name: Annotated[str, Field(pattern=_DNS_NAME, description="a valid name")] = "cluster-policy"
    state: PolicyState = "ready"
    components: dict[Component, ComponentSpec | None] | None = None


class ScenarioDocument(Document):
    """The whole file; `name` defaults to the file's stem, `tick` to 1s."""

    name: Text | None = None
    seed: Index = 0
    duration: Duration
    tick: Duration = 1000
    nodes: Annotated[list[Node], Field(min_length=1)]
    pods: list[Pod] | None = None
    events: list[Event] | None = None
    users: list[User] | None = None
    policy: Policy | None = None
