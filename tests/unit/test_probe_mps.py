"""MPS on the probe's side, against the fake NVML: the clients come from the MPS list, the server from
the compute list is recognised by name and dropped, and per-process utilization may be missing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from periscope.sim.nvml import fake_pynvml, write_nvml_state
from periscope.sim.procfs import FakeProcfs
from services.probe.nvml import NvmlBackend
from services.probe.procfs import ProcMapper

GPU = "GPU-11111111-2222-3333-4444-555555555555"
SERVER = 77


def mps_state(utilization: str = "clients") -> dict[str, Any]:
    return {
        "gpus": [
            {
                "uuid": GPU,
                "memory_total_mib": 23034,
                "util_pct": 60,
                "mps": {"server_pid": SERVER, "server_used_mib": 30, "utilization": utilization},
                "processes": [
                    {"pid": 30, "used_mib": 3000, "sm_util": 45, "mem_util": 10},
                    {"pid": 31, "used_mib": 1000, "sm_util": 15, "mem_util": 4},
                ],
                "graphics_processes": [{"pid": 31, "used_mib": None}],
            }
        ]
    }


def backend(tmp_path: Path, state: dict[str, Any], **kw: Any) -> NvmlBackend:
    path = tmp_path / "nvml.json"
    write_nvml_state(path, state)
    b = NvmlBackend(fake_pynvml(path), **kw)
    b.open()
    b.refresh()
    return b


def test_the_fake_lists_mps_clients_and_server_as_a_real_driver_does(tmp_path: Path) -> None:
    nv = backend(tmp_path, mps_state()).nvml
    h = nv.nvmlDeviceGetHandleByIndex(0)
    assert [p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(h)] == [SERVER]
    assert [p.pid for p in nv.nvmlDeviceGetMPSComputeRunningProcesses(h)] == [30, 31]
    assert nv.nvmlDeviceGetComputeMode(h) == nv.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    assert nv.nvmlSystemGetProcessName(SERVER) == "nvidia-cuda-mps-server"


def test_clients_are_sampled_and_the_server_is_not_a_consumer(tmp_path: Path) -> None:
    b = backend(tmp_path, mps_state())
    (d,) = b.sample()
    procs = {p.pid: p for p in d.processes}
    assert set(procs) == {30, 31}  # 31 is in the MPS and graphics lists: one entry
    assert (procs[30].sm_util_pct, procs[30].used_mib) == (45.0, 3000.0)
    assert (procs[31].sm_util_pct, procs[31].used_mib) == (15.0, 1000.0)  # the known memory wins
    assert b.mps_servers[GPU] == (SERVER,) and d.error == ""


@pytest.mark.parametrize("utilization", ["server", "none"])
def test_client_util_is_unknown_when_the_driver_does_not_give_it(tmp_path: Path, utilization: str) -> None:
    (d,) = backend(tmp_path, mps_state(utilization)).sample()
    assert {(p.pid, p.sm_util_pct, p.used_mib) for p in d.processes} == {
        (30, None, 3000.0),
        (31, None, 1000.0),
    }


def test_without_mps_the_compute_list_is_the_clients(tmp_path: Path) -> None:
    s = mps_state()
    del s["gpus"][0]["mps"]
    b = backend(tmp_path, s)
    nv = b.nvml
    h = nv.nvmlDeviceGetHandleByIndex(0)
    assert nv.nvmlDeviceGetMPSComputeRunningProcesses(h) == []
    assert nv.nvmlDeviceGetComputeMode(h) == nv.NVML_COMPUTEMODE_DEFAULT
    (d,) = b.sample()
    assert {p.pid for p in d.processes} == {30, 31} and b.mps_servers[GPU] == ()


def test_the_server_is_recognised_by_its_truncated_proc_comm(tmp_path: Path) -> None:
    procfs = FakeProcfs(tmp_path / "proc")
    procfs.add_host_process(SERVER, comm="nvidia-cuda-mps-server")
    mapper = ProcMapper(str(tmp_path / "proc"))
    assert mapper.comm(SERVER) == "nvidia-cuda-mps"  # the kernel keeps 15 characters
    assert mapper.comm(12345) is None

    def no_permission(pid: int) -> str:
        raise nv.NVMLError_NoPermission(nv.NVML_ERROR_NO_PERMISSION)

    for proc_name, seen in ((mapper.comm, {30, 31}), (None, {30, 31, SERVER})):
        b = backend(tmp_path, mps_state(), proc_name=proc_name)
        nv = b.nvml
        nv.nvmlSystemGetProcessName = no_permission  # NVML cannot name the PID: /proc must
        (d,) = b.sample()
        assert {p.pid for p in d.processes} == seen
