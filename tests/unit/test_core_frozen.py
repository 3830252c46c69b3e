"""The cheaper __init__ of the core's frozen dataclasses behaves as the generated one."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import subprocess
import sys

import pytest

from periscope.core import frozen, model
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
    assert frozen.GUARDED  # tests/conftest.py: the guard is on under test
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


def _pair() -> tuple[type, type]:
    def make() -> type:
        @dataclasses.dataclass(frozen=True, slots=True)
        class Point:
            x: int
            y: float = 0.5
            tags: tuple[str, ...] = ()
        return Point

    return fast_init(make(), guarded=True), fast_init(make(), guarded=False)


def test_unguarded_objects_equal_the_guarded_ones_but_for_assignment() -> None:
    guarded, plain = _pair()
    for args in [(1,), (1, 2.0), (1, 2.0, ("a",))]:
        g, p = guarded(*args), plain(*args)
        assert (repr(g), hash(g)) == (repr(p), hash(p))
        assert dataclasses.astuple(g) == dataclasses.astuple(p)
        assert p == plain(*args) and p != plain(9)
        assert dataclasses.replace(p, x=3) == plain(3, *args[1:])
    q = plain(1, tags=("t",))
    assert copy.deepcopy(q) == q and copy.copy(q) == q  # (the dataclass's __getstate__ / __setstate__)
    with pytest.raises(TypeError):
        plain()
    with pytest.raises(dataclasses.FrozenInstanceError):
        guarded(1).x = 2
    q.x = 2  # no run-time guard: mypy refuses this (make lint), the tests run guarded
    assert q.x == 2


def test_the_guard_is_off_outside_the_tests() -> None:
    """What a service gets: assignment not refused at run time (mypy refuses it in the code)."""
    code = ("import dataclasses; from periscope.core.model import DeviceSample\n"
            "d = DeviceSample('GPU-1', util_pct=4.0)\n"
            "try:\n    d.util_pct = 5.0\nexcept dataclasses.FrozenInstanceError:\n    print('refused')\n"
            "else:\n    print('stored', d.util_pct)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "stored 5.0"
