"""Allocation entries built from PodResources answers, DRA device-name resolution, checkpoint source."""

from __future__ import annotations

import os
import time
from pathlib import Path

from periscope.core.model import AllocationEntry, AllocSource, GpuInfo, MigDeviceInfo
from periscope.k8s.podresources.v1 import api_pb2 as pb
from periscope.kubelet.checkpoint import CheckpointEntry, render_checkpoint
from services.probe.allocations import (
    allocatable_devices,
    dra_resolver,
    podresources_entries,
    resolve_dra_device,
    sort_entries,
)
from services.probe.checkpoint_source import RACY_NS, CheckpointSource
from services.probe.nvml import MigPlacement, NvmlInventory

G0, G1 = "GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111"
M1, M2 = "MIG-22222222-2222-2222-2222-222222222222", "MIG-33333333-3333-3333-3333-333333333333"
UID = "5a1d3c2e-8f4b-4c1a-9e2d-0123456789ab"

INV = NvmlInventory(
    gpus=(
        GpuInfo(uuid=G0, index=0, minor=3),
        GpuInfo(
            uuid=G1,
            index=1,
            minor=1,
            mig_enabled=True,
            mig_devices=(MigDeviceInfo(M1, "1g.10gb", 9, 0), MigDeviceInfo(M2, "2g.47gb", 5, 0)),
        ),
    ),
    placements=(
        MigPlacement(M1, G1, 1, "1g.10gb", 19, 4, 1),
        MigPlacement(M2, G1, 1, "2g.47gb", 14, 0, 2),
    ),
)


def devices(resource: str, *ids: str, numa: int = 0) -> pb.ContainerDevices:
    return pb.ContainerDevices(
        resource_name=resource, device_ids=list(ids), topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=numa)])
    )


def test_devices_of_one_resource_are_merged_per_container() -> None:
    pod = pb.PodResources(
        name="train-0",
        namespace="ml",
        containers=[
            pb.ContainerResources(
                name="cuda",
                devices=[
                    devices("nvidia.com/gpu", G0 + "::1", numa=0),
                    devices("nvidia.com/gpu", G1 + "::0", numa=1),
                    devices(
                        "nvidia.com/gpu", G0 + "::1", numa=1
                    ),  # a device on two NUMA nodes is listed twice
                    devices("intel.com/sriov", "0000:3b:02.0"),
                    devices("nvidia.com/mig-1g.10gb", M1),
                ],
            ),
            pb.ContainerResources(name="sidecar"),
        ],
    )
    entries = podresources_entries([pod], dra_resolver(INV))
    assert entries == [
        AllocationEntry(
            AllocSource.PODRESOURCES,
            "cuda",
            "nvidia.com/gpu",
            (G0 + "::1", G1 + "::0"),
            namespace="ml",
            pod="train-0",
        ),
        AllocationEntry(
            AllocSource.PODRESOURCES, "cuda", "nvidia.com/mig-1g.10gb", (M1,), namespace="ml", pod="train-0"
        ),
    ]


def test_dra_entries_carry_the_claim_and_resolved_uuids() -> None:
    pod = pb.PodResources(
        name="infer",
        namespace="serve",
        containers=[
            pb.ContainerResources(
                name="main",
                dynamic_resources=[
                    pb.DynamicResource(
                        claim_name="gpu-claim",
                        claim_namespace="serve",
                        claim_resources=[
                            pb.ClaimResource(
                                driver_name="gpu.nvidia.com", pool_name="node-a", device_name="gpu-3"
                            ),
                            pb.ClaimResource(
                                driver_name="gpu.nvidia.com",
                                pool_name="node-a",
                                device_name="gpu-1-mig-19-4-1",
                            ),
                            pb.ClaimResource(
                                driver_name="other.example.com", pool_name="p", device_name="gpu-3"
                            ),
                        ],
                    )
                ],
            )
        ],
    )
    entries = podresources_entries([pod], dra_resolver(INV))
    assert [
        (e.source, e.claim_name, e.claim_namespace, e.driver, e.pool, e.device, e.device_ids) for e in entries
    ] == [
        (AllocSource.DRA, "gpu-claim", "serve", "gpu.nvidia.com", "node-a", "gpu-3", (G0,)),
        (AllocSource.DRA, "gpu-claim", "serve", "gpu.nvidia.com", "node-a", "gpu-1-mig-19-4-1", (M1,)),
        (AllocSource.DRA, "gpu-claim", "serve", "other.example.com", "p", "gpu-3", ()),
    ]
    assert all(e.namespace == "serve" and e.pod == "infer" and e.container == "main" for e in entries)


def test_dra_device_name_forms() -> None:
    assert resolve_dra_device("gpu-3", INV) == (G0,)
    assert resolve_dra_device("gpu-1", INV) == (G1,)
    assert resolve_dra_device("gpu-7", INV) == ()
    assert resolve_dra_device("gpu-1-mig-19-4-1", INV) == (M1,)  # v25.3: profileId-start-size
    assert resolve_dra_device("gpu-1-mig-2g47gb-14-0", INV) == (M2,)  # v25.12: profile-profileId-start
    assert resolve_dra_device("gpu-1-mig-1g10gb-19-4", INV) == (M1,)
    assert resolve_dra_device("gpu-1-mig-1g10gb-19-5", INV) == ()
    assert resolve_dra_device("gpu-vfio-0", INV) == ()


def test_allocatable_keeps_gpu_resources_once() -> None:
    devs = [
        devices("nvidia.com/gpu", G0 + "::0", G0 + "::1"),
        devices("nvidia.com/gpu", G0 + "::0"),
        devices("example.com/nic", "x"),
    ]
    assert allocatable_devices(devs) == (("nvidia.com/gpu", G0 + "::0"), ("nvidia.com/gpu", G0 + "::1"))


def test_sort_is_canonical() -> None:
    a = AllocationEntry(AllocSource.PODRESOURCES, "c", "nvidia.com/gpu", (G0,), namespace="b", pod="p")
    b = AllocationEntry(AllocSource.CHECKPOINT, "c", "nvidia.com/gpu", (G0,), pod_uid=UID)
    c = AllocationEntry(AllocSource.PODRESOURCES, "c", "nvidia.com/gpu", (G1,), namespace="a", pod="p")
    assert sort_entries([a, b, c]) == sort_entries([c, a, b]) == (b, c, a)


def test_checkpoint_source_states(tmp_path: Path) -> None:
    path = tmp_path / "kubelet_internal_checkpoint"
    src = CheckpointSource(str(path))
    entries, health = src.read()
    assert entries == () and health.state == "absent"

    cp = [
        CheckpointEntry(UID, "cuda", "nvidia.com/gpu", (G0 + "::2",), numa={"0": (G0 + "::2",)}),
        CheckpointEntry(UID, "cuda", "example.com/nic", ("x",)),
    ]
    for fmt in ("v2", "v1"):
        path.write_bytes(render_checkpoint(cp, {"nvidia.com/gpu": [G0 + "::2"]}, format=fmt))  # type: ignore[arg-type]
        entries, health = src.read()
        assert health.state == "ok" and fmt in health.detail
        assert entries == (
            AllocationEntry(AllocSource.CHECKPOINT, "cuda", "nvidia.com/gpu", (G0 + "::2",), pod_uid=UID),
        )

    path.write_bytes(b'{"Data": {"PodDeviceEntries": [')
    entries, health = src.read()
    assert entries == () and health.state == "corrupt"

    good = render_checkpoint(cp, {}).decode()
    path.write_text(good.replace(G0 + "::2", G1 + "::2"))  # edited behind the kubelet's back
    entries, health = src.read()
    assert entries == () and health.state == "corrupt" and "checksum" in health.detail


def test_checkpoint_is_parsed_only_when_the_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "cp"
    path.write_bytes(render_checkpoint([], {}))
    src = CheckpointSource(str(path))
    for _ in range(3):
        assert src.read()[1].state == "ok"
    assert src.parses == 1


def test_a_rewrite_with_the_same_stat_identity_is_read_once_the_file_settled(tmp_path: Path) -> None:
    # The kubelet renames each write into place (two inodes in turn), and a file system with coarse
    # timestamps gives writes within one tick the same mtime: a newer file can look like the one read.
    path = tmp_path / "cp"
    a, b = (render_checkpoint([CheckpointEntry(UID, "cuda", "nvidia.com/gpu", (d,))], {})
            for d in (G0 + "::2", G1 + "::9"))
    assert len(a) == len(b)  # (the checksums' digits included)
    path.write_bytes(a)
    now = [time.time_ns()]
    src = CheckpointSource(str(path), now_ns=lambda: now[0])
    assert src.read()[0][0].device_ids == (G0 + "::2",)
    st = os.stat(path)
    path.write_bytes(b)  # in place: the same inode and size ...
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # ... and the same mtime
    assert not src.changed() and src.read()[0][0].device_ids == (G0 + "::2",)  # no way to tell yet
    now[0] += RACY_NS  # the file has settled: any later write would have a later mtime
    assert src.changed()
    assert src.read()[0][0].device_ids == (G1 + "::9",) and src.parses == 2
    assert not src.changed() and src.read()[0][0].device_ids == (G1 + "::9",) and src.parses == 2


def test_a_settled_file_is_trusted_by_its_stat_identity(tmp_path: Path) -> None:
    path = tmp_path / "cp"
    path.write_bytes(render_checkpoint([], {}))
    src = CheckpointSource(str(path), now_ns=lambda: time.time_ns() + RACY_NS)  # written long ago
    for _ in range(3):
        assert not src.changed() or src.parses == 0
        assert src.read()[1].state == "ok"
    assert src.parses == 1
