"""A synthetic cluster's input events, for measuring replay speed offline (no broker, no simulator).

Every GPU holds one pod at a time; pods are replaced on a schedule by a new pod with the same name
and a new UID (the name-reuse case), so the core resolves names against the pod registry all along.
The probe publishes an allocation snapshot every few seconds, a telemetry sample every tick, and now
and then an XID. Deterministic for a given spec. Device readings are drawn from a few levels and the
frozen sample objects are shared between ticks, so an hour of a large cluster fits in memory.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from periscope.core.model import (
    AllocationEntry,
    AllocationSnapshot,
    AllocSource,
    ContainerInfo,
    DeviceInventory,
    DeviceSample,
    GpuInfo,
    Meta,
    NodeEvent,
    NodeInput,
    NodeTelemetry,
    PodEvent,
    PodInfo,
    ProcessSample,
    SourceHealth,
    XidEvent,
)

RESOURCE = "nvidia.com/gpu"
NAMESPACE = "ml"
CONTAINER = "cuda"
WATCHER = "kube_watcher"
_HEALTH = (SourceHealth("podresources", "ok"), SourceHealth("checkpoint", "ok"))


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    nodes: int = 50
    gpus_per_node: int = 8
    duration_ms: int = 3_600_000
    tick_ms: int = 1000
    start_ms: int = 1_790_000_000_000
    alloc_every_ms: int = 5000
    pod_lifetime_ms: int = 1_200_000  # a GPU's pod is replaced (same name, new UID) this often
    gap_ms: int = 10_000  # between one pod's deletion and its successor's creation
    xid_every_ms: int = 900_000  # per node
    seed: int = 0

    @property
    def ticks(self) -> int:
        return self.duration_ms // self.tick_ms

    @property
    def device_samples(self) -> int:
        """Device readings the generated telemetry carries."""
        return self.ticks * self.nodes * self.gpus_per_node


def node_name(n: int) -> str:
    return f"gpu-node-{n:03d}"


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


@dataclass(slots=True)
class _Slot:
    """One GPU and the pod generations that hold it."""

    gpu_uuid: str
    pod: str
    offset_ms: int  # stagger, so pods of a cluster do not all churn at once
    idle: bool  # this slot's pods barely use the GPU (allocated but idle)


class _Node:
    def __init__(self, spec: ClusterSpec, n: int, rng: random.Random) -> None:
        self.spec, self.n, self.name = spec, n, node_name(n)
        self.seq = 0
        self.slots = [
            _Slot(f"GPU-{_uuid(rng)}", f"train-{n:03d}-{g}",
                  offset_ms=rng.randrange(0, spec.pod_lifetime_ms, spec.alloc_every_ms),
                  idle=(n * spec.gpus_per_node + g) % 5 == 0)
            for g in range(spec.gpus_per_node)
        ]
        self._uids: dict[tuple[int, int], str] = {}
        self._uid_rng = random.Random(f"{spec.seed}/{n}")
        self._samples: dict[tuple[int, int, int], DeviceSample] = {}

    def meta(self, t: int, source: str = "") -> Meta:
        self.seq += 1
        return Meta(node=self.name, source=source or f"probe/{self.name}", epoch=1, seq=self.seq, time_ms=t)

    def generation(self, g: int, t: int) -> int:
        """Which pod generation holds slot g at t (-1 before the first)."""
        rel = t - self.spec.start_ms + self.slots[g].offset_ms
        return rel // self.spec.pod_lifetime_ms

    def uid(self, g: int, gen: int) -> str:
        key = (g, gen)
        if key not in self._uids:
            self._uids[key] = _uuid(self._uid_rng)
        return self._uids[key]

    def span(self, g: int, gen: int) -> tuple[int, int]:
        """(created, deleted) of generation gen of slot g."""
        begin = self.spec.start_ms - self.slots[g].offset_ms + gen * self.spec.pod_lifetime_ms
        return begin, begin + self.spec.pod_lifetime_ms - self.spec.gap_ms

    def holder(self, g: int, t: int) -> tuple[int, str] | None:
        gen = self.generation(g, t)
        created, deleted = self.span(g, gen)
        return (gen, self.uid(g, gen)) if created <= t < deleted else None

    def pod_event(self, g: int, gen: int, t: int, deleted: bool) -> PodEvent:
        created, gone = self.span(g, gen)
        uid = self.uid(g, gen)
        info = PodInfo(
            uid=uid, namespace=NAMESPACE, name=self.slots[g].pod, node=self.name, phase="Running",
            owner_kind="Job", owner_name=self.slots[g].pod, created_ms=created,
            deletion_ms=gone if deleted else 0,
            containers=(ContainerInfo(CONTAINER, container_id=uid.replace("-", "") * 2,
                                      requests=((RESOURCE, "1"),), limits=((RESOURCE, "1"),)),),
        )
        return PodEvent(meta=self.meta(t, WATCHER), pod=info, deleted=deleted)

    def sample(self, g: int, gen: int, uid: str, t: int) -> DeviceSample:
        slot = self.slots[g]
        level = (t // self.spec.tick_ms) % 4
        key = (g, gen, level)
        s = self._samples.get(key)
        if s is None:
            util = float(1 + level) if slot.idle else float(55 + 10 * level + (gen % 3) * 5)
            used = 2000.0 + 500 * level + gen % 7 * 1000
            proc = ProcessSample(pid=10_000 + g * 100 + gen % 100, pod_uid=uid,
                                 container_id=uid.replace("-", "") * 2, qos="guaranteed",
                                 sm_util_pct=util, used_mib=used)
            s = DeviceSample(uuid=slot.gpu_uuid, index=g, util_pct=util, mem_util_pct=util / 2,
                             fb_used_mib=used, fb_total_mib=81920.0, power_w=80.0 + 3 * util, temp_c=45.0,
                             processes=(proc,))
            self._samples = {k: v for k, v in self._samples.items() if k[1] >= gen - 1 or k[0] != g}
            self._samples[key] = s
        return s

    def idle_sample(self, g: int) -> DeviceSample:
        key = (g, -1, 0)
        s = self._samples.get(key)
        if s is None:
            s = DeviceSample(uuid=self.slots[g].gpu_uuid, index=g, util_pct=0.0, mem_util_pct=0.0,
                             fb_used_mib=0.0, fb_total_mib=81920.0, power_w=60.0, temp_c=35.0)
            self._samples[key] = s
        return s


def _start_events(node: _Node) -> list[NodeInput]:
    spec, t0 = node.spec, node.spec.start_ms
    gpus = tuple(GpuInfo(uuid=s.gpu_uuid, index=g, model="NVIDIA H100 80GB HBM3", memory_mib=81920.0, minor=g)
                 for g, s in enumerate(node.slots))
    out: list[NodeInput] = [
        NodeEvent(meta=node.meta(t0, WATCHER), name=node.name,
                  labels=(("nvidia.com/gpu.count", str(spec.gpus_per_node)),
                          ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")),
                  capacity=((RESOURCE, str(spec.gpus_per_node)),)),
        DeviceInventory(meta=node.meta(t0), gpus=gpus, driver_version="570.86.15"),
    ]
    for g in range(spec.gpus_per_node):
        held = node.holder(g, t0)
        if held is not None:
            out.append(node.pod_event(g, held[0], t0, deleted=False))
    return out


def _tick_events(node: _Node, t: int) -> list[NodeInput]:
    spec = node.spec
    out: list[NodeInput] = []
    holders: list[tuple[int, int, str]] = []
    for g in range(spec.gpus_per_node):
        gen = node.generation(g, t)
        created, deleted = node.span(g, gen)
        if created <= t < created + spec.tick_ms and t > spec.start_ms:
            out.append(node.pod_event(g, gen, t, deleted=False))
        if deleted <= t < deleted + spec.tick_ms:
            out.append(node.pod_event(g, gen, t, deleted=True))
        held = node.holder(g, t)
        if held is not None:
            holders.append((g, *held))
    if (t - spec.start_ms) % spec.alloc_every_ms < spec.tick_ms:
        entries: list[AllocationEntry] = []
        for g, _, uid in holders:
            dev = (node.slots[g].gpu_uuid,)
            entries.append(AllocationEntry(AllocSource.PODRESOURCES, CONTAINER, RESOURCE, dev,
                                           namespace=NAMESPACE, pod=node.slots[g].pod))
            entries.append(AllocationEntry(AllocSource.CHECKPOINT, CONTAINER, RESOURCE, dev, pod_uid=uid))
        allocatable = tuple((RESOURCE, s.gpu_uuid) for s in node.slots)
        out.append(AllocationSnapshot(meta=node.meta(t), entries=tuple(entries), allocatable=allocatable,
                                      health=_HEALTH))
    held_by = {g: (gen, uid) for g, gen, uid in holders}
    devices = tuple(node.sample(g, *held_by[g], t) if g in held_by else node.idle_sample(g)
                    for g in range(spec.gpus_per_node))
    out.append(NodeTelemetry(meta=node.meta(t), devices=devices))
    every = spec.xid_every_ms
    if every and t > spec.start_ms and (t - spec.start_ms - node.n * 37_000) % every < spec.tick_ms:
        g = (t // every + node.n) % spec.gpus_per_node
        out.append(XidEvent(meta=node.meta(t), gpu_uuid=node.slots[g].gpu_uuid, code=79))
    return out


def generate(spec: ClusterSpec | None = None) -> Iterator[NodeInput]:
    """Every input event of the synthetic cluster, in event-time order (node by node within a tick)."""
    spec = spec or ClusterSpec()
    rng = random.Random(spec.seed)
    nodes = [_Node(spec, n, rng) for n in range(spec.nodes)]
    for node in nodes:
        yield from _start_events(node)
    for i in range(spec.ticks):
        t = spec.start_ms + i * spec.tick_ms
        for node in nodes:
            yield from _tick_events(node, t)
