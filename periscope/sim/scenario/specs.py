"""What every part of a scenario file is built from: field types (durations, names, pins, utilisation),
the strict `Document` base, the `Invalid` a rule raises, the two leaf models (a GPU, an operator
component) and MIG profile arithmetic. The models of the file itself, with their vocabularies, are
`document`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PlainValidator,
    Strict,
    Tag,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import PydanticCustomError

from periscope.core.duration import MAX_DURATION_MS, parse_duration_ms

MIG_PROFILE = re.compile(r"^([1-7])g\.(\d+)gb(\+me)?$")
UUID_RE = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
GpuUuid = Annotated[str, Field(pattern=f"^GPU-{UUID_RE}$", description="a GPU UUID (GPU-<lowercase uuid>)")]
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


# ---------------------------------------------------------------- field types

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
DNS_NAME = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
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
        if not v * 1000 <= MAX_DURATION_MS:  # NaN too; an infinite float would not round
            got = f"{v:.6g}" if isinstance(v, float) else f"a {len(str(v))}-digit number of"
            raise PydanticCustomError(
                "duration", "too long: {got} seconds (at most {days}d)",
                {"got": got, "days": MAX_DURATION_MS // 86_400_000},
            )
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
# A section behind a `BeforeValidator` is validated as Python data, where a strict tuple refuses the list
# that JSON gives; LAX tuples take it (their items stay strict).
LAX = Strict(False)
Text = Annotated[str, Field(min_length=1)]
Count = Annotated[int, Field(ge=1, le=64)]
Pct = Annotated[float, Field(ge=0, le=100)]
Index = Annotated[int, Field(ge=0)]
NodeName = Annotated[str, Field(pattern=DNS_NAME, description="a valid node name (lowercase DNS name)")]
Namespace = Annotated[str, Field(pattern=DNS_LABEL, description="a valid namespace")]
Step = Annotated[tuple[Duration, Pct], LAX, Field(description="a step [offset, pct] such as [30s, 80]")]
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


# ---------------------------------------------------------------- leaf models


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


# ---------------------------------------------------------------- MIG profiles


def mig_slices(profile: str) -> int:
    m = MIG_PROFILE.match(profile)
    return int(m.group(1)) if m else 0


def mig_memory_mib(profile: str) -> int:
    m = MIG_PROFILE.match(profile)
    return int(m.group(2)) * 1024 if m else 0

