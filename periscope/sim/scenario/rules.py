"""Rules across a scenario's sections, checked once every object has validated on its own.

The document models check each object alone; here the sections meet. Node names and GPU UUIDs are
unique, a shared node's unset `rename` follows what its pods ask for, and every pod is checked against
its node (the resource is advertised, a shared GPU serves one replica per container, pins name real GPUs
or MIG instances of the right profile, memory fits the device) and against earlier pods (a reused name
waits for the old pod's stop, UIDs are unique). Events must name existing nodes, GPUs and instances
before the end. Allocation conflicts (more pods than devices at some moment) are found by
`periscope.sim.cluster.model`. Every problem is an `Invalid` with its path from the top of the file.
"""

from __future__ import annotations

from periscope.core.duration import format_duration_ms
from periscope.sim.scenario.document import SHARED_RESOURCE, Container, Event, Node, Pod, Scenario
from periscope.sim.scenario.specs import Invalid, mig_memory_mib


def build_scenario(doc: Scenario, source: str, default_name: str) -> Scenario:
    """The document checked across its sections, with its name and every node's `rename` settled."""
    if doc.duration_ms <= 0:
        raise Invalid("duration", "must be longer than 0s")
    end = format_duration_ms(doc.duration_ms)
    if not 10 <= doc.tick_ms <= doc.duration_ms:
        raise Invalid("tick", f"must be between 10ms and the duration ({end})")
    for i, p in enumerate(doc.pods):
        _before_end(p.start_ms, f"pods[{i}].start", doc.duration_ms)
        if p.stop_ms is not None and not p.start_ms < p.stop_ms <= doc.duration_ms:
            raise Invalid(f"pods[{i}].stop", "must be after start and not after the scenario's duration")
    nodes = _nodes(doc)
    by_name = {n.name: n for n in nodes}
    for i, pod in enumerate(doc.pods):
        _check_pod(pod, f"pods[{i}]", by_name, doc.pods[:i])
    for i, e in enumerate(doc.events):
        _check_event(e, f"events[{i}]", doc.duration_ms, by_name)
    for i, u in enumerate(doc.users):
        for j, other in enumerate(doc.users[:i]):
            if u.name == other.name:
                raise Invalid(f"users[{i}].name", f"user {u.name!r} is listed twice")
            if u.token == other.token:  # the token itself stays out of the message
                raise Invalid(f"users[{i}].token", f"the same token as users[{j}]")
    scenario = doc.model_copy(update={"name": doc.name or default_name, "nodes": nodes})
    scenario._source = source
    return scenario


# ---------------------------------------------------------------- nodes


def _nodes(doc: Scenario) -> tuple[Node, ...]:
    nodes: list[Node] = []
    uuids: set[str] = set()
    for i, n in enumerate(doc.nodes):
        if any(o.name == n.name for o in nodes):
            raise Invalid(f"nodes[{i}].name", f"node {n.name!r} is listed twice")
        for j, g in enumerate(n.gpus):
            if g.uuid in uuids:
                raise Invalid(f"nodes[{i}].gpus[{j}].uuid", f"{g.uuid} is used by another GPU")
            if g.uuid is not None:
                uuids.add(g.uuid)
        if n.sharing.strategy != "none" and n.sharing.rename is None:
            # An unset `rename` follows what the pods ask for: nvidia.com/gpu.shared means the plugin renames.
            pods = (p for p in doc.pods if p.node == n.name)
            asked = any(c.resource == SHARED_RESOURCE for p in pods for c in p.containers)
            n = n.model_copy(update={"sharing": n.sharing.model_copy(update={"rename": asked})})
        nodes.append(n)
    return tuple(nodes)


# ---------------------------------------------------------------- pods


def _before_end(at_ms: int, path: str, duration: int) -> None:
    if at_ms >= duration:
        end = format_duration_ms(duration)
        raise Invalid(path, f"{format_duration_ms(at_ms)} is not before the end ({end})")


def _check_pod(pod: Pod, path: str, nodes: dict[str, Node], earlier: tuple[Pod, ...]) -> None:
    node = _known_node(pod.node, f"{path}.node", nodes)
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


def _check_pin(pin: str, path: str, node: Node, resource: str) -> None:
    g_text, _, k_text = pin.partition(":")  # the document's pattern: "<gpu>" or "<gpu>:<mig>"
    g = int(g_text)
    if g >= len(node.gpus):
        raise Invalid(path, f"node {node.name} has no GPU {g} (it has {len(node.gpus)})")
    gpu = node.gpus[g]
    if not k_text:
        if gpu.mig:
            raise Invalid(path, f'GPU {g} of {node.name} is in MIG mode; pin a MIG instance such as "{g}:0"')
        if resource.startswith("nvidia.com/mig-"):
            raise Invalid(path, f'{resource} needs a MIG instance pin such as "{g}:0"')
        return
    k = int(k_text)
    if k >= len(gpu.mig):
        raise Invalid(path, f"GPU {g} of {node.name} has no MIG instance {k}")
    if resource != f"nvidia.com/mig-{gpu.mig[k]}":
        raise Invalid(path, f"MIG instance {g}:{k} is a {gpu.mig[k]}, not {resource}")


def _device_memory(node: Node, c: Container) -> int:
    if c.resource.startswith("nvidia.com/mig-"):
        return mig_memory_mib(c.resource.removeprefix("nvidia.com/mig-"))
    return max(g.memory_mib for g in node.gpus if not g.mig)


# ---------------------------------------------------------------- events


def _check_event(e: Event, path: str, duration: int, nodes: dict[str, Node]) -> None:
    _before_end(e.at_ms, f"{path}.at", duration)
    if e.xid is not None:
        node = _known_node(e.xid.node, f"{path}.xid.node", nodes)
        if e.xid.gpu >= len(node.gpus):
            raise Invalid(f"{path}.xid.gpu", f"node {node.name} has no GPU {e.xid.gpu}")
        if e.xid.mig is not None and e.xid.mig >= len(node.gpus[e.xid.gpu].mig):
            raise Invalid(
                f"{path}.xid.mig", f"GPU {e.xid.gpu} of {node.name} has no MIG instance {e.xid.mig}"
            )
    elif e.node is not None:
        node = _known_node(e.node, f"{path}.node", nodes)
        if e.fault == "checkpoint-corrupt" and node.checkpoint == "none":
            raise Invalid(f"{path}.node", f"node {node.name} has no checkpoint file (checkpoint: none)")


def _known_node(name: str, path: str, nodes: dict[str, Node]) -> Node:
    if name not in nodes:
        raise Invalid(path, f"no node {name!r} in nodes (nodes: {', '.join(nodes)})")
    return nodes[name]
