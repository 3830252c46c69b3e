"""Equal strings held once per node.

The pod registry, the device inventory and the allocation snapshots a node keeps name the same pods,
containers and GPUs, each decoded from its own message into its own string objects. When one of them
is stored (rarely: on change), its strings are swapped for the equal ones the node already holds, so a
long-running joiner keeps one copy of each UID, name and device ID per node. Values stay equal, so
nothing that compares or hashes them changes.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace
from typing import Any, TypeVar

T = TypeVar("T")


def collect(obj: object, pool: dict[str, str]) -> None:
    """Add every string inside `obj` (tuples and dataclass instances, walked) to `pool`."""
    stack = [obj]
    while stack:
        o = stack.pop()
        if type(o) is str:
            pool.setdefault(o, o)
        elif isinstance(o, tuple):
            stack.extend(o)
        elif is_dataclass(o) and not isinstance(o, type):
            stack.extend(getattr(o, f.name) for f in fields(o))


def share(obj: T, pool: dict[str, str]) -> T:
    """`obj` with each string replaced by the equal one in `pool` (new strings are added to it); `obj`
    itself when nothing changed. Walks tuples and frozen dataclass instances; other values stay."""
    return _share(obj, pool)  # type: ignore[no-any-return]


def _share(o: Any, pool: dict[str, str]) -> Any:
    if type(o) is str:
        return pool.setdefault(o, o)
    if type(o) is tuple:
        items = [_share(x, pool) for x in o]
        return o if all(a is b for a, b in zip(items, o, strict=True)) else tuple(items)
    if is_dataclass(o) and not isinstance(o, type):
        changed = {}
        for f in fields(o):
            if f.init:
                v = getattr(o, f.name)
                s = _share(v, pool)
                if s is not v:
                    changed[f.name] = s
        return replace(o, **changed) if changed else o
    return o
