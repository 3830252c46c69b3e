"""Typed field readers for scenario files, each naming the path of the value it rejects.

A reader checks one YAML value (a mapping with only known keys, a list, a string, a bounded number, a
boolean, a duration, one of a set of choices) and returns it typed, or raises `Invalid` with the dotted
path (`pods[2].containers[0].util_pct`) and the problem in words, with a "did you mean" hint for a
misspelt key. The section rules build on these; `periscope.sim.scenario` turns `Invalid` into the
public `ScenarioError`.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from periscope.core.duration import parse_duration_ms

_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


class Invalid(Exception):
    """One problem at one path of a scenario file; `parse_scenario` reports it as a `ScenarioError`."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = path, problem


def need(m: dict[str, Any], path: str, *keys: str) -> None:
    for key in keys:
        if m.get(key) is None:
            raise Invalid(_join(path, key), "required")


# ---------------------------------------------------------------- field readers


def as_mapping(v: Any, path: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise Invalid(path or "(top level)", f"expected a mapping, got {_kind(v)}")
    for k in v:
        if not isinstance(k, str) or k not in allowed:
            hint = difflib.get_close_matches(str(k), allowed, n=1)
            raise Invalid(
                _join(path, str(k)), "unknown key" + (f" (did you mean {hint[0]}?)" if hint else "")
            )
    return v


def as_list(v: Any, path: str, nonempty: bool = False) -> list[Any]:
    if not isinstance(v, list):
        raise Invalid(path, f"expected a list, got {_kind(v)}")
    if nonempty and not v:
        raise Invalid(path, "must not be empty")
    return v


def as_str(v: Any, path: str, pattern: re.Pattern[str] | None = None, what: str = "") -> str:
    if not isinstance(v, str) or not v:
        raise Invalid(path, f"expected a non-empty string, got {_kind(v)}")
    if pattern is not None and not pattern.match(v):
        raise Invalid(path, f"{v!r} is not {what or 'valid'}")
    return v


def as_int(v: Any, path: str, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise Invalid(path, f"expected an integer, got {_kind(v)}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        bounds = f"between {lo} and {hi}" if lo is not None and hi is not None else f">= {lo}"
        raise Invalid(path, f"{v} is out of range (must be {bounds})")
    return v


def as_number(v: Any, path: str, lo: float, hi: float | None = None) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise Invalid(path, f"expected a number, got {_kind(v)}")
    if v < lo or (hi is not None and v > hi):
        bounds = f"{lo:g}..{hi:g}" if hi is not None else f">= {lo:g}"
        raise Invalid(path, f"{v} is out of range (must be {bounds})")
    return float(v)


def as_bool(v: Any, path: str) -> bool:
    if not isinstance(v, bool):
        raise Invalid(path, f"expected true or false, got {_kind(v)}")
    return v


def as_duration(v: Any, path: str) -> int:
    """A duration string (`90s`) or a plain number of seconds."""
    if isinstance(v, bool):
        raise Invalid(path, f"expected a duration such as 30s, got {_kind(v)}")
    if isinstance(v, int | float):
        if v < 0:
            raise Invalid(path, "must not be negative")
        return round(v * 1000)
    if not isinstance(v, str):
        raise Invalid(path, f"expected a duration such as 30s, got {_kind(v)}")
    try:
        return parse_duration_ms(v)
    except ValueError:
        raise Invalid(path, f"not a duration: {v!r} (use e.g. 90s, 10m, 2h)") from None


def as_choice(v: Any, path: str, choices: tuple[str, ...]) -> str:
    if not isinstance(v, str) or v not in choices:
        raise Invalid(path, f"{v!r} is not one of {', '.join(choices)}")
    return v


def uuid_pattern(prefix: str = "") -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(prefix)}{_UUID}$")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _kind(v: Any) -> str:
    if v is None:
        return "nothing (null)"
    if isinstance(v, bool):
        return f"boolean {str(v).lower()}"
    if isinstance(v, dict):
        return "a mapping"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, str):
        return f"{v!r}"
    return f"{type(v).__name__} {v!r}"
