"""MIG profiles as NVML names them and DRA MIG devices as the NVIDIA DRA driver names them
(corpus/devices/mig-profiles.yaml names its sources): Blackwell's -me, +me, +me.all and +gfx profiles and
split compute instances take their names from NVML's profile tables, and a DRA MIG name resolves by
(parent minor, GI profile ID, placement start), never by its text. Without the privilege NVML asks for,
the placement is unknown, and the probe says so."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from periscope.sim.nvml import fake_pynvml, write_nvml_state
from services.probe.allocations import resolve_dra_device
from services.probe.mig_profiles import PRIVILEGE_FIX, profile_name
from services.probe.nvml import NvmlBackend, NvmlInventory
from tests.unit.nvml_driver import NO_PERMISSION, Dev, Driver, real_pynvml

CORPUS = Path(__file__).parent / "data" / "corpus" / "devices"
DOC: dict[str, Any] = yaml.safe_load((CORPUS / "mig-profiles.yaml").read_text())


def inventory(tmp_path: Path, state: dict[str, Any] | None = None) -> tuple[NvmlBackend, NvmlInventory]:
    path = tmp_path / "nvml.json"
    write_nvml_state(path, state or {"gpus": DOC["gpus"]})
    nv = NvmlBackend(fake_pynvml(path))
    nv.open()
    try:
        return nv, nv.refresh()
    finally:
        nv.close()


def test_profile_names_are_nvmls_own(tmp_path: Path) -> None:
    _, inv = inventory(tmp_path)
    got = [[m.profile for m in g.mig_devices] for g in inv.gpus]
    assert got == [[m["profile"] for m in g["mig"]] for g in DOC["gpus"]]
    assert got[0] == ["2g.48gb-me", "1g.24gb+gfx", "1g.24gb+me.all"]
    assert got[2] == ["1c.3g.40gb", "1c.3g.40gb"]  # split GPU instance: the compute instance's profile
    assert inv.placement_denied == ""


@pytest.mark.parametrize("case", DOC["dra"], ids=lambda c: c["device"])
def test_dra_mig_names_resolve_by_parent_profile_id_and_placement(
    tmp_path: Path, case: dict[str, str]
) -> None:
    _, inv = inventory(tmp_path)
    want = (case["uuid"],) if "uuid" in case else ()
    assert resolve_dra_device(case["device"], inv) == want


def test_without_privilege_the_placement_is_unknown_and_the_probe_says_why(tmp_path: Path) -> None:
    state = copy.deepcopy({"gpus": DOC["gpus"]})
    for g in state["gpus"]:
        g["fail"] = {"nvmlDeviceGetGpuInstanceById": "NoPermission"}  # NVML: "Requires privileged user"
    nv, inv = inventory(tmp_path, state)
    assert "requires privileged user" in inv.placement_denied
    assert all(p.profile_id is None and p.start is None for p in inv.placements)
    # Names still come from the MIG device's own name; DRA names cannot be resolved.
    assert [m.profile for m in inv.gpus[1].mig_devices] == ["1g.24gb+me", "1g.24gb-me"]
    assert resolve_dra_device("gpu-1-mig-1g24gb-me-21-0", inv) == ()
    health = nv.mig_health()
    assert health is not None and (health.source, health.state) == ("mig", "unavailable")
    assert PRIVILEGE_FIX in health.detail and "requires privileged user" in health.detail


def test_a_node_without_mig_reports_no_mig_health(tmp_path: Path) -> None:
    nv, _ = inventory(tmp_path, {"gpus": [{"uuid": "GPU-a"}]})
    assert nv.mig_health() is None


def test_nvml_profile_names_drop_the_mig_prefix() -> None:
    assert profile_name(b"MIG 1g.24gb+me.all") == "1g.24gb+me.all"
    assert profile_name(b"MIG 1c.3g.40gb\x00\x00") == "1c.3g.40gb"
    assert profile_name("4g.96gb+gfx") == "4g.96gb+gfx"


def test_the_real_wrappers_deliver_the_names_the_tables_hold() -> None:
    """Through nvidia-ml-py's own v2 structs (the driver double answers the C calls)."""
    gfx = Dev("MIG-gfx", name="NVIDIA RTX PRO 6000 Blackwell Server Edition MIG 1g.24gb", gi=3,
              profile_id=47, placement=(2, 1), gi_profile=(0xA, "MIG 1g.24gb+gfx", 1),
              ci_profile=(0, 0, "MIG 1g.24gb+gfx", 1))  # fmt: skip
    split = Dev("MIG-split", name="NVIDIA A100-SXM4-80GB MIG 3g.40gb", gi=2, ci=1, profile_id=9,
                placement=(4, 4), gi_profile=(2, "MIG 3g.40gb", 3), ci_profile=(0, 0, "MIG 1c.3g.40gb", 1))
    gpus = [Dev("GPU-b", mig_mode=1, migs=[gfx]), Dev("GPU-a", minor=1, mig_mode=1, migs=[split])]
    driver = Driver(gpus, missing=("nvmlDeviceGetGpuInstanceProfileInfoByIdV",))  # an older driver: scan
    backend = NvmlBackend(real_pynvml(driver))
    backend.open()
    inv = backend.refresh()
    assert [m.profile for g in inv.gpus for m in g.mig_devices] == ["1g.24gb+gfx", "1c.3g.40gb"]
    assert [(p.profile_id, p.start) for p in inv.placements] == [(47, 2), (9, 4)]
    assert {"nvmlDeviceGetGpuInstanceProfileInfoV", "nvmlGpuInstanceGetComputeInstanceProfileInfoV",
            "nvmlComputeInstanceGetInfo_v2"} <= set(driver.calls)  # fmt: skip
    denied = Driver([Dev("GPU-c", mig_mode=1, migs=[copy.copy(gfx)],
                         errors={"nvmlDeviceGetGpuInstanceById": NO_PERMISSION})])  # fmt: skip
    backend = NvmlBackend(real_pynvml(denied))
    backend.open()
    assert "Insufficient Permissions" in backend.refresh().placement_denied
