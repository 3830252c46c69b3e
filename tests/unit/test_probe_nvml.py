"""NVML backend and XID watcher against the pynvml stand-in, and the stand-in against real pynvml."""

from __future__ import annotations

import inspect
import os
import threading
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest

import periscope.sim.nvml.state as nvml_state
from periscope.sim.nvml import FakePynvml, add_xid, fake_pynvml, write_nvml_state
from services.probe.nvml import NvmlBackend, NvmlUnavailable
from services.probe.procfs import NOT_IN_POD, ProcIdentity
from services.probe.xid import RawXid, XidWatcher

GPU0 = "GPU-11111111-2222-3333-4444-555555555555"
GPU1 = "GPU-66666666-7777-8888-9999-000000000000"
MIG_A = "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
MIG_B = "MIG-ffffffff-0000-1111-2222-333333333333"


def state() -> dict[str, Any]:
    return {
        "driver_version": "550.54.15",
        "cuda_driver_version": 12040,
        "gpus": [
            {
                "uuid": GPU0,
                "name": "NVIDIA H100 80GB HBM3",
                "minor": 4,
                "pci_bus_id": "00000000:1B:00.0",
                "memory_total_mib": 81559,
                "memory_used_mib": 2048,
                "util_pct": 70,
                "mem_util_pct": 30,
                "power_w": 312.5,
                "temp_c": 61,
                "processes": [
                    {"pid": 10, "used_mib": 1024, "sm_util": 40, "mem_util": 10},
                    {"pid": 11, "used_mib": None},
                ],
            },
            {
                "uuid": GPU1,
                "name": "NVIDIA A100-SXM4-80GB",
                "minor": 2,
                "memory_total_mib": 81920,
                "power_w": 90,
                "temp_c": 40,
                "mig": [
                    {
                        "uuid": MIG_A,
                        "profile": "3g.40gb",
                        "gi": 2,
                        "ci": 0,
                        "profile_id": 9,
                        "placement_start": 4,
                        "placement_size": 4,
                        "memory_total_mib": 40192,
                        "memory_used_mib": 300,
                        "processes": [{"pid": 20, "used_mib": 300}],
                    },
                    {
                        "uuid": MIG_B,
                        "profile": "1g.10gb",
                        "gi": 9,
                        "ci": 0,
                        "profile_id": 19,
                        "placement_start": 0,
                        "placement_size": 1,
                        "memory_total_mib": 9856,
                        "memory_used_mib": 0,
                        "processes": [],
                    },
                ],
            },
        ],
    }


@pytest.fixture
def nv(tmp_path: Path) -> FakePynvml:
    path = tmp_path / "nvml.json"
    write_nvml_state(path, state())
    return fake_pynvml(path)


def opened(nv: FakePynvml) -> NvmlBackend:
    backend = NvmlBackend(nv)
    backend.open()
    backend.refresh()
    return backend


def test_inventory_lists_gpus_and_mig_layout(nv: FakePynvml) -> None:
    inv = opened(nv).inventory
    assert inv.driver_version == "550.54.15" and inv.cuda_driver_version == "12.4"
    g0, g1 = inv.gpus
    assert (g0.uuid, g0.index, g0.minor, g0.model, g0.pci_bus_id) == (
        GPU0,
        0,
        4,
        "NVIDIA H100 80GB HBM3",
        "00000000:1B:00.0",
    )
    assert g0.memory_mib == 81559 and not g0.mig_enabled and g0.mig_devices == ()
    assert g1.mig_enabled
    assert [(m.uuid, m.profile, m.gi, m.ci, m.memory_mib) for m in g1.mig_devices] == [
        (MIG_A, "3g.40gb", 2, 0, 40192),
        (MIG_B, "1g.10gb", 9, 0, 9856),
    ]
    assert [(p.uuid, p.parent_minor, p.profile_id, p.start, p.size) for p in inv.placements] == [
        (MIG_A, 2, 9, 4, 4),
        (MIG_B, 2, 19, 0, 1),
    ]
    ref = inv.mig_ref(GPU1, 9, 0)
    assert ref is not None and ref.uuid == MIG_B and ref.profile == "1g.10gb"


def test_sample_reads_every_device_and_mig_util_is_null(nv: FakePynvml) -> None:
    devices = {d.uuid: d for d in opened(nv).sample()}
    assert set(devices) == {GPU0, GPU1, MIG_A, MIG_B}
    g0 = devices[GPU0]
    assert (g0.util_pct, g0.mem_util_pct, g0.fb_used_mib, g0.fb_total_mib, g0.power_w, g0.temp_c) == (
        70.0,
        30.0,
        2048.0,
        81559.0,
        312.5,
        61.0,
    )
    procs = {p.pid: p for p in g0.processes}
    assert procs[10].sm_util_pct == 40.0 and procs[10].used_mib == 1024.0
    assert procs[11].used_mib is None and procs[11].sm_util_pct == 0.0  # no sample: not active
    g1 = devices[GPU1]
    assert g1.util_pct is None and g1.processes == () and g1.fb_used_mib == 300.0
    mig = devices[MIG_A]
    assert mig.parent_uuid == GPU1 and mig.mig is not None and mig.mig.gi == 2 and mig.index == 1
    assert mig.util_pct is None and mig.power_w is None
    assert [(p.pid, p.used_mib, p.sm_util_pct) for p in mig.processes] == [(20, 300.0, None)]


def test_process_utilization_only_reads_newer_samples(nv: FakePynvml) -> None:
    backend = opened(nv)
    backend.sample()
    first = backend._last_seen[GPU0]
    time.sleep(0.002)
    backend.sample()
    assert backend._last_seen[GPU0] > first


def test_lost_gpu_and_failing_metric_do_not_stop_the_others(tmp_path: Path) -> None:
    path = tmp_path / "nvml.json"
    s = state()
    write_nvml_state(path, s)
    backend = opened(fake_pynvml(path))
    s["gpus"][1]["lost"] = True
    s["gpus"][0]["fail"] = {"nvmlDeviceGetPowerUsage": "Unknown", "nvmlDeviceGetTemperature": "NotSupported"}
    write_nvml_state(path, s)
    devices = {d.uuid: d for d in backend.sample()}
    assert devices[GPU1].lost and devices[MIG_A].lost and devices[MIG_B].lost
    g0 = devices[GPU0]
    assert not g0.lost and g0.util_pct == 70.0 and g0.power_w is None and g0.temp_c is None
    assert "nvmlDeviceGetPowerUsage" in g0.error and "Temperature" not in g0.error  # NotSupported is normal


def test_each_state_written_gets_a_later_mtime_than_the_last(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # The fake's reader tells states apart by (inode, mtime, size): a rename alternates two inodes, the
    # same size is common (util 70 -> 80), and a coarse kernel clock stamps writes within one tick alike.
    monkeypatch.setattr(nvml_state.time, "time_ns", lambda: 1_800_000_000_000_000_000)  # a clock that stood
    path = tmp_path / "nvml.json"
    s = state()
    write_nvml_state(path, s)
    backend = opened(fake_pynvml(path))
    assert {d.uuid: d.util_pct for d in backend.sample()}[GPU0] == 70.0
    s["gpus"][0]["util_pct"] = 80
    write_nvml_state(path, s)
    write_nvml_state(path, s)
    assert os.stat(path).st_mtime_ns == 1_800_000_000_000_000_002
    assert {d.uuid: d.util_pct for d in backend.sample()}[GPU0] == 80.0


def test_inventory_marks_a_lost_gpu(tmp_path: Path) -> None:
    path = tmp_path / "nvml.json"
    s = state()
    write_nvml_state(path, s)
    backend = opened(fake_pynvml(path))
    s["gpus"][1]["lost"] = True
    write_nvml_state(path, s)
    g0, g1 = backend.refresh().gpus
    assert not g0.lost and g1.lost and g1.uuid == GPU1


def test_open_fails_cleanly_without_a_driver(tmp_path: Path) -> None:
    with pytest.raises(NvmlUnavailable):
        NvmlBackend(fake_pynvml(tmp_path / "missing.json")).open()


def test_xid_watcher_delivers_each_new_xid_once(tmp_path: Path) -> None:
    path = tmp_path / "nvml.json"
    s = state()
    add_xid(s, GPU0, 13)  # before registration: never delivered
    write_nvml_state(path, s)
    nv = fake_pynvml(path)
    backend = opened(nv)
    got: list[RawXid] = []
    done = threading.Event()

    def on_xid(x: RawXid) -> None:
        got.append(x)
        if len(got) == 2:
            done.set()

    watcher = XidWatcher(nv, on_xid, wait_ms=50)
    watcher.start(backend.handles())
    try:
        assert set(watcher.registered) == {GPU0, GPU1}
        add_xid(s, GPU0, 79)
        add_xid(s, GPU1, 31, gi=9, ci=0)
        write_nvml_state(path, s)
        assert done.wait(5)
        time.sleep(0.2)
    finally:
        watcher.stop()
    assert got == [RawXid(GPU0, 79, None, None), RawXid(GPU1, 31, 9, 0)]
    assert not watcher.alive


def test_fake_matches_the_real_pynvml_api() -> None:
    fake_names = [n for n, _ in inspect.getmembers(FakePynvml, inspect.isfunction) if n.startswith("nvml")]
    assert len(fake_names) > 25
    for name in fake_names:
        real = getattr(pynvml, name)
        fake = getattr(FakePynvml, name)
        real_params = list(inspect.signature(real).parameters)
        assert list(inspect.signature(fake).parameters)[1:] == real_params, name
    for name in dir(pynvml):
        if name.startswith("NVMLError_"):
            real_cls = getattr(pynvml, name)
            fake_cls = getattr(FakePynvml("x"), name)
            assert fake_cls(0).value == real_cls(0).value, name
    for const in (
        "NVML_TEMPERATURE_GPU",
        "NVML_DEVICE_MIG_ENABLE",
        "nvmlEventTypeXidCriticalError",
        "NVML_ERROR_GPU_IS_LOST",
        "NVML_ERROR_NOT_SUPPORTED",
        "nvmlMemory_v2",
    ):
        assert getattr(FakePynvml("x"), const) == getattr(pynvml, const), const


def test_nvml_error_maps_codes_to_subclasses(nv: FakePynvml) -> None:
    err = nv.NVMLError(15)
    assert isinstance(err, nv.NVMLError_GpuIsLost) and isinstance(err, nv.NVMLError) and err.value == 15
    with pytest.raises(nv.NVMLError_Uninitialized):
        nv.nvmlDeviceGetCount()


def test_identify_labels_processes_as_they_are_built(nv: FakePynvml) -> None:
    looked_up: list[int] = []

    def identify(pid: int) -> ProcIdentity | None:
        looked_up.append(pid)
        return {10: ProcIdentity("uid-a", "cid-a", "burstable"), 20: NOT_IN_POD}.get(pid)

    backend = NvmlBackend(nv, identify=identify)
    backend.open()
    backend.refresh()
    procs = {p.pid: p for d in backend.sample() for p in d.processes}
    assert sorted(looked_up) == [10, 11, 20]  # GPU and MIG processes alike, each once
    assert (procs[10].pod_uid, procs[10].container_id, procs[10].qos) == ("uid-a", "cid-a", "burstable")
    assert procs[10].sm_util_pct == 40.0 and procs[10].used_mib == 1024.0
    assert (procs[11].pod_uid, procs[20].pod_uid) == ("", "")  # gone (None) / not in a pod
