"""Synthetic node workload shared by the benchmarks: the events one probe and the watcher publish.

A simulated node has `gpus` whole GPUs and one pod per GPU (exclusive allocation, seen by both the
PodResources API and the kubelet checkpoint); each pod runs `procs_per_gpu` processes on its GPU.
Every tick the node's probe publishes one NodeTelemetry holding every device and its processes, with
pod identity already resolved from /proc, exactly as the real probe does. Identifiers are derived from
the node index, so any process can regenerate the same cluster.
"""

from __future__ import annotations

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
)

NAMESPACE = "bench"
RESOURCE = "nvidia.com/gpu"
MODEL = "NVIDIA H100 80GB HBM3"
FB_TOTAL_MIB = 81559.0
EPOCH = 1  # probe epoch (its start time in real life); constant so replays are reproducible
T0_MS = 1_790_000_000_000  # event time of the first tick when none is given (2026-09)
HEALTH = (SourceHealth("podresources", "ok"), SourceHealth("checkpoint", "ok"))


def _id(kind: int, node: int, n: int) -> _uuid.UUID:
    return _uuid.UUID(int=(0x5E1C0000 + kind) << 96 | 0x4000_8000_0000_0000 << 32 | node << 16 | n)


def node_name(i: int) -> str:
    return f"bench-{i:05d}"


def gpu_uuid(node: int, g: int) -> str:
    return f"GPU-{_id(1, node, g)}"


def pod_uid(node: int, p: int) -> str:
    return str(_id(2, node, p))


def container_id(node: int, p: int) -> str:
    return f"{node:032x}{p:032x}"


def pod_name(node: int, p: int) -> str:
    return f"train-{node:05d}-{p}"


@dataclass(frozen=True, slots=True)
class NodeShape:
    gpus: int = 8
    procs_per_gpu: int = 1

    @property
    def processes(self) -> int:
        return self.gpus * self.procs_per_gpu


class SyntheticNode:
    """Events of one simulated node; `seq` numbers follow the probe's and the watcher's own order."""

    def __init__(self, index: int, shape: NodeShape = NodeShape(), namespace: str = NAMESPACE) -> None:
        self.index = index
        self.shape = shape
        self.namespace = namespace
        self.name = node_name(index)
        self.source = f"probe/{self.name}"
        self._seq = 0
        self._watch_seq = 0

    def _meta(self, t_ms: int) -> Meta:
        self._seq += 1
        return Meta(node=self.name, source=self.source, epoch=EPOCH, seq=self._seq, time_ms=t_ms)

    def _watch_meta(self, t_ms: int) -> Meta:
        self._watch_seq += 1
        return Meta(node=self.name, source="kube_watcher", epoch=EPOCH, seq=self._watch_seq, time_ms=t_ms)

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
        cap = (("nvidia.com/gpu", str(self.shape.gpus)),)
        return NodeEvent(meta=self._watch_meta(t_ms), name=self.name, labels=labels, capacity=cap,
                         allocatable=cap)

    def pods(self, t_ms: int) -> list[PodEvent]:
        out = []
        for p in range(self.shape.gpus):
            info = PodInfo(
                uid=pod_uid(self.index, p), namespace=self.namespace, name=pod_name(self.index, p),
                node=self.name, phase="Running", qos="guaranteed", owner_kind="Job",
                owner_name=f"train-{self.index:05d}", created_ms=t_ms - 60_000, started_ms=t_ms - 55_000,
                resource_version=str(self.index * 100 + p),
                containers=(ContainerInfo(name="main", container_id=container_id(self.index, p),
                                          requests=((RESOURCE, "1"),), limits=((RESOURCE, "1"),)),),
            )
            out.append(PodEvent(meta=self._watch_meta(t_ms), pod=info))
        return out

    def allocation(self, t_ms: int) -> AllocationSnapshot:
        entries: list[AllocationEntry] = []
        for p in range(self.shape.gpus):
            dev = (gpu_uuid(self.index, p),)
            entries.append(AllocationEntry(AllocSource.PODRESOURCES, "main", RESOURCE, dev,
                                           namespace=self.namespace, pod=pod_name(self.index, p)))
            entries.append(AllocationEntry(AllocSource.CHECKPOINT, "main", RESOURCE, dev,
                                           pod_uid=pod_uid(self.index, p)))
        allocatable = tuple((RESOURCE, gpu_uuid(self.index, g)) for g in range(self.shape.gpus))
        return AllocationSnapshot(meta=self._meta(t_ms), entries=tuple(entries), allocatable=allocatable,
                                  health=HEALTH)

    def telemetry(self, t_ms: int) -> NodeTelemetry:
        tick = t_ms // 1000
        devices = []
        for g in range(self.shape.gpus):
            util = float((tick * 7 + g * 13 + self.index) % 100)
            k = self.shape.procs_per_gpu
            procs = tuple(
                ProcessSample(pid=10_000 + g * 100 + j, pod_uid=pod_uid(self.index, g),
                              container_id=container_id(self.index, g), qos="guaranteed",
                              sm_util_pct=util / k, mem_util_pct=util / (2 * k), used_mib=4096.0 + j)
                for j in range(k)
            )
            devices.append(DeviceSample(
                uuid=gpu_uuid(self.index, g), index=g, util_pct=util, mem_util_pct=util / 2,
                fb_used_mib=4096.0 * k + g, fb_total_mib=FB_TOTAL_MIB, power_w=300.0 + util,
                temp_c=50.0 + g, processes=procs,
            ))
        return NodeTelemetry(meta=self._meta(t_ms), devices=tuple(devices))

    def setup(self, t_ms: int) -> list[tuple[Topic, NodeInput]]:
        """What a node's probe and the watcher publish before the first tick."""
        return [
            (topics.NODES, self.node_event(t_ms)),
            *((topics.PODS, ev) for ev in self.pods(t_ms)),
            (topics.INVENTORY, self.inventory(t_ms)),
            (topics.ALLOCATIONS, self.allocation(t_ms)),
        ]

    def tick(self, t_ms: int, n: int, allocation_every: int = 5) -> list[tuple[Topic, NodeInput]]:
        """Tick n: a telemetry sample, plus the unchanged allocation snapshot every few ticks (the
        probe republishes it every ALLOCATION_INTERVAL)."""
        out: list[tuple[Topic, NodeInput]] = [(topics.TELEMETRY, self.telemetry(t_ms))]
        if n % allocation_every == allocation_every - 1:
            out.append((topics.ALLOCATIONS, self.allocation(t_ms)))
        return out


def cluster_events(
    nodes: int, ticks: int, shape: NodeShape = NodeShape(), t0_ms: int = T0_MS, tick_ms: int = 1000
) -> Iterator[tuple[Topic, NodeInput]]:
    """Every event of `nodes` nodes over `ticks` ticks, in event-time order (node order within a tick)."""
    sims = [SyntheticNode(i, shape) for i in range(nodes)]
    for s in sims:
        yield from s.setup(t0_ms - 1)
    for n in range(ticks):
        t = t0_ms + n * tick_ms
        for s in sims:
            yield from s.tick(t, n)
