"""Rules for a scenario's nodes and what happens to them: GPUs, MIG layout, sharing and injected events.

A node is checked on its own (a DNS name, GPUs with unique UUIDs and a MIG layout that fits the GPU's
slices and memory, a sharing strategy that has a non-MIG GPU to share, a checkpoint format). Events are
checked against the nodes they name: an Xid must point at an existing GPU (and MIG instance), a node
fault at an existing node (and a checkpoint to corrupt), and only some faults take a duration.
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
    uuid_pattern,
)
from periscope.sim.scenario_specs import (
    CHECKPOINT_FORMATS,
    FAULT_DEFAULT_MS,
    FAULTS,
    MIG_PROFILE,
    NODE_FAULTS,
    SHARING,
    FaultSpec,
    GpuSpec,
    NodeSpec,
    SharingSpec,
    XidSpec,
    mig_memory_mib,
    mig_slices,
)

_NODE = ("name", "gpus", "sharing", "checkpoint")
_GPU = ("model", "memory_mib", "uuid", "mig")
_SHARING = ("strategy", "replicas", "rename")
_EVENT = ("at", "xid", "fault", "node", "duration")
_XID = ("node", "gpu", "code", "mig")


# ---------------------------------------------------------------- nodes


def node_spec(raw: Any, path: str, uuids: set[str]) -> tuple[NodeSpec, bool | None]:
    m = as_mapping(raw, path, _NODE)
    need(m, path, "name", "gpus")
    name = as_str(m["name"], f"{path}.name", DNS_NAME, "a valid node name (lowercase DNS name)")
    gpus = tuple(
        _gpu(g, f"{path}.gpus[{j}]", uuids) for j, g in enumerate(as_list(m["gpus"], f"{path}.gpus", True))
    )
    sharing, rename = _sharing(m.get("sharing"), f"{path}.sharing")
    if sharing.strategy != "none" and all(g.mig for g in gpus):
        raise Invalid(f"{path}.sharing", f"{sharing.strategy} needs a GPU without MIG on this node")
    checkpoint = as_choice(m.get("checkpoint", "v2"), f"{path}.checkpoint", CHECKPOINT_FORMATS)
    return NodeSpec(name, gpus, sharing, checkpoint), rename


def _gpu(raw: Any, path: str, uuids: set[str]) -> GpuSpec:
    m = as_mapping(raw, path, _GPU)
    need(m, path, "model", "memory_mib")
    memory = as_int(m["memory_mib"], f"{path}.memory_mib", 1, 10_000_000)
    uuid = None
    if m.get("uuid") is not None:
        uuid = as_str(m["uuid"], f"{path}.uuid", uuid_pattern("GPU-"), "a GPU UUID (GPU-<lowercase uuid>)")
        if uuid in uuids:
            raise Invalid(f"{path}.uuid", f"{uuid} is used by another GPU")
        uuids.add(uuid)
    mig = tuple(
        as_str(p, f"{path}.mig[{k}]", MIG_PROFILE, "a MIG profile such as 1g.10gb")
        for k, p in enumerate(as_list(m.get("mig") or [], f"{path}.mig"))
    )
    slices = sum(mig_slices(p) for p in mig)
    if slices > 7:
        raise Invalid(f"{path}.mig", f"needs {slices} compute slices; a GPU has 7")
    needed = sum(mig_memory_mib(p) for p in mig)
    if needed > memory:
        raise Invalid(f"{path}.mig", f"needs {needed} MiB; the GPU has {memory} MiB")
    return GpuSpec(as_str(m["model"], f"{path}.model"), memory, uuid, mig)


def _sharing(raw: Any, path: str) -> tuple[SharingSpec, bool | None]:
    if raw is None or raw == "none":
        return SharingSpec(), None
    m = as_mapping(raw, path, _SHARING)
    strategy = as_choice(m.get("strategy", "none"), f"{path}.strategy", SHARING)
    if strategy == "none":
        for key in ("replicas", "rename"):
            if key in m:
                raise Invalid(f"{path}.{key}", "only applies to time-slicing or mps")
        return SharingSpec(), None
    need(m, path, "replicas")
    replicas = as_int(m["replicas"], f"{path}.replicas", 2, 64)
    rename = as_bool(m["rename"], f"{path}.rename") if "rename" in m else None
    return SharingSpec(strategy, replicas, bool(rename)), rename


# ---------------------------------------------------------------- events


def event_spec(raw: Any, path: str, duration: int, nodes: dict[str, NodeSpec]) -> XidSpec | FaultSpec:
    m = as_mapping(raw, path, _EVENT)
    need(m, path, "at")
    at = as_duration(m["at"], f"{path}.at")
    if at >= duration:
        raise Invalid(
            f"{path}.at", f"{format_duration_ms(at)} is not before the end ({format_duration_ms(duration)})"
        )
    if ("xid" in m) == ("fault" in m):
        raise Invalid(path, "needs exactly one of xid or fault")
    if "xid" in m:
        for key in ("node", "duration"):
            if key in m:
                raise Invalid(f"{path}.{key}", "only applies to faults (an xid names its node inside xid:)")
        xm = as_mapping(m["xid"], f"{path}.xid", _XID)
        need(xm, f"{path}.xid", "node", "gpu", "code")
        node = _known_node(xm["node"], f"{path}.xid.node", nodes)
        gpu = as_int(xm["gpu"], f"{path}.xid.gpu", 0)
        if gpu >= len(node.gpus):
            raise Invalid(f"{path}.xid.gpu", f"node {node.name} has no GPU {gpu}")
        mig = None
        if xm.get("mig") is not None:
            mig = as_int(xm["mig"], f"{path}.xid.mig", 0)
            if mig >= len(node.gpus[gpu].mig):
                raise Invalid(f"{path}.xid.mig", f"GPU {gpu} of {node.name} has no MIG instance {mig}")
        return XidSpec(at, node.name, gpu, as_int(xm["code"], f"{path}.xid.code", 1, 999), mig)
    fault = as_choice(m["fault"], f"{path}.fault", FAULTS)
    node_name = None
    if fault in NODE_FAULTS:
        need(m, path, "node")
        node = _known_node(m["node"], f"{path}.node", nodes)
        node_name = node.name
        if fault == "checkpoint-corrupt" and node.checkpoint == "none":
            raise Invalid(f"{path}.node", f"node {node.name} has no checkpoint file (checkpoint: none)")
    elif "node" in m:
        raise Invalid(f"{path}.node", f"{fault} is cluster-wide and takes no node")
    if "duration" in m and fault not in FAULT_DEFAULT_MS:
        raise Invalid(f"{path}.duration", f"only applies to {', '.join(FAULT_DEFAULT_MS)}")
    length = FAULT_DEFAULT_MS.get(fault, 0)
    if "duration" in m:
        length = as_duration(m["duration"], f"{path}.duration")
    return FaultSpec(at, fault, node_name, length)


def _known_node(raw: Any, path: str, nodes: dict[str, NodeSpec]) -> NodeSpec:
    name = as_str(raw, path)
    if name not in nodes:
        raise Invalid(path, f"no node {name!r} in nodes (nodes: {', '.join(nodes)})")
    return nodes[name]
