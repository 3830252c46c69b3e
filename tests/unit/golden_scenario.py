"""One small cluster that exercises every output kind and every value that can be unknown, for the golden
tests of the API endpoints and of `periscope replay --format json`.

Node gpu-a (PodResources healthy), 3 GPUs, GPU 2 split into one MIG slice:
- `ml/train-0` holds GPU 0, busy (60 %); a host process no pod owns runs there too; XID 79 at 12m;
- `ml/notebook-0` holds GPU 1, idle (1 %) for the whole 15 minutes: idle rows and an idle finding;
- `infer/serve-0` holds the MIG slice (no per-slice utilization: null);
- two live pods named `ml/dup` while PodResources names `ml/dup` once: an ambiguous join (no UID);
- `ml/gke-7` holds `nvidia7`, a device minor no GPU of the node has: a row with no GPU (unresolved).
Node gpu-b, PodResources unavailable (a source-health finding): the checkpoint names a pod UID the
apiserver never reported, so its holder has no namespace or name.
Telemetry every 10 s for 15 minutes.
"""

from __future__ import annotations

import uuid as _uuid

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
    NodeInput,
    NodeTelemetry,
    PodEvent,
    PodInfo,
    ProcessSample,
    SourceHealth,
    XidEvent,
)

T0 = 1_795_320_000_000  # 2026-11-22T04:00:00Z
S = 1000
MIN = 60 * S
END = T0 + 15 * MIN
A, B = "gpu-a", "gpu-b"


def uid(n: int) -> str:
    return str(_uuid.UUID(int=0x60D0000_0000_4000_8000_000000000000 + n))


def gpu(node: str, n: int) -> str:
    return f"GPU-{_uuid.UUID(int=(0xA1 if node == A else 0xB1) << 120 | 0x4000_8000_000000000000 | n)}"


MIG = f"MIG-{_uuid.UUID(int=0xC3000000_0000_4000_8000_000000000001)}"
MIG_REF = MigRef(MIG, "1g.10gb", 1, 0)


def meta(node: str, t: int, source: str, seq: int | None = None) -> Meta:
    return Meta(node=node, source=source, epoch=1, seq=t if seq is None else seq, time_ms=t)


def pod(n: int, ns: str, name: str, node: str = A) -> PodEvent:
    info = PodInfo(uid=uid(n), namespace=ns, name=name, node=node, phase="Running", created_ms=T0 - MIN,
                   owner_kind="StatefulSet", owner_name=name.rsplit("-", 1)[0],
                   containers=(ContainerInfo(name="cuda", container_id=f"containerd://{n:064x}"),))
    return PodEvent(meta=meta(node, T0 - MIN + n, "kube_watcher"), pod=info)


def pr(ns: str, name: str, device: str) -> AllocationEntry:
    return AllocationEntry(AllocSource.PODRESOURCES, "cuda", "nvidia.com/gpu", (device,), namespace=ns,
                           pod=name)


def ck(n: int, device: str) -> AllocationEntry:
    return AllocationEntry(AllocSource.CHECKPOINT, "cuda", "nvidia.com/gpu", (device,), pod_uid=uid(n))


def inventory(node: str, gpus: int, mig_on: int | None = None) -> DeviceInventory:
    infos = tuple(
        GpuInfo(uuid=gpu(node, i), index=i, model="NVIDIA A100-SXM4-80GB", memory_mib=81920.0, minor=i,
                mig_enabled=i == mig_on,
                mig_devices=(MigDeviceInfo(MIG, "1g.10gb", 1, 0, 9984.0),) if i == mig_on else ())
        for i in range(gpus))
    return DeviceInventory(meta=meta(node, T0 - MIN, f"probe/{node}", 0), gpus=infos,
                           driver_version="580.95.05")


def allocations(node: str, t: int) -> AllocationSnapshot:
    if node == A:
        entries = (pr("ml", "train-0", gpu(A, 0)), ck(1, gpu(A, 0)), pr("ml", "notebook-0", gpu(A, 1)),
                   ck(2, gpu(A, 1)), pr("infer", "serve-0", MIG), ck(3, MIG), pr("ml", "dup", gpu(A, 0)),
                   pr("ml", "gke-7", "nvidia7"))
        health = (SourceHealth("podresources", "ok"), SourceHealth("checkpoint", "ok"))
    else:
        entries = (ck(9, gpu(B, 0)),)
        health = (SourceHealth("podresources", "unavailable", "socket not found"),
                  SourceHealth("checkpoint", "ok"))
    return AllocationSnapshot(meta=meta(node, t, f"probe/{node}"), entries=entries, health=health)


def _proc(pid: int, n: int | None, sm: float) -> ProcessSample:
    return ProcessSample(pid=pid, pod_uid=uid(n) if n is not None else "", sm_util_pct=sm, used_mib=2048.0)


def telemetry(node: str, t: int) -> NodeTelemetry:
    def dev(i: int, util: float | None, procs: tuple[ProcessSample, ...] = ()) -> DeviceSample:
        return DeviceSample(uuid=gpu(node, i), index=i, util_pct=util, fb_used_mib=4096.0 + i,
                            fb_total_mib=81920.0, power_w=90.0 + i, temp_c=40.0 + i, processes=procs)

    if node == B:
        return NodeTelemetry(meta=meta(node, t, f"probe/{node}"),
                             devices=(dev(0, 30.0, (_proc(77, 9, 30.0),)),))
    devices = (
        dev(0, 60.0, (_proc(101, 1, 55.0), _proc(4242, None, 5.0))),
        dev(1, 1.0, (_proc(102, 2, 1.0),)),
        dev(2, None),
        DeviceSample(uuid=MIG, parent_uuid=gpu(A, 2), index=2, mig=MIG_REF, util_pct=None, fb_used_mib=512.0,
                     fb_total_mib=9984.0, processes=(_proc(103, 3, 0.0),)),
    )
    return NodeTelemetry(meta=meta(node, t, f"probe/{node}"), devices=devices)


def events() -> list[NodeInput]:
    evs: list[NodeInput] = [
        inventory(A, 3, mig_on=2), inventory(B, 1),
        pod(1, "ml", "train-0"), pod(2, "ml", "notebook-0"), pod(3, "infer", "serve-0"),
        pod(5, "ml", "dup"), pod(6, "ml", "dup"), pod(7, "ml", "gke-7"),
        XidEvent(meta=meta(A, T0 + 12 * MIN + 500, f"probe/{A}", T0 + 12 * MIN + 501), gpu_uuid=gpu(A, 0),
                 code=79),
    ]
    for t in range(T0, END + 1, 10 * S):
        for node in (A, B):
            if (t - T0) % (30 * S) == 0:
                evs.append(allocations(node, t))
            evs.append(telemetry(node, t))
    evs.sort(key=lambda e: e.meta.time_ms)
    return evs
