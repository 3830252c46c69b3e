"""Rules for a scenario's pods and containers, and for placing them on the scenario's nodes.

A pod is read on its own first (names, owner, labels, a start and stop inside the scenario, containers
with utilisation steps, memory and device pins); once the nodes are final it is checked against its node:
the resource must be one the node advertises, a shared GPU serves one replica per container, pins must
name real GPUs or MIG instances of the right profile, memory must fit the device, and a reused pod name
or UID must not overlap an earlier pod.
"""

from __future__ import annotations

import re
from typing import Any

from periscope.core.duration import format_duration_ms
from periscope.sim.scenario_fields import (
    DNS_LABEL,
    DNS_NAME,
    Invalid,
    as_choice,
    as_duration,
    as_int,
    as_list,
    as_mapping,
    as_number,
    as_str,
    need,
    uuid_pattern,
)
from periscope.sim.scenario_specs import (
    GPU_RESOURCE,
    QOS,
    ContainerSpec,
    NodeSpec,
    PodSpec,
    mig_memory_mib,
)

_POD = ("namespace", "name", "uid", "node", "owner", "start", "stop", "containers", "qos", "labels")
_CONTAINER = ("name", "resource", "count", "util_pct", "memory_mib", "processes", "devices")
_PIN = re.compile(r"^(\d+)(?::(\d+))?$")


# ---------------------------------------------------------------- pods


def pod_spec(raw: Any, path: str, duration: int) -> PodSpec:
    m = as_mapping(raw, path, _POD)
    need(m, path, "name", "node", "containers")
    start = as_duration(m.get("start", 0), f"{path}.start")
    if start >= duration:
        raise Invalid(
            f"{path}.start",
            f"{format_duration_ms(start)} is not before the end ({format_duration_ms(duration)})",
        )
    stop = None
    if m.get("stop") is not None:
        stop = as_duration(m["stop"], f"{path}.stop")
        if stop <= start or stop > duration:
            raise Invalid(f"{path}.stop", "must be after start and not after the scenario's duration")
    owner_kind = owner_name = ""
    if m.get("owner") is not None:
        om = as_mapping(m["owner"], f"{path}.owner", ("kind", "name"))
        need(om, f"{path}.owner", "kind", "name")
        owner_kind, owner_name = (
            as_str(om["kind"], f"{path}.owner.kind"),
            as_str(om["name"], f"{path}.owner.name"),
        )
    labels = as_mapping(
        m.get("labels") or {}, f"{path}.labels", tuple(str(k) for k in (m.get("labels") or {}))
    )
    containers = [
        _container(c, f"{path}.containers[{j}]")
        for j, c in enumerate(as_list(m["containers"], f"{path}.containers", True))
    ]
    for j, c in enumerate(containers):
        if any(o.name == c.name for o in containers[:j]):
            raise Invalid(f"{path}.containers[{j}].name", f"container {c.name!r} is listed twice")
    uid = None
    if m.get("uid") is not None:
        uid = as_str(m["uid"], f"{path}.uid", uuid_pattern(), "a pod UID (lowercase uuid)")
    return PodSpec(
        name=as_str(m["name"], f"{path}.name", DNS_NAME, "a valid pod name (lowercase DNS name)"),
        node=as_str(m["node"], f"{path}.node"),
        containers=tuple(containers),
        namespace=as_str(m.get("namespace", "default"), f"{path}.namespace", DNS_LABEL, "a valid namespace"),
        uid=uid,
        owner_kind=owner_kind,
        owner_name=owner_name,
        start_ms=start,
        stop_ms=stop,
        qos=as_choice(m.get("qos", "burstable"), f"{path}.qos", QOS),
        labels=tuple((str(k), as_str(v, f"{path}.labels.{k}")) for k, v in labels.items()),
    )


def _container(raw: Any, path: str) -> ContainerSpec:
    m = as_mapping(raw, path, _CONTAINER)
    need(m, path, "name")
    count = as_int(m.get("count", 1), f"{path}.count", 1, 64)
    processes = as_int(m.get("processes", 1), f"{path}.processes", 0, 64)
    util = _util(m.get("util_pct", 0), f"{path}.util_pct")
    if processes == 0 and any(p > 0 for _, p in util):
        raise Invalid(f"{path}.util_pct", "a container with processes: 0 cannot use the GPU")
    devices = None
    if m.get("devices") is not None:
        pins = as_list(m["devices"], f"{path}.devices")
        devices = tuple(_pin(p, f"{path}.devices[{k}]") for k, p in enumerate(pins))
        if len(devices) != count:
            raise Invalid(f"{path}.devices", f"pins {len(devices)} devices but count is {count}")
    return ContainerSpec(
        name=as_str(m["name"], f"{path}.name", DNS_LABEL, "a valid container name"),
        resource=as_str(m.get("resource", GPU_RESOURCE), f"{path}.resource"),
        count=count,
        util=util,
        memory_mib=as_number(m.get("memory_mib", 0), f"{path}.memory_mib", 0),
        processes=processes,
        devices=devices,
    )


def _util(raw: Any, path: str) -> tuple[tuple[int, float], ...]:
    if not isinstance(raw, list):
        return ((0, as_number(raw, path, 0, 100)),)
    steps: list[tuple[int, float]] = []
    for k, item in enumerate(as_list(raw, path, nonempty=True)):
        if not isinstance(item, list) or len(item) != 2:
            raise Invalid(f"{path}[{k}]", "expected a step [offset, pct] such as [30s, 80]")
        at = as_duration(item[0], f"{path}[{k}][0]")
        if steps and at <= steps[-1][0]:
            raise Invalid(f"{path}[{k}][0]", "step offsets must increase")
        steps.append((at, as_number(item[1], f"{path}[{k}][1]", 0, 100)))
    return tuple(steps)


def _pin(raw: Any, path: str) -> str:
    text = str(raw) if isinstance(raw, int) and not isinstance(raw, bool) else raw
    if not isinstance(text, str) or not _PIN.match(text):
        raise Invalid(path, f'{raw!r} is not a GPU index ("0") or a GPU:MIG index pair ("0:1")')
    return text


def check_pod(pod: PodSpec, path: str, nodes: dict[str, NodeSpec], earlier: list[PodSpec]) -> None:
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
    assert m is not None
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
