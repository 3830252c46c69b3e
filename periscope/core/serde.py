"""Dataclass <-> JSON-compatible values, driven by type hints, for persisting engine state.

Deterministic (dict keys sorted by the caller's json.dumps(sort_keys=True)); used for Faust table values
and the state snapshots replay can start from.
"""

from __future__ import annotations

import dataclasses
import operator
import types
import typing
from collections.abc import Callable
from enum import Enum
from functools import cache
from typing import Any

# Per-type encoders, built once per class: the state is written every few seconds per node, and
# asking dataclasses.is_dataclass of every value took most of a persist's time.
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _dispatch(positional: bool) -> Callable[[Any], Any]:
    """The encoding function: scalars as they are, anything else by its type's encoder."""
    encoders: dict[type, Callable[[Any], Any]] = {}

    def encode(obj: Any) -> Any:
        tp = type(obj)
        if tp in _SCALARS:
            return obj
        enc = encoders.get(tp)
        if enc is None:
            enc = encoders[tp] = _encoder(tp, encode, positional)
        return enc(obj)

    return encode


to_jsonable = _dispatch(positional=False)
# Like to_jsonable, but a dataclass becomes the list of its field values in declaration order: about a
# third of the size, for records written often (the last published outputs).
to_positional = _dispatch(positional=True)


def _encoder(tp: type, each: Callable[[Any], Any], positional: bool) -> Callable[[Any], Any]:
    if dataclasses.is_dataclass(tp):
        names = tuple(f.name for f in _fields(tp))
        if not names:
            return lambda obj: [] if positional else {}
        get = operator.attrgetter(*names)
        if len(names) == 1:  # (attrgetter of one name gives the value, not a tuple)
            if positional:
                return lambda obj: [each(get(obj))]
            return lambda obj: {names[0]: each(get(obj))}
        if _scalar_fields(tp):  # (most of a process sample's encoding went to calls on its scalars)
            if positional:
                return lambda obj: list(get(obj))
            return lambda obj: dict(zip(names, get(obj), strict=True))
        if positional:
            return lambda obj: list(map(each, get(obj)))
        return lambda obj: dict(zip(names, map(each, get(obj)), strict=True))
    if issubclass(tp, Enum):
        return lambda obj: obj.value
    if issubclass(tp, tuple | list):
        return lambda obj: list(map(each, obj))
    if issubclass(tp, dict) and not positional:
        return lambda obj: {str(k): each(v) for k, v in obj.items()}
    return lambda obj: obj


def _scalar_fields(cls: type) -> bool:
    """Whether every field of dataclass `cls` is declared a JSON scalar (str, int, float, bool, or one
    of them or None): its values are then written as they are."""
    try:
        hints = _hints(cls)
    except Exception:  # a hint that does not resolve: not known to be scalar
        return False
    for f in _fields(cls):
        hint = hints.get(f.name)
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        args = typing.get_args(hint) if union else (hint,)
        if not all(a in _SCALARS for a in args):
            return False
    return True


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
