"""Doctor's NVML checks over the real nvidia-ml-py module's errors and constants, with only the driver
calls replaced: per-process utilization (NotSupported, NotFound = no sample yet, other errors), compute
mode without an MPS daemon, and the process scan that finds the daemon by its kernel-cut comm name."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest

from periscope.core.model import GpuInfo
from periscope.sim.procfs import FakeProcfs
from services.probe.doctor_nvml import _mps_check, _process_util_check
from services.probe.nvml import NvmlInventory

pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")


def module(**calls: Any) -> types.ModuleType:
    """The real pynvml module's names, with the driver calls given here."""
    m = types.ModuleType("pynvml")
    m.__dict__.update({k: v for k, v in vars(pynvml).items() if k.startswith(("NVML", "nvmlEventType"))})
    m.__dict__.update(nvmlDeviceGetHandleByIndex=lambda i: i, **calls)
    return m


INV = NvmlInventory(
    gpus=(
        GpuInfo("GPU-a", 0, "NVIDIA L4"),
        GpuInfo("GPU-b", 1, "NVIDIA L4"),
        GpuInfo("GPU-c", 2, "NVIDIA L4"),
        GpuInfo("GPU-d", 3, "NVIDIA A100", mig_enabled=True),
    )
)


def test_process_utilization_errors_are_told_apart() -> None:
    codes = {
        0: pynvml.NVML_ERROR_NOT_SUPPORTED,
        1: pynvml.NVML_ERROR_NOT_FOUND,
        2: pynvml.NVML_ERROR_GPU_NOT_FOUND,
    }

    def util(handle: int, last_seen: int) -> list[Any]:
        raise pynvml.NVMLError(codes[handle])

    check = _process_util_check(module(nvmlDeviceGetProcessUtilization=util), INV)
    assert check.status == "warn"
    # NotFound: no sample newer than 0 yet, the call works; GpuNotFound is a failure, not "no sample".
    head, failed, tail = check.detail.split("; ")
    assert (head, tail) == ("not supported on GPUs 0", "supported on GPUs 1") and failed.startswith("GPU 2: ")


def test_mig_only_node_has_no_per_process_utilization_to_check() -> None:
    inv = NvmlInventory(gpus=(GpuInfo("GPU-d", 0, mig_enabled=True),))
    assert _process_util_check(module(), inv).status == "ok"


def test_exclusive_process_without_a_daemon_warns(tmp_path: Path) -> None:
    procfs = FakeProcfs(tmp_path)
    procfs.add_host_process(700, comm="nvidia-persiste")
    nv = module(nvmlDeviceGetComputeMode=lambda h: pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
    check = _mps_check(nv, INV, str(tmp_path))
    assert check.status == "warn" and check.detail.startswith("GPUs 0, 1, 2, 3 are EXCLUSIVE_PROCESS")
    procfs.add_host_process(701, comm="nvidia-cuda-mps")  # the kernel cuts comm to 15 characters
    check = _mps_check(nv, INV, str(tmp_path))
    assert check.status == "ok" and "nvidia-cuda-mps (pid 701)" in check.detail


def test_compute_mode_call_missing_is_reported_not_raised(tmp_path: Path) -> None:
    check = _mps_check(module(), INV, str(tmp_path))
    assert (check.status, check.detail) == ("ok", "MPS not in use; compute mode not reported")
