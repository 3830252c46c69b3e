"""Rules across a scenario's sections, and the frozen `Scenario` a valid document becomes.

The document models check each object alone; here the sections meet. Node names and GPU UUIDs are
unique, a shared node's unset `rename` follows what its pods ask for, and every pod is checked against
its node (the resource is advertised, a shared GPU serves one replica per container, pins name real GPUs
or MIG instances of the right profile, memory fits the device) and against earlier pods (a reused name
waits for the old pod's stop, UIDs are unique). Events must name existing nodes, GPUs and instances
before the end. Allocation conflicts (more pods than devices at some moment) are found by
`periscope.sim.cluster.model`. Every problem is an `Invalid` with its path from the top of the file.
"""

from __future__ import annotations

import re

from periscope.core.duration import format_duration_ms
from periscope.sim.scenario.document import PIN, Container, Event, Pod, ScenarioDocument
from periscope.sim.scenario.specs import (
    FAULT_DEFAULT_MS,
    SHARED_RESOURCE,
    ComponentSpec,
    ContainerSpec,
    FaultSpec,
    Invalid,
    NodeSpec,
    PodSpec,
    PolicySpec,
    Scenario,
    SharingSpec,
    UserSpec,
    XidSpec,
    mig_memory_mib,
)

_PIN = re.compile(PIN)


def build_scenario(doc: ScenarioDocument, source: str, default_name: str) -> Scenario:
    if doc.duration <= 0:
        raise Invalid("duration", "must be longer than 0s")
    if not 10 <= doc.tick <= doc.duration:
        raise Invalid("tick", f"must be between 10ms and the duration ({format_duration_ms(doc.duration)})")
    pods = tuple(_pod(p, f"pods[{i}]", doc.duration) for i, p in enumerate(doc.pods or ()))
    nodes = _nodes(doc, pods)
    by_name = {n.name: n for n in nodes}
    for i, pod in enumerate(pods):
        _check_pod(pod, f"pods[{i}]", by_name, pods[:i])
    events = [_event(e, f"events[{i}]", doc.duration, by_name) for i, e in enumerate(doc.events or ())]
    users = doc.users or ()
    for i, u in enumerate(users):
        for j, other in enumerate(users[:i]):
            if u.name == other.name:
                raise Invalid(f"users[{i}].name", f"user {u.name!r} is listed twice")
            if u.token == other.token:  # the token itself stays out of the message
                raise Invalid(f"users[{i}].token", f"the same token as users[{j}]")
    policy = doc.policy
    return Scenario(
        name=doc.name or default_name,
        seed=doc.seed,
        duration_ms=doc.duration,
        tick_ms=doc.tick,
        nodes=nodes,
        pods=pods,
        xids=tuple(sorted((e for e in events if isinstance(e, XidSpec)), key=lambda x: x.at_ms)),
        faults=tuple(sorted((e for e in events if isinstance(e, FaultSpec)), key=lambda f: f.at_ms)),
        policy=None
        if policy is None
        else PolicySpec(
            policy.name,
            policy.state,
            tuple((k, c or ComponentSpec()) for k, c in (policy.components or {}).items()),
        ),
        source=source,
        users=tuple(UserSpec(u.name, u.token, tuple(u.namespaces), u.cluster) for u in users),
    )


# ---------------------------------------------------------------- nodes


def _nodes(doc: ScenarioDocument, pods: tuple[PodSpec, ...]) -> tuple[NodeSpec, ...]:
    nodes: list[NodeSpec] = []
    uuids: set[str] = set()
    for i, n in enumerate(doc.nodes):
        if any(o.name == n.name for o in nodes):
            raise Invalid(f"nodes[{i}].name", f"node {n.name!r} is listed twice")
        for j, g in enumerate(n.gpus):
            if g.uuid in uuids:
                raise Invalid(f"nodes[{i}].gpus[{j}].uuid", f"{g.uuid} is used by another GPU")
            if g.uuid is not None:
                uuids.add(g.uuid)
        sharing = SharingSpec()
        if n.sharing is not None and n.sharing.strategy != "none":
            # An unset `rename` follows what the pods ask for: nvidia.com/gpu.shared means the plugin renames.
            asked = any(c.resource == SHARED_RESOURCE for p in pods if p.node == n.name for c in p.containers)
            rename = asked if n.sharing.rename is None else n.sharing.rename
            sharing = SharingSpec(n.sharing.strategy, n.sharing.replicas or 1, rename)
        nodes.append(NodeSpec(n.name, tuple(n.gpus), sharing, n.checkpoint))
    return tuple(nodes)


# ---------------------------------------------------------------- pods


def _pod(p: Pod, path: str, duration: int) -> PodSpec:
    if p.start >= duration:
        raise Invalid(
            f"{path}.start",
            f"{format_duration_ms(p.start)} is not before the end ({format_duration_ms(duration)})",
        )
    if p.stop is not None and not p.start < p.stop <= duration:
        raise Invalid(f"{path}.stop", "must be after start and not after the scenario's duration")
    return PodSpec(
        name=p.name,
        node=p.node,
        containers=tuple(_container(c) for c in p.containers),
        namespace=p.namespace,
        uid=p.uid,
        owner_kind=p.owner.kind if p.owner else "",
        owner_name=p.owner.name if p.owner else "",
        start_ms=p.start,
        stop_ms=p.stop,
        qos=p.qos,
        labels=tuple((p.labels or {}).items()),
    )


def _container(c: Container) -> ContainerSpec:
    devices = None if c.devices is None else tuple(c.devices)
    return ContainerSpec(c.name, c.resource, c.count, c.steps(), c.memory_mib, c.processes, devices)


def _check_pod(pod: PodSpec, path: str, nodes: dict[str, NodeSpec], earlier: tuple[PodSpec, ...]) -> None:
    node = nodes.get(pod.node)
    if node is None:
        raise Invalid(f"{path}.node", f"no node {pod.node!r} in nodes (nodes: {', '.join(nodes)})")
    for j, c in enumerate(pod.containers):
        cpath = f"{path}.containers[{j}]"
        if c.resource not in node.resources():
            raise Invalid(
                f"{cpath}.resource",
                f"node {node.name} does not advertise {c.resource} (it has: {', '.join(node.resources())})",
            )
        if node.sharing.strategy != "none" and c.resource == node.shared_resource and c.count > 1:
            raise Invalid(
                f"{cpath}.count", "one replica per container on a shared GPU (failRequestsGreaterThanOne)"
            )
        for k, pin in enumerate(c.devices or ()):
            _check_pin(pin, f"{cpath}.devices[{k}]", node, c.resource)
        cap = _device_memory(node, c)
        if c.memory_mib > cap:
            raise Invalid(
                f"{cpath}.memory_mib", f"{c.memory_mib:g} MiB does not fit a {c.resource} device ({cap} MiB)"
            )
    for j, other in enumerate(earlier):
        same_name = (other.namespace, other.name) == (pod.namespace, pod.name)
        if same_name and (other.stop_ms is None or other.stop_ms > pod.start_ms):
            raise Invalid(
                path,
                f"pod {pod.namespace}/{pod.name} still exists at {format_duration_ms(pod.start_ms)} "
                f"(pods[{j}]); a reused name must start at or after the old pod's stop",
            )
        if pod.uid is not None and other.uid == pod.uid:
            raise Invalid(f"{path}.uid", f"{pod.uid} is also the UID of pods[{j}]")


def _check_pin(pin: str, path: str, node: NodeSpec, resource: str) -> None:
    m = _PIN.match(pin)
    assert m is not None  # the document's pattern
    g = int(m.group(1))
    if g >= len(node.gpus):
        raise Invalid(path, f"node {node.name} has no GPU {g} (it has {len(node.gpus)})")
    gpu = node.gpus[g]
    if m.group(2) is None:
        if gpu.mig:
            raise Invalid(path, f'GPU {g} of {node.name} is in MIG mode; pin a MIG instance such as "{g}:0"')
        if resource.startswith("nvidia.com/mig-"):
            raise Invalid(path, f'{resource} needs a MIG instance pin such as "{g}:0"')
        return
    k = int(m.group(2))
    if k >= len(gpu.mig):
        raise Invalid(path, f"GPU {g} of {node.name} has no MIG instance {k}")
    if resource != f"nvidia.com/mig-{gpu.mig[k]}":
        raise Invalid(path, f"MIG instance {g}:{k} is a {gpu.mig[k]}, not {resource}")


def _device_memory(node: NodeSpec, c: ContainerSpec) -> int:
    if c.resource.startswith("nvidia.com/mig-"):
        return mig_memory_mib(c.resource.removeprefix("nvidia.com/mig-"))
    return max(g.memory_mib for g in node.gpus if not g.mig)


# ---------------------------------------------------------------- events


def _event(e: Event, path: str, duration: int, nodes: dict[str, NodeSpec]) -> XidSpec | FaultSpec:
    if e.at >= duration:
        raise Invalid(
            f"{path}.at", f"{format_duration_ms(e.at)} is not before the end ({format_duration_ms(duration)})"
        )
    if e.xid is not None:
        node = _known_node(e.xid.node, f"{path}.xid.node", nodes)
        if e.xid.gpu >= len(node.gpus):
            raise Invalid(f"{path}.xid.gpu", f"node {node.name} has no GPU {e.xid.gpu}")
        if e.xid.mig is not None and e.xid.mig >= len(node.gpus[e.xid.gpu].mig):
            raise Invalid(
                f"{path}.xid.mig", f"GPU {e.xid.gpu} of {node.name} has no MIG instance {e.xid.mig}"
            )
        return XidSpec(e.at, node.name, e.xid.gpu, e.xid.code, e.xid.mig)
    assert e.fault is not None  # the document has exactly one of xid or fault
    if e.node is not None:
        node = _known_node(e.node, f"{path}.node", nodes)
        if e.fault == "checkpoint-corrupt" and node.checkpoint == "none":
            raise Invalid(f"{path}.node", f"node {node.name} has no checkpoint file (checkpoint: none)")
    length = e.duration if e.duration is not None else FAULT_DEFAULT_MS.get(e.fault, 0)
    return FaultSpec(e.at, e.fault, e.node, length)


def _known_node(name: str, path: str, nodes: dict[str, NodeSpec]) -> NodeSpec:
    if name not in nodes:
        raise Invalid(path, f"no node {name!r} in nodes (nodes: {', '.join(nodes)})")
    return nodes[name]
