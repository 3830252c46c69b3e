"""Small builders for core events, so engine tests read like the situations they describe."""

from __future__ import annotations

import uuid as _uuid

from periscope.core.engine import EngineConfig, NodeState, apply, flush, new_state
from periscope.core.model import (
    AllocationEntry,
    AllocationSnapshot,
    AllocSource,
    ContainerInfo,
    DeviceInventory,
    DeviceSample,
    GpuInfo,
    Meta,
    MigDeviceInfo,
    MigRef,
    NodeEvent,
    NodeInput,
    NodeTelemetry,
    Output,
    PodEvent,
    PodInfo,
    ProcessSample,
    SourceHealth,
    XidEvent,
)

NODE = "gpu-a"


def uid(n: int) -> str:
    return str(_uuid.UUID(int=0x5A1D0000_0000_4000_8000_000000000000 + n))


def gpu(n: int) -> str:
    return f"GPU-{_uuid.UUID(int=0xA1000000_0000_4000_8000_000000000000 + n)}"


def mig(n: int) -> str:
    return f"MIG-{_uuid.UUID(int=0xB2000000_0000_4000_8000_000000000000 + n)}"


def meta(t: int, seq: int | None = None, source: str = "probe/gpu-a", node: str = NODE) -> Meta:
    return Meta(node=node, source=source, epoch=1, seq=t if seq is None else seq, time_ms=t)


def pod(
    n: int, name: str, t: int, *, deleted_at: int = 0, ns: str = "ml",
    containers: tuple[str, ...] = ("cuda",), cid: str = "",
) -> PodEvent:
    info = PodInfo(
        uid=uid(n), namespace=ns, name=name, node=NODE, phase="Running", created_ms=t,
        deletion_ms=deleted_at,
        containers=tuple(ContainerInfo(name=c, container_id=cid or f"{n:02x}{i:062x}") for i, c in
                         enumerate(containers)),
    )
    when = deleted_at or t
    return PodEvent(meta=meta(when, seq=when * 10 + n, source="kube_watcher"), pod=info,
                    deleted=bool(deleted_at))


def pr(ns: str, name: str, devices: tuple[str, ...], container: str = "cuda",
       resource: str = "nvidia.com/gpu") -> AllocationEntry:
    return AllocationEntry(AllocSource.PODRESOURCES, container, resource, devices, namespace=ns, pod=name)


def ck(pod_uid: str, devices: tuple[str, ...], container: str = "cuda",
       resource: str = "nvidia.com/gpu") -> AllocationEntry:
    return AllocationEntry(AllocSource.CHECKPOINT, container, resource, devices, pod_uid=pod_uid)


def alloc(t: int, *entries: AllocationEntry, pr_state: str = "ok") -> AllocationSnapshot:
    return AllocationSnapshot(
        meta=meta(t), entries=tuple(entries),
        health=(SourceHealth("podresources", pr_state), SourceHealth("checkpoint", "ok")),
    )


MigSpec = tuple[int, str, int, int, float]  # (mig number, profile, gi, ci, memory MiB)


def inventory(t: int = 0, gpus: int = 2, migs: tuple[MigSpec, ...] = ()) -> DeviceInventory:
    infos = []
    for i in range(gpus):
        md = tuple(MigDeviceInfo(mig(m), prof, gi, ci, mem) for (m, prof, gi, ci, mem) in migs if i == 0)
        infos.append(GpuInfo(uuid=gpu(i), index=i, model="NVIDIA A100-SXM4-80GB", memory_mib=81920.0,
                             minor=i, mig_enabled=bool(md), mig_devices=md))
    return DeviceInventory(meta=meta(t, seq=0), gpus=tuple(infos))


def proc(pid: int, pod_uid: str, sm: float | None, mib: float | None, cid: str = "") -> ProcessSample:
    return ProcessSample(pid=pid, pod_uid=pod_uid, container_id=cid, sm_util_pct=sm, used_mib=mib)


def dev(uuid: str, util: float | None, fb: float | None = 1000.0, power: float | None = 100.0,
        procs: tuple[ProcessSample, ...] = (), parent: str = "", mig_ref: MigRef | None = None,
        index: int = 0) -> DeviceSample:
    return DeviceSample(uuid=uuid, parent_uuid=parent, index=index, mig=mig_ref, util_pct=util,
                        fb_used_mib=fb, fb_total_mib=81920.0, power_w=power, temp_c=50.0, processes=procs)


def tel(t: int, *devices: DeviceSample) -> NodeTelemetry:
    return NodeTelemetry(meta=meta(t), devices=tuple(devices))


def xid(t: int, gpu_uuid: str, code: int = 79, mig_ref: MigRef | None = None) -> XidEvent:
    return XidEvent(meta=meta(t, seq=t + 1), gpu_uuid=gpu_uuid, code=code, mig=mig_ref)


def node_labels(t: int, **labels: str) -> NodeEvent:
    return NodeEvent(meta=meta(t, source="kube_watcher"), name=NODE, labels=tuple(sorted(labels.items())))


def run(events: list[NodeInput], config: EngineConfig | None = None) -> tuple[NodeState, list[Output]]:
    """Step a fresh node state through `events` and flush it: the state and every output, in order."""
    cfg = config or EngineConfig()
    state = new_state(NODE)
    outs: list[Output] = []
    for e in events:
        o = apply(state, e, cfg)
        outs.extend(o)
    outs.extend(flush(state, cfg))
    return state, outs
