"""`periscope doctor` proves a host PID namespace only with host-only evidence (corpus/procfs-hostpid.yaml
names its sources): every PID namespace has a PID 1, so the kubelet or a container runtime must be
visible, or PID 1 must be no container's. And on MIG, NVML's refusal to show GPU-instance placement is a
warning that names the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from periscope.core.model import GpuInfo, MigDeviceInfo
from services.probe.doctor_nvml import _hostpid_check, _mig_check
from services.probe.nvml import NvmlInventory

CASES: list[dict[str, Any]] = yaml.safe_load(
    (Path(__file__).parent / "data" / "corpus" / "procfs-hostpid.yaml").read_text()
)["cases"]


def test_the_artifact_names_its_source() -> None:
    head = (Path(__file__).parent / "data" / "corpus" / "procfs-hostpid.yaml").read_text().splitlines()[0]
    assert head.startswith("# source: ") and len(head) > 40


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_hostpid_needs_host_only_evidence(tmp_path: Path, case: dict[str, Any]) -> None:
    for entry, files in case["proc"].items():
        d = tmp_path / entry
        d.mkdir()
        (d / "comm").write_text(files["comm"] + "\n")
        (d / "cgroup").write_text(files["cgroup"])
    check = _hostpid_check(tmp_path, set())
    assert check.status == case["want"], check.detail
    if case["want"] == "warn":
        assert "hostPID: true" in check.fix and "every PID namespace has a PID 1" in check.detail
    else:
        assert case["mentions"] in check.detail


def test_mig_placement_nvml_refuses_is_a_warning_naming_the_fix() -> None:
    mig = MigDeviceInfo("MIG-1", "1g.24gb", 1, 0)
    gpus = (GpuInfo("GPU-a", 0, "NVIDIA RTX PRO 6000 Blackwell Server Edition", mig_enabled=True,
                    mig_devices=(mig,)),)  # fmt: skip
    assert _mig_check(NvmlInventory(gpus)).status == "ok"
    denied = NvmlInventory(gpus, placement_denied="nvmlDeviceGetGpuInstanceById: Insufficient Permissions "
                                                  "(requires privileged user)")  # fmt: skip
    check = _mig_check(denied)
    assert check.status == "warn" and "requires privileged user" in check.detail
    assert "NVIDIA_MIG_MONITOR_DEVICES=all" in check.fix and "privileged" in check.fix
