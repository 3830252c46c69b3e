"""A synthetic GPU cluster's input events: the one generator behind replay measurements and benchmarks.

Each node has whole GPUs, one pod per GPU (exclusive allocation, seen by both the PodResources API and
the kubelet checkpoint), each pod running `procs_per_gpu` processes on its GPU. Every tick the node's
probe publishes one NodeTelemetry with every device and its processes (pod identity already resolved,
as the real probe does), and every `alloc_every_ms` an allocation snapshot. Optionally (a ClusterSpec's
defaults) pods are replaced on a schedule by a new pod with the same name and a new UID (the name-reuse
case, so the core resolves names against the pod registry all along), every fifth GPU's pods are
allocated but idle, and now and then a node reports an XID. Identifiers derive from the node index,
slot and pod generation, so any process regenerates the same cluster; a spec's seed staggers the pods.
"""

from __future__ import annotations

import random
import uuid as _uuid
from collections.abc import Iterator
from dataclasses import dataclass

from periscope.bus import topics
from periscope.bus.topics import Topic
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

NAMESPACE = "ml"
RESOURCE = "nvidia.com/gpu"
CONTAINER = "main"
MODEL = "NVIDIA H100 80GB HBM3"
FB_TOTAL_MIB = 81559.0
EPOCH = 1  # probe epoch (its start time in real life); constant so replays are reproducible
T0_MS = 1_790_000_000_000  # event time of the first tick when none is given (2026-09)
WATCHER = "kube_watcher"
HEALTH = (SourceHealth("podresources", "ok"), SourceHealth("checkpoint", "ok"))
_STATIC_CREATED_MS = 60_000  # a pod that is never replaced was created this long before setup


def _id(kind: int, node: int, n: int, generation: int = 0) -> _uuid.UUID:
    return _uuid.UUID(int=(0x5E1C0000 + kind) << 96 | (0x4000_8000_0000_0000 | generation) << 32
                      | node << 16 | n)


def node_name(i: int) -> str:
    return f"gpu-node-{i:05d}"


def gpu_uuid(node: int, g: int) -> str:
    return f"GPU-{_id(1, node, g)}"


def pod_uid(node: int, p: int, generation: int = 0) -> str:
    return str(_id(2, node, p, generation))


def container_id(node: int, p: int, generation: int = 0) -> str:
    return f"{node:032x}{generation << 16 | p:032x}"


def pod_name(node: int, p: int) -> str:
    return f"train-{node:05d}-{p}"


@dataclass(frozen=True, slots=True)
class NodeShape:
    gpus: int = 8
    procs_per_gpu: int = 1

    @property
    def processes(self) -> int:
        return self.gpus * self.procs_per_gpu


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    nodes: int = 50
    gpus_per_node: int = 8
    duration_ms: int = 3_600_000
    tick_ms: int = 1000
    start_ms: int = T0_MS
    alloc_every_ms: int = 5000
    pod_lifetime_ms: int = 1_200_000  # a GPU's pod is replaced (same name, new UID) this often; 0: never
    gap_ms: int = 10_000  # between one pod's deletion and its successor's creation
    xid_every_ms: int = 900_000  # per node; 0: none
    idle_every: int = 5  # every n-th GPU of the cluster holds allocated-but-idle pods; 0: none
    procs_per_gpu: int = 1
    seed: int = 0

    @property
    def ticks(self) -> int:
        return self.duration_ms // self.tick_ms

    @property
    def device_samples(self) -> int:
        """Device readings the generated telemetry carries."""
        return self.ticks * self.nodes * self.gpus_per_node

    @property
    def shape(self) -> NodeShape:
        return NodeShape(self.gpus_per_node, self.procs_per_gpu)


def static_spec(nodes: int, ticks: int, shape: NodeShape = NodeShape(), t0_ms: int = T0_MS,
                tick_ms: int = 1000) -> ClusterSpec:
    """A cluster whose pods never change and whose GPUs are all busy (no XIDs)."""
    return ClusterSpec(nodes=nodes, gpus_per_node=shape.gpus, procs_per_gpu=shape.procs_per_gpu,
                       duration_ms=ticks * tick_ms, tick_ms=tick_ms, start_ms=t0_ms, pod_lifetime_ms=0,
                       xid_every_ms=0, idle_every=0)


class SyntheticNode:
    """Events of one node; `seq` numbers follow the probe's and the watcher's own order."""

    def __init__(self, index: int, shape: NodeShape = NodeShape(), namespace: str = NAMESPACE,
                 spec: ClusterSpec | None = None) -> None:
        self.index, self.shape, self.namespace = index, shape, namespace
        self.spec = spec or static_spec(1, 0, shape)
        self.name = node_name(index)
        self.source = f"probe/{self.name}"
        self._seq = self._watch_seq = 0
        life = self.spec.pod_lifetime_ms
        rng = random.Random(f"{self.spec.seed}/{index}")
        # Stagger, so pods of a cluster do not all churn at once.
        self._offset = [rng.randrange(0, life, self.spec.alloc_every_ms) if life else 0
                        for _ in range(shape.gpus)]
        every = self.spec.idle_every
        self._idle = [bool(every) and (index * shape.gpus + g) % every == 0 for g in range(shape.gpus)]

    def _meta(self, t_ms: int) -> Meta:
        self._seq += 1
        return Meta(node=self.name, source=self.source, epoch=EPOCH, seq=self._seq, time_ms=t_ms)

    def _watch_meta(self, t_ms: int) -> Meta:
        self._watch_seq += 1
        return Meta(node=self.name, source=WATCHER, epoch=EPOCH, seq=self._watch_seq, time_ms=t_ms)

    # ---------------------------------------------------------------- pod generations

    def generation(self, g: int, t_ms: int) -> int:
        life = self.spec.pod_lifetime_ms
        return (t_ms - self.spec.start_ms + self._offset[g]) // life if life else 0

    def span(self, g: int, gen: int, t_ms: int = 0) -> tuple[int, int]:
        """(created, deleted) of generation gen of slot g; deleted 0: never."""
        life = self.spec.pod_lifetime_ms
        if not life:
            return t_ms - _STATIC_CREATED_MS, 0
        begin = self.spec.start_ms - self._offset[g] + gen * life
        return begin, begin + life - self.spec.gap_ms

    def holder(self, g: int, t_ms: int) -> int | None:
        """The generation whose pod holds slot g at t (None between two pods)."""
        gen = self.generation(g, t_ms)
        created, deleted = self.span(g, gen, t_ms)
        return gen if created <= t_ms and (not deleted or t_ms < deleted) else None

    def pod_event(self, g: int, gen: int, t_ms: int, deleted: bool = False) -> PodEvent:
        created, gone = self.span(g, gen, t_ms)
        cid = container_id(self.index, g, gen)
        info = PodInfo(
            uid=pod_uid(self.index, g, gen), namespace=self.namespace, name=pod_name(self.index, g),
            node=self.name, phase="Running", qos="guaranteed", owner_kind="Job",
            owner_name=f"train-{self.index:05d}", created_ms=created, started_ms=created + 5000,
            deletion_ms=gone if deleted else 0, resource_version=str((self.index * 100 + g) << 8 | gen),
            containers=(ContainerInfo(name=CONTAINER, container_id=cid, requests=((RESOURCE, "1"),),
                                      limits=((RESOURCE, "1"),)),),
        )
        return PodEvent(meta=self._watch_meta(t_ms), pod=info, deleted=deleted)

    # ---------------------------------------------------------------- events

    def inventory(self, t_ms: int) -> DeviceInventory:
        gpus = tuple(
            GpuInfo(uuid=gpu_uuid(self.index, g), index=g, model=MODEL, memory_mib=FB_TOTAL_MIB, minor=g,
                    pci_bus_id=f"00000000:{0x18 + g:02X}:00.0")
            for g in range(self.shape.gpus)
        )
        return DeviceInventory(meta=self._meta(t_ms), gpus=gpus, health=HEALTH, driver_version="550.54.15",
                               cuda_driver_version="12.4")

    def node_event(self, t_ms: int) -> NodeEvent:
        labels = (("nvidia.com/gpu.count", str(self.shape.gpus)), ("nvidia.com/gpu.product", MODEL))
        cap = ((RESOURCE, str(self.shape.gpus)),)
        return NodeEvent(meta=self._watch_meta(t_ms), name=self.name, labels=labels, capacity=cap,
                         allocatable=cap)

    def pods(self, t_ms: int) -> list[PodEvent]:
        """The pods alive at t."""
        return [self.pod_event(g, gen, t_ms) for g in range(self.shape.gpus)
                if (gen := self.holder(g, t_ms)) is not None]

    def allocation(self, t_ms: int) -> AllocationSnapshot:
        entries: list[AllocationEntry] = []
        for g in range(self.shape.gpus):
            gen = self.holder(g, t_ms)
            if gen is None:
                continue
            dev = (gpu_uuid(self.index, g),)
            entries.append(AllocationEntry(AllocSource.PODRESOURCES, CONTAINER, RESOURCE, dev,
                                           namespace=self.namespace, pod=pod_name(self.index, g)))
            entries.append(AllocationEntry(AllocSource.CHECKPOINT, CONTAINER, RESOURCE, dev,
                                           pod_uid=pod_uid(self.index, g, gen)))
        allocatable = tuple((RESOURCE, gpu_uuid(self.index, g)) for g in range(self.shape.gpus))
        return AllocationSnapshot(meta=self._meta(t_ms), entries=tuple(entries), allocatable=allocatable,
                                  health=HEALTH)

    def device(self, g: int, t_ms: int) -> DeviceSample:
        gen = self.holder(g, t_ms)
        uuid = gpu_uuid(self.index, g)
        if gen is None:
            return DeviceSample(uuid=uuid, index=g, util_pct=0.0, mem_util_pct=0.0, fb_used_mib=0.0,
                                fb_total_mib=FB_TOTAL_MIB, power_w=60.0, temp_c=35.0)
        tick = t_ms // self.spec.tick_ms
        k = self.shape.procs_per_gpu
        util = float(1 + tick % 4) if self._idle[g] else float(55 + (tick * 7 + g * 13 + self.index) % 40)
        uid, cid = pod_uid(self.index, g, gen), container_id(self.index, g, gen)
        procs = tuple(
            ProcessSample(pid=10_000 + g * 100 + j, pod_uid=uid, container_id=cid, qos="guaranteed",
                          sm_util_pct=util / k, mem_util_pct=util / (2 * k), used_mib=4096.0 + j)
            for j in range(k)
        )
        return DeviceSample(uuid=uuid, index=g, util_pct=util, mem_util_pct=util / 2,
                            fb_used_mib=4096.0 * k + g, fb_total_mib=FB_TOTAL_MIB, power_w=300.0 + util,
                            temp_c=50.0 + g, processes=procs)

    def telemetry(self, t_ms: int) -> NodeTelemetry:
        return NodeTelemetry(meta=self._meta(t_ms),
                             devices=tuple(self.device(g, t_ms) for g in range(self.shape.gpus)))

    def setup(self, t_ms: int) -> list[tuple[Topic, NodeInput]]:
        """What a node's probe and the watcher publish before the first tick."""
        return [
            (topics.NODES, self.node_event(t_ms)),
            *((topics.PODS, ev) for ev in self.pods(t_ms)),
            (topics.INVENTORY, self.inventory(t_ms)),
            (topics.ALLOCATIONS, self.allocation(t_ms)),
        ]

    def tick(self, t_ms: int, n: int) -> list[tuple[Topic, NodeInput]]:
        """Tick n at t: pods created or deleted in this tick, a telemetry sample, an allocation snapshot
        every alloc_every_ms (the probe republishes it, changed or not), and the odd XID."""
        spec = self.spec
        out: list[tuple[Topic, NodeInput]] = []
        if spec.pod_lifetime_ms:
            for g in range(self.shape.gpus):
                gen = self.generation(g, t_ms)
                created, deleted = self.span(g, gen)
                if created <= t_ms < created + spec.tick_ms:  # (pods alive at setup came then)
                    out.append((topics.PODS, self.pod_event(g, gen, t_ms)))
                if deleted <= t_ms < deleted + spec.tick_ms:
                    out.append((topics.PODS, self.pod_event(g, gen, t_ms, deleted=True)))
        if n % max(1, spec.alloc_every_ms // spec.tick_ms) == 0:
            out.append((topics.ALLOCATIONS, self.allocation(t_ms)))
        out.append((topics.TELEMETRY, self.telemetry(t_ms)))
        every = spec.xid_every_ms
        if every and n > 0 and (t_ms - spec.start_ms - self.index * 37_000) % every < spec.tick_ms:
            g = (t_ms // every + self.index) % self.shape.gpus
            xid = XidEvent(meta=self._meta(t_ms), gpu_uuid=gpu_uuid(self.index, g), code=79)
            out.append((topics.XID, xid))
        return out


def cluster_events(nodes: int, ticks: int, shape: NodeShape = NodeShape(), t0_ms: int = T0_MS,
                   tick_ms: int = 1000) -> Iterator[tuple[Topic, NodeInput]]:
    """Every event of a static cluster (`static_spec`), with its topic, in event-time order."""
    yield from timeline(static_spec(nodes, ticks, shape, t0_ms, tick_ms))


def timeline(spec: ClusterSpec) -> Iterator[tuple[Topic, NodeInput]]:
    """Every input event of the cluster with its topic, in event-time order (node order within a tick):
    the setup just before the start, then one tick per tick_ms."""
    sims = [SyntheticNode(i, spec.shape, spec=spec) for i in range(spec.nodes)]
    for s in sims:
        yield from s.setup(spec.start_ms - 1)
    for n in range(spec.ticks):
        t = spec.start_ms + n * spec.tick_ms
        for s in sims:
            yield from s.tick(t, n)


def generate(spec: ClusterSpec | None = None) -> Iterator[NodeInput]:
    """Every input event of the synthetic cluster, in event-time order (node by node within a tick)."""
    for _, ev in timeline(spec or ClusterSpec()):
        yield ev
