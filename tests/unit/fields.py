"""Instances of the domain dataclasses with every field set, and the same with one field changed.

`full(cls)` gives an instance whose every field (nested ones too) holds a value other than its default,
so a codec that drops a field cannot give it back; `changes(obj)` yields, per field path
(`rows.util_pct`: the field of a collection's first element), a copy with that one field changed, so a
renderer that ignores a field renders both the same.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import types
import typing
from collections.abc import Iterator
from typing import Any

_counter = itertools.count(3)


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _optional(tp: Any) -> Any | None:
    """X for `X | None`, else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) < len(typing.get_args(tp)) and len(args) == 1:
            return args[0]
    return None


def value(tp: Any, default: Any = dataclasses.MISSING) -> Any:
    """A value of type `tp`, not `default`."""
    n = next(_counter)
    inner = _optional(tp)
    if inner is not None:
        return value(inner)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return value(typing.get_args(tp)[0])
    if typing.get_origin(tp) is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return (value(args[0]),)
        return tuple(value(a) for a in args)
    if dataclasses.is_dataclass(tp):
        return full(tp)  # type: ignore[arg-type]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        members = [m for m in tp if m != default]
        return members[-1]
    if tp is bool:
        return not default if isinstance(default, bool) else True
    if tp is int:
        return n
    if tp is float:
        return n + 0.5  # exact in a float32 too
    if tp is str:
        return f"v{n}"
    raise TypeError(f"no value for {tp!r}")


def full(cls: type) -> Any:
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        default = f.default if f.default is not dataclasses.MISSING else dataclasses.MISSING
        kwargs[f.name] = value(hints[f.name], default)
    return cls(**kwargs)


def _other(v: Any, tp: Any) -> Any:
    if _optional(tp) is not None:
        return None
    if isinstance(v, bool):
        return not v
    if isinstance(v, enum.Enum):
        return next(m for m in type(v) if m != v)
    if isinstance(v, int):
        return v + 1
    if isinstance(v, float):
        return v + 1.0
    if isinstance(v, str):
        return v + "~"
    if isinstance(v, tuple):
        return ()
    raise TypeError(f"cannot change {v!r}")


def changes(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(field path, `obj` with that field changed) for every field, nested fields included."""
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        if not f.init:
            continue
        v, tp, path = getattr(obj, f.name), hints[f.name], prefix + f.name
        if dataclasses.is_dataclass(v):
            if _optional(tp) is not None:
                yield path, dataclasses.replace(obj, **{f.name: None})
            for sub, changed in changes(v, path + "."):
                yield sub, dataclasses.replace(obj, **{f.name: changed})
        elif isinstance(v, tuple) and v and dataclasses.is_dataclass(v[0]):
            yield path, dataclasses.replace(obj, **{f.name: ()})
            for sub, changed in changes(v[0], path + "."):
                yield sub, dataclasses.replace(obj, **{f.name: (changed, *v[1:])})
        else:
            yield path, dataclasses.replace(obj, **{f.name: _other(v, tp)})


def left_out(path: str, leaves: frozenset[str]) -> bool:
    """Whether `path` is, or lies under, one of `leaves`."""
    return any(path == p or path.startswith(p + ".") for p in leaves)
