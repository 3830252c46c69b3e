"""Scenario files for the simulated cluster (CONTRACTS.md "Scenario files"): strict parse into frozen specs.

Every problem is reported as `scenario <file>: <path>: <problem>` with a path such as
`pods[2].containers[0].util_pct`, so a user can find it; nothing is started before a scenario validates.
Allocation conflicts (more pods than devices at some moment) are found by `periscope.sim.cluster`,
which raises the same `ScenarioError`.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from periscope.core.duration import format_duration_ms, parse_duration_ms

FAULTS = ("kubelet-restart", "checkpoint-corrupt", "probe-restart", "joiner-restart", "watcher-restart")
NODE_FAULTS = ("kubelet-restart", "checkpoint-corrupt", "probe-restart")
FAULT_DEFAULT_MS = {"kubelet-restart": 2000, "checkpoint-corrupt": 5000}
SHARING = ("none", "time-slicing", "mps")
CHECKPOINT_FORMATS = ("v2", "v1", "none")
QOS = ("guaranteed", "burstable", "besteffort")
POLICY_STATES = ("ready", "notReady", "ignored")
# ClusterPolicy spec keys that carry an `enabled` switch (GPU Operator clusterpolicy_types.go).
COMPONENTS = (
    "driver",
    "toolkit",
    "devicePlugin",
    "dcgmExporter",
    "dcgm",
    "nodeStatusExporter",
    "gfd",
    "migManager",
    "validator",
    "gds",
    "gdrcopy",
    "vfioManager",
    "sandboxDevicePlugin",
    "vgpuManager",
    "vgpuDeviceManager",
    "cdi",
    "kataManager",
    "ccManager",
)
GPU_RESOURCE = "nvidia.com/gpu"
SHARED_RESOURCE = "nvidia.com/gpu.shared"
MIG_PROFILE = re.compile(r"^([1-7])g\.(\d+)gb(\+me)?$")
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


class ScenarioError(ValueError):
    """A scenario that cannot run; the message names the file, the path in it and the problem."""


class _Bad(Exception):
    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = path, problem


# ---------------------------------------------------------------- specs


@dataclass(frozen=True, slots=True)
class GpuSpec:
    model: str
    memory_mib: int
    uuid: str | None = None
    mig: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SharingSpec:
    strategy: str = "none"  # none | time-slicing | mps
    replicas: int = 1
    rename: bool = False  # advertise nvidia.com/gpu.shared instead of nvidia.com/gpu


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    gpus: tuple[GpuSpec, ...]
    sharing: SharingSpec = SharingSpec()
    checkpoint: str = "v2"

    @property
    def shared_resource(self) -> str:
        return SHARED_RESOURCE if self.sharing.rename else GPU_RESOURCE

    def resources(self) -> tuple[str, ...]:
        """Extended resources the node's device plugin advertises (mixed MIG strategy)."""
        out: list[str] = []
        if any(not g.mig for g in self.gpus):
            out.append(self.shared_resource if self.sharing.strategy != "none" else GPU_RESOURCE)
        for g in self.gpus:
            out.extend(f"nvidia.com/mig-{p}" for p in g.mig if f"nvidia.com/mig-{p}" not in out)
        return tuple(out)


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    name: str
    resource: str = GPU_RESOURCE
    count: int = 1
    util: tuple[tuple[int, float], ...] = ((0, 0.0),)  # [(offset_ms from scenario start, pct)]
    memory_mib: float = 0.0  # per device held
    processes: int = 1
    devices: tuple[str, ...] | None = None

    def util_at(self, t_ms: int) -> float:
        """The step value in force at scenario time t (0 before the first step)."""
        value = 0.0
        for at, pct in self.util:
            if at > t_ms:
                break
            value = pct
        return value


@dataclass(frozen=True, slots=True)
class PodSpec:
    name: str
    node: str
    containers: tuple[ContainerSpec, ...]
    namespace: str = "default"
    uid: str | None = None
    owner_kind: str = ""
    owner_name: str = ""
    start_ms: int = 0
    stop_ms: int | None = None
    qos: str = "burstable"
    labels: tuple[tuple[str, str], ...] = ()

    def alive_at(self, t_ms: int) -> bool:
        return self.start_ms <= t_ms and (self.stop_ms is None or t_ms < self.stop_ms)


@dataclass(frozen=True, slots=True)
class XidSpec:
    at_ms: int
    node: str
    gpu: int
    code: int
    mig: int | None = None  # index into the GPU's `mig:` list when the error names an instance


@dataclass(frozen=True, slots=True)
class FaultSpec:
    at_ms: int
    fault: str
    node: str | None = None
    duration_ms: int = 0


@dataclass(frozen=True, slots=True)
class ComponentSpec:
    enabled: bool | None = None  # None = not set in the spec (operator default)
    desired: int | None = None
    ready: int | None = None
    present: bool | None = None  # whether its DaemonSet exists; default: when effectively enabled


@dataclass(frozen=True, slots=True)
class PolicySpec:
    name: str = "cluster-policy"
    state: str = "ready"
    components: tuple[tuple[str, ComponentSpec], ...] = ()


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    seed: int
    duration_ms: int
    tick_ms: int
    nodes: tuple[NodeSpec, ...]
    pods: tuple[PodSpec, ...] = ()
    xids: tuple[XidSpec, ...] = ()
    faults: tuple[FaultSpec, ...] = ()
    policy: PolicySpec | None = None
    source: str = ""

    def node(self, name: str) -> NodeSpec:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)


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
        return _build(data, source, Path(source).stem if source else "scenario")
    except _Bad as e:
        raise ScenarioError(f"scenario {source}: {e}") from None


def describe(s: Scenario) -> str:
    gpus = sum(len(n.gpus) for n in s.nodes)
    return (
        f"{s.name}: {len(s.nodes)} nodes, {gpus} GPUs, {len(s.pods)} pods, "
        f"{format_duration_ms(s.duration_ms)} at {format_duration_ms(s.tick_ms)} ticks"
    )


# ---------------------------------------------------------------- rules

_TOP = ("name", "seed", "duration", "tick", "nodes", "pods", "events", "policy")
_NODE = ("name", "gpus", "sharing", "checkpoint")
_GPU = ("model", "memory_mib", "uuid", "mig")
_SHARING = ("strategy", "replicas", "rename")
_POD = ("namespace", "name", "uid", "node", "owner", "start", "stop", "containers", "qos", "labels")
_CONTAINER = ("name", "resource", "count", "util_pct", "memory_mib", "processes", "devices")
_EVENT = ("at", "xid", "fault", "node", "duration")
_XID = ("node", "gpu", "code", "mig")
_POLICY = ("name", "state", "components")
_COMPONENT = ("enabled", "desired", "ready", "present")
_PIN = re.compile(r"^(\d+)(?::(\d+))?$")


def _build(data: Any, source: str, default_name: str) -> Scenario:
    top = _as_mapping(data, "", _TOP)
    _need(top, "", "duration", "nodes")
    duration = _as_duration(top["duration"], "duration")
    if duration <= 0:
        raise _Bad("duration", "must be longer than 0s")
    tick = _as_duration(top.get("tick", "1s"), "tick")
    if not 10 <= tick <= duration:
        raise _Bad("tick", f"must be between 10ms and the duration ({format_duration_ms(duration)})")
    nodes: list[NodeSpec] = []
    renames: list[bool | None] = []
    uuids: set[str] = set()
    for i, raw in enumerate(_as_list(top["nodes"], "nodes", nonempty=True)):
        node, rename = _node(raw, f"nodes[{i}]", uuids)
        if any(n.name == node.name for n in nodes):
            raise _Bad(f"nodes[{i}].name", f"node {node.name!r} is listed twice")
        nodes.append(node)
        renames.append(rename)
    raw_pods = _as_list(top.get("pods") or [], "pods")
    pods = [_pod(raw, f"pods[{i}]", duration) for i, raw in enumerate(raw_pods)]
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
        _check_pod(pod, f"pods[{i}]", by_name, pods[:i])
    xids: list[XidSpec] = []
    faults: list[FaultSpec] = []
    for i, raw in enumerate(_as_list(top.get("events") or [], "events")):
        ev = _event(raw, f"events[{i}]", duration, by_name)
        (xids if isinstance(ev, XidSpec) else faults).append(ev)  # type: ignore[arg-type]
    policy = _policy(top["policy"], "policy") if top.get("policy") is not None else None
    return Scenario(
        name=_as_str(top.get("name", default_name), "name"),
        seed=_as_int(top.get("seed", 0), "seed", 0),
        duration_ms=duration,
        tick_ms=tick,
        nodes=tuple(nodes),
        pods=tuple(pods),
        xids=tuple(sorted(xids, key=lambda x: x.at_ms)),
        faults=tuple(sorted(faults, key=lambda f: f.at_ms)),
        policy=policy,
        source=source,
    )


def _node(raw: Any, path: str, uuids: set[str]) -> tuple[NodeSpec, bool | None]:
    m = _as_mapping(raw, path, _NODE)
    _need(m, path, "name", "gpus")
    name = _as_str(m["name"], f"{path}.name", _DNS_NAME, "a valid node name (lowercase DNS name)")
    gpus = tuple(
        _gpu(g, f"{path}.gpus[{j}]", uuids) for j, g in enumerate(_as_list(m["gpus"], f"{path}.gpus", True))
    )
    sharing, rename = _sharing(m.get("sharing"), f"{path}.sharing")
    if sharing.strategy != "none" and all(g.mig for g in gpus):
        raise _Bad(f"{path}.sharing", f"{sharing.strategy} needs a GPU without MIG on this node")
    checkpoint = _as_choice(m.get("checkpoint", "v2"), f"{path}.checkpoint", CHECKPOINT_FORMATS)
    return NodeSpec(name, gpus, sharing, checkpoint), rename


def _gpu(raw: Any, path: str, uuids: set[str]) -> GpuSpec:
    m = _as_mapping(raw, path, _GPU)
    _need(m, path, "model", "memory_mib")
    memory = _as_int(m["memory_mib"], f"{path}.memory_mib", 1, 10_000_000)
    uuid = None
    if m.get("uuid") is not None:
        uuid = _as_str(m["uuid"], f"{path}.uuid", _uuid_pattern("GPU-"), "a GPU UUID (GPU-<lowercase uuid>)")
        if uuid in uuids:
            raise _Bad(f"{path}.uuid", f"{uuid} is used by another GPU")
        uuids.add(uuid)
    mig = tuple(
        _as_str(p, f"{path}.mig[{k}]", MIG_PROFILE, "a MIG profile such as 1g.10gb")
        for k, p in enumerate(_as_list(m.get("mig") or [], f"{path}.mig"))
    )
    slices = sum(mig_slices(p) for p in mig)
    if slices > 7:
        raise _Bad(f"{path}.mig", f"needs {slices} compute slices; a GPU has 7")
    needed = sum(mig_memory_mib(p) for p in mig)
    if needed > memory:
        raise _Bad(f"{path}.mig", f"needs {needed} MiB; the GPU has {memory} MiB")
    return GpuSpec(_as_str(m["model"], f"{path}.model"), memory, uuid, mig)


def mig_slices(profile: str) -> int:
    m = MIG_PROFILE.match(profile)
    return int(m.group(1)) if m else 0


def mig_memory_mib(profile: str) -> int:
    m = MIG_PROFILE.match(profile)
    return int(m.group(2)) * 1024 if m else 0


def _sharing(raw: Any, path: str) -> tuple[SharingSpec, bool | None]:
    if raw is None or raw == "none":
        return SharingSpec(), None
    m = _as_mapping(raw, path, _SHARING)
    strategy = _as_choice(m.get("strategy", "none"), f"{path}.strategy", SHARING)
    if strategy == "none":
        for key in ("replicas", "rename"):
            if key in m:
                raise _Bad(f"{path}.{key}", "only applies to time-slicing or mps")
        return SharingSpec(), None
    _need(m, path, "replicas")
    replicas = _as_int(m["replicas"], f"{path}.replicas", 2, 64)
    rename = _as_bool(m["rename"], f"{path}.rename") if "rename" in m else None
    return SharingSpec(strategy, replicas, bool(rename)), rename


def _pod(raw: Any, path: str, duration: int) -> PodSpec:
    m = _as_mapping(raw, path, _POD)
    _need(m, path, "name", "node", "containers")
    start = _as_duration(m.get("start", 0), f"{path}.start")
    if start >= duration:
        raise _Bad(
            f"{path}.start",
            f"{format_duration_ms(start)} is not before the end ({format_duration_ms(duration)})",
        )
    stop = None
    if m.get("stop") is not None:
        stop = _as_duration(m["stop"], f"{path}.stop")
        if stop <= start or stop > duration:
            raise _Bad(f"{path}.stop", "must be after start and not after the scenario's duration")
    owner_kind = owner_name = ""
    if m.get("owner") is not None:
        om = _as_mapping(m["owner"], f"{path}.owner", ("kind", "name"))
        _need(om, f"{path}.owner", "kind", "name")
        owner_kind, owner_name = (
            _as_str(om["kind"], f"{path}.owner.kind"),
            _as_str(om["name"], f"{path}.owner.name"),
        )
    labels = _as_mapping(
        m.get("labels") or {}, f"{path}.labels", tuple(str(k) for k in (m.get("labels") or {}))
    )
    containers = [
        _container(c, f"{path}.containers[{j}]")
        for j, c in enumerate(_as_list(m["containers"], f"{path}.containers", True))
    ]
    for j, c in enumerate(containers):
        if any(o.name == c.name for o in containers[:j]):
            raise _Bad(f"{path}.containers[{j}].name", f"container {c.name!r} is listed twice")
    uid = None
    if m.get("uid") is not None:
        uid = _as_str(m["uid"], f"{path}.uid", _uuid_pattern(), "a pod UID (lowercase uuid)")
    return PodSpec(
        name=_as_str(m["name"], f"{path}.name", _DNS_NAME, "a valid pod name (lowercase DNS name)"),
        node=_as_str(m["node"], f"{path}.node"),
        containers=tuple(containers),
        namespace=_as_str(
            m.get("namespace", "default"), f"{path}.namespace", _DNS_LABEL, "a valid namespace"
        ),
        uid=uid,
        owner_kind=owner_kind,
        owner_name=owner_name,
        start_ms=start,
        stop_ms=stop,
        qos=_as_choice(m.get("qos", "burstable"), f"{path}.qos", QOS),
        labels=tuple((str(k), _as_str(v, f"{path}.labels.{k}")) for k, v in labels.items()),
    )


def _container(raw: Any, path: str) -> ContainerSpec:
    m = _as_mapping(raw, path, _CONTAINER)
    _need(m, path, "name")
    count = _as_int(m.get("count", 1), f"{path}.count", 1, 64)
    processes = _as_int(m.get("processes", 1), f"{path}.processes", 0, 64)
    util = _util(m.get("util_pct", 0), f"{path}.util_pct")
    if processes == 0 and any(p > 0 for _, p in util):
        raise _Bad(f"{path}.util_pct", "a container with processes: 0 cannot use the GPU")
    devices = None
    if m.get("devices") is not None:
        pins = _as_list(m["devices"], f"{path}.devices")
        devices = tuple(_pin(p, f"{path}.devices[{k}]") for k, p in enumerate(pins))
        if len(devices) != count:
            raise _Bad(f"{path}.devices", f"pins {len(devices)} devices but count is {count}")
    return ContainerSpec(
        name=_as_str(m["name"], f"{path}.name", _DNS_LABEL, "a valid container name"),
        resource=_as_str(m.get("resource", GPU_RESOURCE), f"{path}.resource"),
        count=count,
        util=util,
        memory_mib=_as_number(m.get("memory_mib", 0), f"{path}.memory_mib", 0),
        processes=processes,
        devices=devices,
    )


def _util(raw: Any, path: str) -> tuple[tuple[int, float], ...]:
    if not isinstance(raw, list):
        return ((0, _as_number(raw, path, 0, 100)),)
    steps: list[tuple[int, float]] = []
    for k, item in enumerate(_as_list(raw, path, nonempty=True)):
        if not isinstance(item, list) or len(item) != 2:
            raise _Bad(f"{path}[{k}]", "expected a step [offset, pct] such as [30s, 80]")
        at = _as_duration(item[0], f"{path}[{k}][0]")
        if steps and at <= steps[-1][0]:
            raise _Bad(f"{path}[{k}][0]", "step offsets must increase")
        steps.append((at, _as_number(item[1], f"{path}[{k}][1]", 0, 100)))
    return tuple(steps)


def _pin(raw: Any, path: str) -> str:
    text = str(raw) if isinstance(raw, int) and not isinstance(raw, bool) else raw
    if not isinstance(text, str) or not _PIN.match(text):
        raise _Bad(path, f'{raw!r} is not a GPU index ("0") or a GPU:MIG index pair ("0:1")')
    return text


def _check_pod(pod: PodSpec, path: str, nodes: dict[str, NodeSpec], earlier: list[PodSpec]) -> None:
    node = nodes.get(pod.node)
    if node is None:
        raise _Bad(f"{path}.node", f"no node {pod.node!r} in nodes (nodes: {', '.join(nodes)})")
    for j, c in enumerate(pod.containers):
        cpath = f"{path}.containers[{j}]"
        if c.resource not in node.resources():
            raise _Bad(
                f"{cpath}.resource",
                f"node {node.name} does not advertise {c.resource} (it has: {', '.join(node.resources())})",
            )
        if node.sharing.strategy != "none" and c.resource == node.shared_resource and c.count > 1:
            raise _Bad(
                f"{cpath}.count", "one replica per container on a shared GPU (failRequestsGreaterThanOne)"
            )
        for k, pin in enumerate(c.devices or ()):
            _check_pin(pin, f"{cpath}.devices[{k}]", node, c.resource)
        cap = _device_memory(node, c)
        if c.memory_mib > cap:
            raise _Bad(
                f"{cpath}.memory_mib", f"{c.memory_mib:g} MiB does not fit a {c.resource} device ({cap} MiB)"
            )
    for j, other in enumerate(earlier):
        same_name = (other.namespace, other.name) == (pod.namespace, pod.name)
        if same_name and (other.stop_ms is None or other.stop_ms > pod.start_ms):
            raise _Bad(
                path,
                f"pod {pod.namespace}/{pod.name} still exists at {format_duration_ms(pod.start_ms)} "
                f"(pods[{j}]); a reused name must start at or after the old pod's stop",
            )
        if pod.uid is not None and other.uid == pod.uid:
            raise _Bad(f"{path}.uid", f"{pod.uid} is also the UID of pods[{j}]")


def _check_pin(pin: str, path: str, node: NodeSpec, resource: str) -> None:
    m = _PIN.match(pin)
    assert m is not None
    g = int(m.group(1))
    if g >= len(node.gpus):
        raise _Bad(path, f"node {node.name} has no GPU {g} (it has {len(node.gpus)})")
    gpu = node.gpus[g]
    if m.group(2) is None:
        if gpu.mig:
            raise _Bad(path, f'GPU {g} of {node.name} is in MIG mode; pin a MIG instance such as "{g}:0"')
        if resource.startswith("nvidia.com/mig-"):
            raise _Bad(path, f'{resource} needs a MIG instance pin such as "{g}:0"')
        return
    k = int(m.group(2))
    if k >= len(gpu.mig):
        raise _Bad(path, f"GPU {g} of {node.name} has no MIG instance {k}")
    if resource != f"nvidia.com/mig-{gpu.mig[k]}":
        raise _Bad(path, f"MIG instance {g}:{k} is a {gpu.mig[k]}, not {resource}")


def _device_memory(node: NodeSpec, c: ContainerSpec) -> int:
    if c.resource.startswith("nvidia.com/mig-"):
        return mig_memory_mib(c.resource.removeprefix("nvidia.com/mig-"))
    return max(g.memory_mib for g in node.gpus if not g.mig)


def _event(raw: Any, path: str, duration: int, nodes: dict[str, NodeSpec]) -> XidSpec | FaultSpec:
    m = _as_mapping(raw, path, _EVENT)
    _need(m, path, "at")
    at = _as_duration(m["at"], f"{path}.at")
    if at >= duration:
        raise _Bad(
            f"{path}.at", f"{format_duration_ms(at)} is not before the end ({format_duration_ms(duration)})"
        )
    if ("xid" in m) == ("fault" in m):
        raise _Bad(path, "needs exactly one of xid or fault")
    if "xid" in m:
        for key in ("node", "duration"):
            if key in m:
                raise _Bad(f"{path}.{key}", "only applies to faults (an xid names its node inside xid:)")
        xm = _as_mapping(m["xid"], f"{path}.xid", _XID)
        _need(xm, f"{path}.xid", "node", "gpu", "code")
        node = _known_node(xm["node"], f"{path}.xid.node", nodes)
        gpu = _as_int(xm["gpu"], f"{path}.xid.gpu", 0)
        if gpu >= len(node.gpus):
            raise _Bad(f"{path}.xid.gpu", f"node {node.name} has no GPU {gpu}")
        mig = None
        if xm.get("mig") is not None:
            mig = _as_int(xm["mig"], f"{path}.xid.mig", 0)
            if mig >= len(node.gpus[gpu].mig):
                raise _Bad(f"{path}.xid.mig", f"GPU {gpu} of {node.name} has no MIG instance {mig}")
        return XidSpec(at, node.name, gpu, _as_int(xm["code"], f"{path}.xid.code", 1, 999), mig)
    fault = _as_choice(m["fault"], f"{path}.fault", FAULTS)
    node_name = None
    if fault in NODE_FAULTS:
        _need(m, path, "node")
        node = _known_node(m["node"], f"{path}.node", nodes)
        node_name = node.name
        if fault == "checkpoint-corrupt" and node.checkpoint == "none":
            raise _Bad(f"{path}.node", f"node {node.name} has no checkpoint file (checkpoint: none)")
    elif "node" in m:
        raise _Bad(f"{path}.node", f"{fault} is cluster-wide and takes no node")
    if "duration" in m and fault not in FAULT_DEFAULT_MS:
        raise _Bad(f"{path}.duration", f"only applies to {', '.join(FAULT_DEFAULT_MS)}")
    length = FAULT_DEFAULT_MS.get(fault, 0)
    if "duration" in m:
        length = _as_duration(m["duration"], f"{path}.duration")
    return FaultSpec(at, fault, node_name, length)


def _known_node(raw: Any, path: str, nodes: dict[str, NodeSpec]) -> NodeSpec:
    name = _as_str(raw, path)
    if name not in nodes:
        raise _Bad(path, f"no node {name!r} in nodes (nodes: {', '.join(nodes)})")
    return nodes[name]


def _policy(raw: Any, path: str) -> PolicySpec:
    m = _as_mapping(raw, path, _POLICY)
    comps: list[tuple[str, ComponentSpec]] = []
    cm = _as_mapping(m.get("components") or {}, f"{path}.components", COMPONENTS)
    for key, val in cm.items():
        cpath = f"{path}.components.{key}"
        c = _as_mapping(val if val is not None else {}, cpath, _COMPONENT)
        desired = _as_int(c["desired"], f"{cpath}.desired", 0) if c.get("desired") is not None else None
        ready = _as_int(c["ready"], f"{cpath}.ready", 0) if c.get("ready") is not None else None
        if desired is not None and ready is not None and ready > desired:
            raise _Bad(f"{cpath}.ready", f"{ready} is more than desired ({desired})")
        comps.append(
            (
                key,
                ComponentSpec(
                    enabled=_as_bool(c["enabled"], f"{cpath}.enabled")
                    if c.get("enabled") is not None
                    else None,
                    desired=desired,
                    ready=ready,
                    present=_as_bool(c["present"], f"{cpath}.present")
                    if c.get("present") is not None
                    else None,
                ),
            )
        )
    return PolicySpec(
        name=_as_str(m.get("name", "cluster-policy"), f"{path}.name", _DNS_NAME, "a valid name"),
        state=_as_choice(m.get("state", "ready"), f"{path}.state", POLICY_STATES),
        components=tuple(comps),
    )


def _need(m: dict[str, Any], path: str, *keys: str) -> None:
    for key in keys:
        if m.get(key) is None:
            raise _Bad(_join(path, key), "required")


# ---------------------------------------------------------------- field readers


def _as_mapping(v: Any, path: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise _Bad(path or "(top level)", f"expected a mapping, got {_kind(v)}")
    for k in v:
        if not isinstance(k, str) or k not in allowed:
            hint = difflib.get_close_matches(str(k), allowed, n=1)
            raise _Bad(_join(path, str(k)), "unknown key" + (f" (did you mean {hint[0]}?)" if hint else ""))
    return v


def _as_list(v: Any, path: str, nonempty: bool = False) -> list[Any]:
    if not isinstance(v, list):
        raise _Bad(path, f"expected a list, got {_kind(v)}")
    if nonempty and not v:
        raise _Bad(path, "must not be empty")
    return v


def _as_str(v: Any, path: str, pattern: re.Pattern[str] | None = None, what: str = "") -> str:
    if not isinstance(v, str) or not v:
        raise _Bad(path, f"expected a non-empty string, got {_kind(v)}")
    if pattern is not None and not pattern.match(v):
        raise _Bad(path, f"{v!r} is not {what or 'valid'}")
    return v


def _as_int(v: Any, path: str, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise _Bad(path, f"expected an integer, got {_kind(v)}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        bounds = f"between {lo} and {hi}" if lo is not None and hi is not None else f">= {lo}"
        raise _Bad(path, f"{v} is out of range (must be {bounds})")
    return v


def _as_number(v: Any, path: str, lo: float, hi: float | None = None) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise _Bad(path, f"expected a number, got {_kind(v)}")
    if v < lo or (hi is not None and v > hi):
        bounds = f"{lo:g}..{hi:g}" if hi is not None else f">= {lo:g}"
        raise _Bad(path, f"{v} is out of range (must be {bounds})")
    return float(v)


def _as_bool(v: Any, path: str) -> bool:
    if not isinstance(v, bool):
        raise _Bad(path, f"expected true or false, got {_kind(v)}")
    return v


def _as_duration(v: Any, path: str) -> int:
    """A duration string (`90s`) or a plain number of seconds."""
    if isinstance(v, bool):
        raise _Bad(path, f"expected a duration such as 30s, got {_kind(v)}")
    if isinstance(v, int | float):
        if v < 0:
            raise _Bad(path, "must not be negative")
        return round(v * 1000)
    if not isinstance(v, str):
        raise _Bad(path, f"expected a duration such as 30s, got {_kind(v)}")
    try:
        return parse_duration_ms(v)
    except ValueError:
        raise _Bad(path, f"not a duration: {v!r} (use e.g. 90s, 10m, 2h)") from None


def _as_choice(v: Any, path: str, choices: tuple[str, ...]) -> str:
    if not isinstance(v, str) or v not in choices:
        raise _Bad(path, f"{v!r} is not one of {', '.join(choices)}")
    return v


def _uuid_pattern(prefix: str = "") -> re.Pattern[str]:
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
