"""Allocation entries from the kubelet's answers: PodResources devices, DRA claims, allocatable devices.

One AllocationEntry per (source, container, resource). The kubelet returns one ContainerDevices per
device (and per NUMA node), so devices of one resource are merged, in order, without duplicates.
Kubelet device IDs pass through unchanged (`GPU-...::N`, `MIG-...`); the core resolves them. DRA
devices are named by their driver; for the NVIDIA driver the probe resolves the name to NVML UUIDs
from its own inventory (facts: `gpu-<minor>`, `gpu-<minor>-mig-<giProfileId>-<start>-<size>` in
v25.3-v25.8, `gpu-<minor>-mig-<profile>-<giProfileId>-<start>` from v25.12). A MIG name is matched as
the driver's own parser reads it (NewMigSpecTupleFromCanonicalName): by (parent minor, GI profile ID,
placement start), never by its profile text, which the driver squeezes to DNS form (dots dropped, `+`
turned into `-`: Blackwell's `1g.24gb+me` and `1g.24gb-me` both read `1g24gb-me`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from periscope.core.model import AllocationEntry, AllocSource
from periscope.k8s.podresources.v1 import api_pb2 as pb
from services.probe.nvml import MigPlacement, NvmlInventory

# Device-plugin resources the probe reports: GPU attribution has no use for other devices' IDs.
GPU_RESOURCE_PREFIXES = ("nvidia.com/",)
NVIDIA_DRA_DRIVER = "gpu.nvidia.com"

_GPU = re.compile(r"^gpu-(\d+)$")
_MIG = re.compile(r"^gpu-(\d+)-mig-(.+)-(\d+)-(\d+)$")


def is_gpu_resource(resource: str) -> bool:
    return resource.startswith(GPU_RESOURCE_PREFIXES)


def _merge(ids: Iterable[str], into: list[str]) -> None:
    for i in ids:
        if i not in into:
            into.append(i)


def resolve_dra_device(device: str, inventory: NvmlInventory) -> tuple[str, ...]:
    """NVML UUIDs of an NVIDIA DRA device name; () when the name or the device is unknown."""
    m = _GPU.match(device)
    if m:
        minor = int(m.group(1))
        return tuple(g.uuid for g in inventory.gpus if g.minor == minor)
    m = _MIG.match(device)
    if not m:
        return ()  # e.g. gpu-vfio-<n>: passthrough devices are invisible to NVML
    minor, middle, a, b = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
    on_parent = [p for p in inventory.placements if p.parent_minor == minor]

    def find(pred: Callable[[MigPlacement], bool]) -> tuple[str, ...]:
        return tuple(p.uuid for p in on_parent if pred(p))

    if middle.isdigit():  # v25.3 form: <giProfileId>-<placementStart>-<placementSize>
        hit = find(lambda p: p.profile_id == int(middle) and p.start == a and p.size == b)
        if hit:
            return hit
    # v25.12 form: <profile, DNS-squeezed>-<giProfileId>-<placementStart>; the text is not compared
    return find(lambda p: p.profile_id == a and p.start == b)


def podresources_entries(
    pods: Iterable[pb.PodResources], resolve: Callable[[str, str], tuple[str, ...]]
) -> list[AllocationEntry]:
    """PODRESOURCES entries (namespace/pod, no UID) and DRA entries; `resolve(driver, device)`
    maps a DRA device to NVML UUIDs."""
    out: list[AllocationEntry] = []
    for pod in pods:
        for c in pod.containers:
            merged: dict[str, list[str]] = {}
            for d in c.devices:
                if is_gpu_resource(d.resource_name) and d.device_ids:
                    _merge(d.device_ids, merged.setdefault(d.resource_name, []))
            for resource, ids in merged.items():
                out.append(
                    AllocationEntry(
                        source=AllocSource.PODRESOURCES,
                        container=c.name,
                        resource=resource,
                        device_ids=tuple(ids),
                        namespace=pod.namespace,
                        pod=pod.name,
                    )
                )
            for dyn in c.dynamic_resources:
                for r in dyn.claim_resources:
                    out.append(
                        AllocationEntry(
                            source=AllocSource.DRA,
                            container=c.name,
                            resource=r.driver_name,
                            device_ids=resolve(r.driver_name, r.device_name),
                            namespace=pod.namespace,
                            pod=pod.name,
                            claim_name=dyn.claim_name,
                            claim_namespace=dyn.claim_namespace or pod.namespace,
                            driver=r.driver_name,
                            pool=r.pool_name,
                            device=r.device_name,
                        )
                    )
    return out


def allocatable_devices(devices: Iterable[pb.ContainerDevices]) -> tuple[tuple[str, str], ...]:
    seen: list[tuple[str, str]] = []
    for d in devices:
        if is_gpu_resource(d.resource_name):
            for i in d.device_ids:
                if (d.resource_name, i) not in seen:
                    seen.append((d.resource_name, i))
    return tuple(seen)


def dra_resolver(inventory: NvmlInventory) -> Callable[[str, str], tuple[str, ...]]:
    def resolve(driver: str, device: str) -> tuple[str, ...]:
        return resolve_dra_device(device, inventory) if driver == NVIDIA_DRA_DRIVER else ()

    return resolve


def sort_entries(entries: Iterable[AllocationEntry]) -> tuple[AllocationEntry, ...]:
    """A canonical order, so that an unchanged allocation compares equal between polls."""
    return tuple(
        sorted(
            entries,
            key=lambda e: (
                e.source.value,
                e.namespace,
                e.pod,
                e.pod_uid,
                e.container,
                e.resource,
                e.claim_name,
                e.device,
                e.device_ids,
            ),
        )
    )
