"""Scenario files for the simulated cluster (docs/scenarios.md): strict parse into frozen models.

Every problem is reported as `scenario <file>: <path>: <problem>` with a path such as
`pods[2].containers[0].util_pct`, so a user can find it; nothing is started before a scenario validates.
The file's shape is pydantic models (`scenario.document`, published as docs/scenario.schema.json),
which are also what the simulator reads; the rules across its sections are `rules`, the field types
`specs`. This module reads the YAML strictly, words pydantic's first error the way the rest of
the command line does, finds built-in scenarios, and keeps every public name importable from here.
Allocation conflicts (more pods than devices at some moment) are found by `periscope.sim.cluster.model`,
which raises the same `ScenarioError`.
"""

from __future__ import annotations

import difflib
import json
import os
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from periscope.cli.terminal import shown
from periscope.core.duration import format_duration_ms
from periscope.sim.scenario.document import *  # noqa: F403  (every model stays importable from here)
from periscope.sim.scenario.document import Scenario
from periscope.sim.scenario.loader import MAX_BYTES, StrictLoader, YamlLimit, load_yaml  # noqa: F401
from periscope.sim.scenario.rules import build_scenario
from periscope.sim.scenario.specs import *  # noqa: F403  (every type and constant stays importable from here)
from periscope.sim.scenario.specs import Invalid, ScenarioError, describe_value

# ---------------------------------------------------------------- loading


def builtin_names() -> tuple[str, ...]:
    folder = resources.files("periscope.sim") / "scenarios"
    return tuple(sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml")))


def load_scenario(ref: str) -> Scenario:
    """Load a built-in scenario by name (`demo`) or a YAML file by path."""
    path = Path(ref)
    # os.path.exists, not Path.exists: a name too long for the file system is "not there", not an error.
    if path.suffix not in (".yaml", ".yml") and "/" not in ref and not os.path.exists(ref):
        if ref not in builtin_names():
            raise ScenarioError(
                f"scenario {ref}: no such file or built-in scenario (built-in: {', '.join(builtin_names())})"
            )
        text = (resources.files("periscope.sim") / "scenarios" / f"{ref}.yaml").read_text("utf-8")
        scenario = parse_scenario(text, ref)
        scenario._location = ref
        return scenario
    try:
        with path.open("rb") as f:  # never more than the limit: a scenario is kilobytes
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise ScenarioError(f"scenario {ref}: cannot read: {e.strerror or e}") from None
    if len(data) > MAX_BYTES:
        raise ScenarioError(f"scenario {ref}: larger than {MAX_BYTES // (1024 * 1024)} MiB, not a scenario")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ScenarioError(f"scenario {ref}: not a UTF-8 text file") from None
    scenario = parse_scenario(text, ref)
    # What a child process started in another directory loads it from.
    scenario._location = str(path.resolve())
    return scenario


def parse_scenario(text: str, source: str = "<string>") -> Scenario:
    try:
        data = load_yaml(text)
    except YamlLimit as e:
        raise ScenarioError(f"scenario {source}: too large or too deep for a scenario: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or getattr(e, "context", None) or str(e)
        raise ScenarioError(f"scenario {source}: invalid YAML{where}: {problem}") from None
    except (ValueError, OverflowError) as e:  # a number or a date the YAML types cannot hold
        raise ScenarioError(f"scenario {source}: invalid YAML: {shown(e, 120)}") from None
    try:
        # Validated as the JSON the YAML describes, so the JSON Schema and the validator agree (strict JSON
        # takes arrays for tuples); YAML-only values such as dates arrive as strings and fail by name.
        doc = Scenario.model_validate_json(json.dumps(data, default=str))
        return build_scenario(doc, source, Path(source).stem if source else "scenario")
    except ValidationError as e:
        path, problem = _worded(e.errors()[0])
        raise ScenarioError(f"scenario {source}: {path}: {problem}") from None
    except Invalid as e:
        raise ScenarioError(f"scenario {source}: {e.path}: {e.problem}") from None
    except TypeError as e:  # a YAML mapping key json cannot write (a list or a mapping used as a key)
        raise ScenarioError(f"scenario {source}: (top level): {e}") from None


@cache
def json_schema() -> dict[str, Any]:
    """The scenario file's JSON Schema (docs/scenario.schema.json is this, written out)."""
    schema = Scenario.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Periscope scenario"
    return schema


# ---------------------------------------------------------------- pydantic errors in words

_EXPECTED = {
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "string_type": "a non-empty string",
    "string_too_short": "a non-empty string",  # only Text has a minimum length: got ''
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}
_RANGE = ("greater_than_equal", "less_than_equal", "greater_than", "less_than")


def _worded(err: ErrorDetails) -> tuple[str, str]:
    """(path, problem) for one pydantic error, worded as the scenario format's own messages."""
    loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("<"))]  # drop union tags
    kind, v, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    cause = ctx.get("error")
    if isinstance(cause, Invalid):
        return _path(loc, cause.path), cause.problem
    if kind == "extra_forbidden" or loc[-1:] == ["[key]"]:  # `[key]`: outside a mapping's vocabulary
        loc = loc[:-1] if loc[-1] == "[key]" else loc
        up = _at(loc[:-1])
        allowed = _find(up, "propertyNames", {}).get("enum") or list(_find(up, "properties", {}))
        hint = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        return _path(loc), "unknown key" + (f" (did you mean {hint[0]}?)" if hint else "")
    parent = _at(loc[:-1]) if loc and isinstance(loc[-1], int) else []
    if kind in ("missing", "too_short", "too_long") and _find(parent, "prefixItems"):
        return _path(loc[:-1]), f"expected {_find(parent, 'description')}"  # e.g. an [offset, pct] step
    if kind == "missing":
        return _path(loc), "required"
    nodes = _at(loc)
    if kind == "too_short" and not v:
        return _path(loc), "must not be empty"
    if kind in ("too_short", "too_long", "tuple_type") and _find(nodes, "description"):
        return _path(loc), f"expected {_find(nodes, 'description')}, got {describe_value(v)}"
    if kind == "literal_error":
        return _path(loc), f"{v!r} is not one of {', '.join(_find(nodes, 'enum', []))}"
    if kind == "string_pattern_mismatch":
        return _path(loc), f"{v!r} is not {_find(nodes, 'description') or 'valid'}"
    if kind in _RANGE:
        lo, hi = _find(nodes, "minimum"), _find(nodes, "maximum")
        if _find(nodes, "type") == "integer":
            bounds = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        else:
            bounds = f"{lo:g}..{hi:g}" if hi is not None else f">= {lo:g}"
        return _path(loc), f"{v} is out of range (must be {bounds})"
    if kind in _EXPECTED:
        return _path(loc), f"expected {_EXPECTED[kind]}, got {describe_value(v)}"
    return _path(loc), err["msg"]


def _path(loc: list[int | str], rel: str = "") -> str:
    """`pods[2].containers[0]` for a loc; `rel` is a path inside it, from a rule (`util_pct[1][0]`)."""
    parts = [*loc, rel] if rel else loc
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".") or "(top level)"


def _at(loc: list[int | str]) -> list[dict[str, Any]]:
    """The JSON Schema nodes (every branch of a union) that describe the value at `loc`."""
    schema = json_schema()

    def expand(node: dict[str, Any]) -> list[dict[str, Any]]:
        if "$ref" in node:
            node = schema["$defs"][node["$ref"].rsplit("/", 1)[-1]]
        return [node] + [n for key in ("anyOf", "oneOf") for m in node.get(key, []) for n in expand(m)]

    nodes = expand(schema)
    for p in loc:
        step: list[dict[str, Any]] = []
        for n in nodes:
            if isinstance(p, int) and p < len(n.get("prefixItems", [])):
                step += expand(n["prefixItems"][p])
            elif isinstance(p, int) and isinstance(n.get("items"), dict):
                step += expand(n["items"])
            elif isinstance(p, str) and p in n.get("properties", {}):
                step += expand(n["properties"][p])
            elif isinstance(p, str) and isinstance(n.get("additionalProperties"), dict):
                step += expand(n["additionalProperties"])
        nodes = step
    return nodes


def _find(nodes: list[dict[str, Any]], key: str, default: Any = None) -> Any:
    return next((n[key] for n in nodes if key in n), default)


def describe(s: Scenario) -> str:
    gpus = sum(len(n.gpus) for n in s.nodes)
    return (
        f"{s.name}: {len(s.nodes)} nodes, {gpus} GPUs, {len(s.pods)} pods, "
        f"{format_duration_ms(s.duration_ms)} at {format_duration_ms(s.tick_ms)} ticks"
    )

