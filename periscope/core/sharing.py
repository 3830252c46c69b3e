"""Equal strings (and tuples of strings) held once per node.

The pod registry, the device inventory and the allocation snapshots a node keeps name the same pods,
containers and GPUs, each decoded from its own message into its own string objects. When one of them
is stored (rarely: on change), its strings are swapped for the equal ones the node already holds, so a
long-running joiner keeps one copy of each UID, name and device ID per node; a string new to the node is
interned, so the samples' copies of them (which the bus decoder interns) are the same objects too.
Values stay equal, so nothing that compares or hashes them changes.
"""

from __future__ import annotations

import sys
from dataclasses import fields, is_dataclass, replace
from functools import cache
from typing import Any, TypeVar

T = TypeVar("T")


Pool = dict[object, object]  # str -> the node's equal str; tuple of such -> the node's equal tuple


@cache
def _names(cls: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The names of a type's dataclass fields (all; those of __init__), none for any other type: known
    per type, as `fields()` per object walked was a twentieth of a replay's core time."""
    fs = fields(cls) if is_dataclass(cls) else ()
    return tuple(f.name for f in fs), tuple(f.name for f in fs if f.init)


def collect(obj: object, pool: Pool) -> None:
    """Add every string inside `obj`, and every tuple made of strings and such tuples (label and
    request pairs, device ID lists), to `pool` (tuples and dataclass instances are walked)."""
    _collect(obj, pool)


def _collect(o: object, pool: Pool) -> bool:
    """True when `o` may be pooled: a str, or a tuple of strings and such tuples."""
    if type(o) is str:
        pool.setdefault(o, o)
        return True
    if type(o) is tuple:
        ok = True
        for x in o:
            ok = _collect(x, pool) and ok
        if ok:
            pool.setdefault(o, o)
        return ok
    cls: type = type(o)
    for name in _names(cls)[0]:
        _collect(getattr(o, name), pool)
    return False


def share(obj: T, pool: Pool) -> T:
    """`obj` with each string, and each tuple of strings (and such tuples), replaced by the equal one
    in `pool` (new ones are added to it); `obj` itself when nothing changed. Walks tuples and frozen
    dataclass instances; other values stay. (Tuples holding numbers are not pooled: 1 == 1.0.)"""
    return _share(obj, pool)  # type: ignore[no-any-return]


def _share(o: Any, pool: Pool) -> Any:
    if type(o) is str:
        got = pool.get(o)
        if got is None:  # interned: the same object as the names the bus decoder interns in samples
            got = pool[o] = sys.intern(o)
        return got
    if type(o) is tuple:
        items = [_share(x, pool) for x in o]
        t = o if all(a is b for a, b in zip(items, o, strict=True)) else tuple(items)
        if all(type(x) is str or (type(x) is tuple and pool.get(x) is x) for x in t):
            return pool.setdefault(t, t)
        return t
    cls: type = type(o)
    names, init = _names(cls)
    if names:
        changed = {}
        for name in init:
            v = getattr(o, name)
            s = _share(v, pool)
            if s is not v:
                changed[name] = s
        return replace(o, **changed) if changed else o
    return o
