"""Scenario files for the simulated cluster (CONTRACTS.md "Scenario files"): strict parse into frozen specs.

Every problem is reported as `scenario <file>: <path>: <problem>` with a path such as
`pods[2].containers[0].util_pct`, so a user can find it; nothing is started before a scenario validates.
Allocation conflicts (more pods than devices at some moment) are found by `periscope.sim.cluster`,
which raises the same `ScenarioError`.

The pieces live next to this module: the frozen specs in `scenario_specs`, the field readers in
`scenario_fields`, and the section rules in `scenario_nodes`, `scenario_pods` and `scenario_document`.
This module reads the YAML strictly, finds built-in scenarios, and keeps every public name importable
from here.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from periscope.core.duration import format_duration_ms
from periscope.sim.scenario_document import build_scenario
from periscope.sim.scenario_fields import Invalid
from periscope.sim.scenario_specs import (
    CHECKPOINT_FORMATS,
    COMPONENTS,
    FAULT_DEFAULT_MS,
    FAULTS,
    GPU_RESOURCE,
    MIG_PROFILE,
    NODE_FAULTS,
    POLICY_STATES,
    QOS,
    SHARED_RESOURCE,
    SHARING,
    ComponentSpec,
    ContainerSpec,
    FaultSpec,
    GpuSpec,
    NodeSpec,
    PodSpec,
    PolicySpec,
    Scenario,
    ScenarioError,
    SharingSpec,
    UserSpec,
    XidSpec,
    mig_memory_mib,
    mig_slices,
)

__all__ = [
    "CHECKPOINT_FORMATS",
    "COMPONENTS",
    "FAULTS",
    "FAULT_DEFAULT_MS",
    "GPU_RESOURCE",
    "MIG_PROFILE",
    "NODE_FAULTS",
    "POLICY_STATES",
    "QOS",
    "SHARED_RESOURCE",
    "SHARING",
    "ComponentSpec",
    "ContainerSpec",
    "FaultSpec",
    "GpuSpec",
    "NodeSpec",
    "PodSpec",
    "PolicySpec",
    "Scenario",
    "ScenarioError",
    "SharingSpec",
    "UserSpec",
    "XidSpec",
    "builtin_names",
    "describe",
    "load_scenario",
    "mig_memory_mib",
    "mig_slices",
    "parse_scenario",
]


# ---------------------------------------------------------------- loading


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader without YAML 1.1 base-60 numbers (so `0:1` stays a string) and with duplicate keys
    rejected instead of silently overwritten."""


_StrictLoader.yaml_implicit_resolvers = {
    ch: [(tag, rx) for tag, rx in rs if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for ch, rs in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^[-+]?(?:0|[1-9][0-9_]*)$"), list("-+0123456789")
)
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|\.[0-9_]+)$"),
    list("-+0123456789."),
)


def _mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (line {mark.line + 1})", mark
            )
        seen[key] = loader.construct_object(value_node, deep=True)
    return seen


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def builtin_names() -> tuple[str, ...]:
    folder = resources.files("periscope.sim") / "scenarios"
    return tuple(sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml")))


def load_scenario(ref: str) -> Scenario:
    """Load a built-in scenario by name (`demo`) or a YAML file by path."""
    path = Path(ref)
    if path.suffix not in (".yaml", ".yml") and "/" not in ref and not path.exists():
        if ref not in builtin_names():
            raise ScenarioError(
                f"scenario {ref}: no such file or built-in scenario (built-in: {', '.join(builtin_names())})"
            )
        text = (resources.files("periscope.sim") / "scenarios" / f"{ref}.yaml").read_text("utf-8")
        return parse_scenario(text, ref)
    try:
        text = path.read_text("utf-8")
    except OSError as e:
        raise ScenarioError(f"scenario {ref}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"scenario {ref}: not a UTF-8 text file") from None
    return parse_scenario(text, ref)


def parse_scenario(text: str, source: str = "<string>") -> Scenario:
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or getattr(e, "context", None) or str(e)
        raise ScenarioError(f"scenario {source}: invalid YAML{where}: {problem}") from None
    try:
        return build_scenario(data, source, Path(source).stem if source else "scenario")
    except Invalid as e:
        raise ScenarioError(f"scenario {source}: {e}") from None


def describe(s: Scenario) -> str:
    gpus = sum(len(n.gpus) for n in s.nodes)
    return (
        f"{s.name}: {len(s.nodes)} nodes, {gpus} GPUs, {len(s.pods)} pods, "
        f"{format_duration_ms(s.duration_ms)} at {format_duration_ms(s.tick_ms)} ticks"
    )
