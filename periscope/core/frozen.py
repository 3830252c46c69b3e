"""Cheaper construction of frozen, slotted dataclasses.

A frozen dataclass's generated `__init__` stores every field through `object.__setattr__` (a frozen
class forbids plain assignment), about 100 ns a field; the engine and the bus decoder build several
such objects for every device of every sample. `fast_init` gives the class an `__init__` of the same
signature that stores each field through its slot descriptor, about half the cost. Everything else
the dataclass defines (eq, hash, repr, `fields()`, `replace()`, immutability) is unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


def fast_init(cls: type[T]) -> type[T]:
    """Replace the generated `__init__` of a frozen, slotted dataclass whose fields all take their
    value from `__init__` with plain defaults (no factories, no `__post_init__`)."""
    params = dataclasses.fields(cls)  # type: ignore[arg-type]
    params_ok = all(f.init and not f.kw_only and f.default_factory is dataclasses.MISSING for f in params)
    if (not params_ok or not getattr(cls, "__slots__", None) or hasattr(cls, "__post_init__")
            or not cls.__dataclass_params__.frozen):  # type: ignore[attr-defined]
        raise TypeError(f"fast_init: {cls.__name__} is not a plain frozen, slotted dataclass")
    ns: dict[str, Any] = {}
    args, body = [], []
    for i, f in enumerate(params):
        if f.default is dataclasses.MISSING:
            args.append(f.name)
        else:
            ns[f"_d{i}"] = f.default
            args.append(f"{f.name}=_d{i}")
        ns[f"_s{i}"] = cls.__dict__[f.name].__set__  # the slot's member descriptor
        body.append(f"    _s{i}(self, {f.name})")
    src = f"def __init__(self, {', '.join(args)}):\n" + ("\n".join(body) or "    pass") + "\n"
    exec(src, ns)  # generated from the class's own field names, as dataclasses does
    init = ns["__init__"]
    old = cls.__init__
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__annotations__ = dict(getattr(old, "__annotations__", {}))
    init.__doc__ = old.__doc__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


def fast_init_all(namespace: dict[str, Any]) -> None:
    """`fast_init` every frozen, slotted dataclass defined in a module (pass its `globals()`)."""
    module = namespace["__name__"]
    for obj in list(namespace.values()):
        if (isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == module
                and obj.__dataclass_params__.frozen):  # type: ignore[attr-defined]
            fast_init(obj)
