"""The cheaper __init__ of the core's frozen dataclasses behaves as the generated one."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from periscope.core import model
from periscope.core.frozen import fast_init
from periscope.core.model import AttributionRow, DeviceSample, Finding, GpuState, ProcessSample
from periscope.core.usage import Usage


def _classes() -> list[type]:
    return [c for c in vars(model).values()
            if isinstance(c, type) and dataclasses.is_dataclass(c) and c.__module__ == model.__name__]


@pytest.mark.parametrize("cls", [*_classes(), Usage], ids=lambda c: c.__name__)
def test_signature_is_the_dataclass_one(cls: type) -> None:
    sig = inspect.signature(cls)
    want = [(f.name, inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default)
            for f in dataclasses.fields(cls)]
    assert [(p.name, p.default) for p in sig.parameters.values()] == want
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in sig.parameters.values())
    assert cls.__init__.__qualname__ == f"{cls.__qualname__}.__init__"


def test_positional_keyword_and_defaults_give_equal_objects() -> None:
    p = ProcessSample(7, "uid", used_mib=3.0)
    assert (p.pid, p.pod_uid, p.container_id, p.sm_util_pct, p.used_mib) == (7, "uid", "", None, 3.0)
    a = DeviceSample("GPU-1", util_pct=40.0, processes=(p,))
    b = DeviceSample(uuid="GPU-1", parent_uuid="", index=0, mig=None, util_pct=40.0, processes=(p,))
    assert a == b and hash(a) == hash(b)
    assert dataclasses.replace(a, util_pct=41.0) == DeviceSample("GPU-1", util_pct=41.0, processes=(p,))
    assert Finding("idle", "k", "n", 1, "id").pids == ()
    assert GpuState("n", "GPU-1").owners == ()
    row = AttributionRow("c", "d", "g", "exclusive", "exclusive")
    assert row.windows == () and row.active and row.util_pct is None


def test_still_immutable_and_argument_errors_unchanged() -> None:
    u = Usage(1.0, 2.0, 3.0, "exclusive", "exclusive", 1.0, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        u.util_pct = 2.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        GpuState("n")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        GpuState("n", "g", bogus=1)  # type: ignore[call-arg]


def test_refuses_classes_it_cannot_speed_up_faithfully() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class WithFactory:
        xs: list[int] = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(slots=True)
    class Mutable:
        x: int = 0

    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        x: int = 0

        def __post_init__(self) -> None:
            pass

    for cls in (WithFactory, Mutable, Checked):
        with pytest.raises(TypeError):
            fast_init(cls)
