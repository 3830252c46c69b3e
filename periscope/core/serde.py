"""Dataclass <-> JSON-compatible values, driven by type hints, for persisting engine state.

Deterministic (dict keys sorted by the caller's json.dumps(sort_keys=True)); used for Faust table values
and the state snapshots replay can start from.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from enum import Enum
from functools import cache
from typing import Any


def to_jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in _fields(type(obj))}
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, tuple | list):
        return [to_jsonable(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    return obj


@cache
def _fields(cls: type) -> tuple[dataclasses.Field[Any], ...]:
    return dataclasses.fields(cls)


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_jsonable(tp: Any, data: Any) -> Any:
    """Rebuild a value of type `tp` (a dataclass, tuple[...], X | None, Enum, or a scalar)."""
    if data is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return from_jsonable(args[0], data)
        for a in args:  # scalar unions such as bool | None were handled above
            if isinstance(data, dict) and dataclasses.is_dataclass(a):
                return from_jsonable(a, data)
        return data
    if origin is tuple:
        targs = typing.get_args(tp)
        if len(targs) == 2 and targs[1] is Ellipsis:
            return tuple(from_jsonable(targs[0], x) for x in data)
        return tuple(from_jsonable(a, x) for a, x in zip(targs, data, strict=True))
    if origin is dict:
        kt, vt = typing.get_args(tp)
        return {from_jsonable(kt, k): from_jsonable(vt, v) for k, v in data.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        hints = _hints(tp)
        kwargs = {f.name: from_jsonable(hints[f.name], data[f.name]) for f in _fields(tp) if f.name in data}
        return tp(**kwargs)
    if isinstance(tp, type) and issubclass(tp, Enum):
        return tp(data)
    if tp is float and isinstance(data, int):
        return float(data)
    return data


def to_positional(obj: Any) -> Any:
    """Like to_jsonable, but a dataclass becomes the list of its field values in declaration order:
    about a third of the size, for records written often (the last published outputs)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [to_positional(getattr(obj, f.name)) for f in _fields(type(obj))]
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, tuple | list):
        return [to_positional(x) for x in obj]
    return obj


def from_positional(tp: Any, data: Any) -> Any:
    """Rebuild a value of type `tp` written by to_positional (dataclasses, tuple[X, ...], X | None)."""
    if data is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return from_positional(args[0], data) if len(args) == 1 else data
    if origin is tuple:
        targs = typing.get_args(tp)
        if len(targs) == 2 and targs[1] is Ellipsis:
            return tuple(from_positional(targs[0], x) for x in data)
        return tuple(from_positional(a, x) for a, x in zip(targs, data, strict=True))
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        hints, fs = _hints(tp), _fields(tp)
        if len(data) > len(fs):
            raise ValueError(f"{tp.__name__}: {len(data)} values for {len(fs)} fields")
        # Fewer values: written before fields were added at the end; those take their defaults.
        return tp(*(from_positional(hints[f.name], x) for f, x in zip(fs, data, strict=False)))
    if isinstance(tp, type) and issubclass(tp, Enum):
        return tp(data)
    if tp is float and isinstance(data, int):
        return float(data)
    return data
