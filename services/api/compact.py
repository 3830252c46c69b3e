"""Packed copies of decoded records, for a view that holds 100,000 rows.

A decoded PodAttribution is a tree of Python objects (the pod, each row, a float or int object per
number, a string per text): about 900 bytes a row before its strings. The view holds each pod's and each
GPU's latest state as one `bytes` instead (about 350): the event time (int64) for ordering without
unpacking, then the dataclass fields as nested tuples in `marshal` form, which keeps every value exactly
(ints of any size, floats bit for bit, None, booleans, strings). Reads unpack (a few microseconds); the
rendered rows are cached apart. Rows are packed without their windows (the view keeps those merged,
services.api.windows).
"""

from __future__ import annotations

import marshal
import struct
from dataclasses import fields
from operator import attrgetter
from sys import intern
from typing import Any

from periscope.core.model import AttributionRow, GpuState, MigRef, MigState, Owner, PodAttribution, XidRef

_AS_OF = struct.Struct("<q")
_GPU_HEAD = struct.Struct("<qq")  # event time, GPU index: the view sorts GPUs by index without unpacking
_MANY, _ONE, _NONE = 0, 1, 2  # a tuple of records, an optional record, always empty (windows)

# Fields holding records, per record type: field name -> (how, record type).
_NESTED: dict[type, dict[str, tuple[int, type | None]]] = {
    PodAttribution: {"rows": (_MANY, AttributionRow)},
    AttributionRow: {"mig": (_ONE, MigRef), "windows": (_NONE, None)},
    GpuState: {"mig_devices": (_MANY, MigState), "owners": (_MANY, Owner), "last_xid": (_ONE, XidRef),
               "monitors": (_MANY, Owner)},
    MigState: {"owners": (_MANY, Owner), "monitors": (_MANY, Owner)},
    MigRef: {},
    Owner: {},
    XidRef: {},
}
_GET = {cls: attrgetter(*(f.name for f in fields(cls))) for cls in _NESTED}
_AT = {
    cls: [(i, *nested[f.name]) for i, f in enumerate(fields(cls)) if f.name in nested]
    for cls, nested in _NESTED.items()
}


def _canon(v: Any) -> Any:
    """Strings interned: marshal marks them so, and unpacking then returns the one shared object (the
    view's keys hold the same texts) instead of a copy, and equal records pack to equal bytes."""
    if type(v) is str:
        return intern(v)
    if type(v) is tuple and v and type(v[0]) is str:
        return tuple(intern(x) for x in v)
    return v


def _flat(o: Any) -> tuple[Any, ...]:
    values = [_canon(v) for v in _GET[type(o)](o)]
    for i, how, _ in _AT[type(o)]:
        v = values[i]
        if how == _MANY:
            values[i] = tuple(_flat(x) for x in v)
        elif how == _ONE:
            values[i] = None if v is None else _flat(v)
        else:
            values[i] = None
    return tuple(values)


def _build(cls: type, t: tuple[Any, ...]) -> Any:
    at = _AT[cls]
    if not at:
        return cls(*t)
    values = list(t)
    for i, how, sub in at:
        v = values[i]
        if how == _MANY:
            values[i] = tuple(_build(sub, x) for x in v)  # type: ignore[arg-type]
        elif how == _ONE:
            values[i] = None if v is None else _build(sub, v)  # type: ignore[arg-type]
        else:
            values[i] = ()
    return cls(*values)


def pod(p: PodAttribution) -> bytes:
    """The pod, its rows without windows, packed."""
    return _AS_OF.pack(p.as_of_ms) + marshal.dumps(_flat(p))


def gpu(g: GpuState) -> bytes:
    return _GPU_HEAD.pack(g.as_of_ms, g.index) + marshal.dumps(_flat(g))


def gpu_index(packed: bytes) -> int:
    """A packed GPU state's index, without unpacking it."""
    i: int = _GPU_HEAD.unpack_from(packed)[1]
    return i


def as_of_ms(packed: bytes) -> int:
    """The packed record's event time, without unpacking it."""
    t: int = _AS_OF.unpack_from(packed)[0]
    return t


def _same(a: bytes | None, b: bytes, head: int) -> bool:
    """Whether two packed records hold equal values. Their bytes may differ when they do: marshal writes
    an object met twice as a back-reference, so how the decoded objects happened to share floats or ints
    shows in the bytes."""
    return a == b or (
        a is not None and marshal.loads(memoryview(a)[head:]) == marshal.loads(memoryview(b)[head:])
    )


def same_pod(a: bytes | None, b: bytes) -> bool:
    return _same(a, b, _AS_OF.size)


def same_gpu(a: bytes | None, b: bytes) -> bool:
    return _same(a, b, _GPU_HEAD.size)


def unpack_pod(packed: bytes) -> PodAttribution:
    p: PodAttribution = _build(PodAttribution, marshal.loads(memoryview(packed)[_AS_OF.size :]))
    return p


def unpack_gpu(packed: bytes) -> GpuState:
    g: GpuState = _build(GpuState, marshal.loads(memoryview(packed)[_GPU_HEAD.size :]))
    return g
