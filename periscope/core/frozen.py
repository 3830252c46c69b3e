"""Cheaper construction of frozen, slotted dataclasses.

A frozen dataclass's generated `__init__` stores every field through `object.__setattr__` (a frozen
class forbids plain assignment), about 100 ns a field; the engine and the bus decoder build about a
hundred fields' worth of such objects for every device of every sample. `fast_init` gives the class an
`__init__` of the same signature that stores each field with a plain assignment, a sixth of that cost,
and so drops the run-time guard against assignment after construction: immutability of these classes is
checked by mypy (`make lint`: an assignment to a field of a frozen dataclass is a type error wherever
mypy knows the object's type in `periscope` and `services`, unannotated functions included), and at run
time in the test suite, which sets GUARDED before the classes are built (tests/conftest.py). With the
guard, each field is stored through its slot descriptor (about half the generated cost) and assignment
raises `FrozenInstanceError` as before.
Everything else the dataclass defines (eq, hash, repr, `fields()`, `replace()`, pickling) is unchanged.
Measured on the replay benchmark's cluster without the guard: decoding and core together 21 % fewer
instructions (bench/README.md, "Frozen classes").
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")

# Whether the classes built from now on refuse assignment at run time (they are built at import).
GUARDED = False


def fast_init(cls: type[T], *, guarded: bool | None = None) -> type[T]:
    """Replace the generated `__init__` of a frozen, slotted dataclass whose fields all take their
    value from `__init__` with plain defaults (no factories, no `__post_init__`). Unless `guarded`
    (default: GUARDED), assignment to its instances is no longer refused at run time."""
    guard = GUARDED if guarded is None else guarded
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
        if guard:
            ns[f"_s{i}"] = cls.__dict__[f.name].__set__  # the slot's member descriptor
            body.append(f"    _s{i}(self, {f.name})")
        else:
            body.append(f"    self.{f.name} = {f.name}")
    src = f"def __init__(self, {', '.join(args)}):\n" + ("\n".join(body) or "    pass") + "\n"
    exec(src, ns)  # generated from the class's own field names, as dataclasses does
    init = ns["__init__"]
    old = cls.__init__
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__annotations__ = dict(getattr(old, "__annotations__", {}))
    init.__doc__ = old.__doc__
    cls.__init__ = init  # type: ignore[method-assign]
    if not guard:
        # object's own: a slot assignment the interpreter specializes (the frozen ones are Python
        # functions that raise, called for every store, the constructor's included).
        del cls.__setattr__, cls.__delattr__
    return cls


def fast_init_all(namespace: dict[str, Any]) -> None:
    """`fast_init` every frozen, slotted dataclass defined in a module (pass its `globals()`)."""
    module = namespace["__name__"]
    for obj in list(namespace.values()):
        if (isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == module
                and obj.__dataclass_params__.frozen):  # type: ignore[attr-defined]
            fast_init(obj)
