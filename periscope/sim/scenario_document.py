"""The top level of a scenario file: its keys, the order sections are checked in, and the ClusterPolicy.

`build_scenario` reads the name, seed, duration and tick, then the nodes, then the pods; it settles each
shared node's unset `rename` from what its pods ask for before checking pods against nodes, then reads
the events and the optional GPU Operator `policy:` section, and returns the frozen `Scenario` with
events sorted by time. Any problem surfaces as `Invalid` with the path where it was found.
"""

from __future__ import annotations

from typing import Any

from periscope.core.duration import format_duration_ms
from periscope.sim.scenario_fields import (
    DNS_NAME,
    Invalid,
    as_bool,
    as_choice,
    as_duration,
    as_int,
    as_list,
    as_mapping,
    as_str,
    need,
)
from periscope.sim.scenario_nodes import event_spec, node_spec
from periscope.sim.scenario_pods import check_pod, pod_spec
from periscope.sim.scenario_specs import (
    COMPONENTS,
    POLICY_STATES,
    SHARED_RESOURCE,
    ComponentSpec,
    FaultSpec,
    NodeSpec,
    PolicySpec,
    Scenario,
    SharingSpec,
    UserSpec,
    XidSpec,
)

_TOP = ("name", "seed", "duration", "tick", "nodes", "pods", "events", "users", "policy")
_USER = ("name", "token", "namespaces", "cluster")
_POLICY = ("name", "state", "components")
_COMPONENT = ("enabled", "desired", "ready", "present")


# ---------------------------------------------------------------- document


def build_scenario(data: Any, source: str, default_name: str) -> Scenario:
    top = as_mapping(data, "", _TOP)
    need(top, "", "duration", "nodes")
    duration = as_duration(top["duration"], "duration")
    if duration <= 0:
        raise Invalid("duration", "must be longer than 0s")
    tick = as_duration(top.get("tick", "1s"), "tick")
    if not 10 <= tick <= duration:
        raise Invalid("tick", f"must be between 10ms and the duration ({format_duration_ms(duration)})")
    nodes: list[NodeSpec] = []
    renames: list[bool | None] = []
    uuids: set[str] = set()
    for i, raw in enumerate(as_list(top["nodes"], "nodes", nonempty=True)):
        node, rename = node_spec(raw, f"nodes[{i}]", uuids)
        if any(n.name == node.name for n in nodes):
            raise Invalid(f"nodes[{i}].name", f"node {node.name!r} is listed twice")
        nodes.append(node)
        renames.append(rename)
    raw_pods = as_list(top.get("pods") or [], "pods")
    pods = [pod_spec(raw, f"pods[{i}]", duration) for i, raw in enumerate(raw_pods)]
    # An unset `rename` follows what the pods ask for: nvidia.com/gpu.shared means the plugin renames.
    for i, (node, rename) in enumerate(zip(nodes, renames, strict=True)):
        if node.sharing.strategy != "none":
            asked = any(
                c.resource == SHARED_RESOURCE for p in pods if p.node == node.name for c in p.containers
            )
            nodes[i] = NodeSpec(
                node.name,
                node.gpus,
                SharingSpec(
                    node.sharing.strategy, node.sharing.replicas, asked if rename is None else rename
                ),
                node.checkpoint,
            )
    by_name = {n.name: n for n in nodes}
    for i, pod in enumerate(pods):
        check_pod(pod, f"pods[{i}]", by_name, pods[:i])
    xids: list[XidSpec] = []
    faults: list[FaultSpec] = []
    for i, raw in enumerate(as_list(top.get("events") or [], "events")):
        ev = event_spec(raw, f"events[{i}]", duration, by_name)
        (xids if isinstance(ev, XidSpec) else faults).append(ev)  # type: ignore[arg-type]
    policy = _policy(top["policy"], "policy") if top.get("policy") is not None else None
    return Scenario(
        name=as_str(top.get("name", default_name), "name"),
        seed=as_int(top.get("seed", 0), "seed", 0),
        duration_ms=duration,
        tick_ms=tick,
        nodes=tuple(nodes),
        pods=tuple(pods),
        xids=tuple(sorted(xids, key=lambda x: x.at_ms)),
        faults=tuple(sorted(faults, key=lambda f: f.at_ms)),
        policy=policy,
        source=source,
        users=_users(top.get("users") or []),
    )


# ---------------------------------------------------------------- users


def _users(raw: Any) -> tuple[UserSpec, ...]:
    users: list[UserSpec] = []
    for i, item in enumerate(as_list(raw, "users")):
        path = f"users[{i}]"
        m = as_mapping(item, path, _USER)
        need(m, path, "name", "token")
        name = as_str(m["name"], f"{path}.name")
        token = as_str(m["token"], f"{path}.token")
        if any(u.name == name for u in users):
            raise Invalid(f"{path}.name", f"user {name!r} is listed twice")
        if any(u.token == token for u in users):
            raise Invalid(f"{path}.token", "another user has this token")
        namespaces = tuple(
            as_str(ns, f"{path}.namespaces[{j}]", DNS_NAME, "a valid namespace name")
            for j, ns in enumerate(as_list(m.get("namespaces") or [], f"{path}.namespaces"))
        )
        cluster = as_bool(m["cluster"], f"{path}.cluster") if m.get("cluster") is not None else False
        users.append(UserSpec(name=name, token=token, namespaces=namespaces, cluster=cluster))
    return tuple(users)


# ---------------------------------------------------------------- policy


def _policy(raw: Any, path: str) -> PolicySpec:
    m = as_mapping(raw, path, _POLICY)
    comps: list[tuple[str, ComponentSpec]] = []
    cm = as_mapping(m.get("components") or {}, f"{path}.components", COMPONENTS)
    for key, val in cm.items():
        cpath = f"{path}.components.{key}"
        c = as_mapping(val if val is not None else {}, cpath, _COMPONENT)
        desired = as_int(c["desired"], f"{cpath}.desired", 0) if c.get("desired") is not None else None
        ready = as_int(c["ready"], f"{cpath}.ready", 0) if c.get("ready") is not None else None
        if desired is not None and ready is not None and ready > desired:
            raise Invalid(f"{cpath}.ready", f"{ready} is more than desired ({desired})")
        comps.append(
            (
                key,
                ComponentSpec(
                    enabled=as_bool(c["enabled"], f"{cpath}.enabled")
                    if c.get("enabled") is not None
                    else None,
                    desired=desired,
                    ready=ready,
                    present=as_bool(c["present"], f"{cpath}.present")
                    if c.get("present") is not None
                    else None,
                ),
            )
        )
    return PolicySpec(
        name=as_str(m.get("name", "cluster-policy"), f"{path}.name", DNS_NAME, "a valid name"),
        state=as_choice(m.get("state", "ready"), f"{path}.state", POLICY_STATES),
        components=tuple(comps),
    )
