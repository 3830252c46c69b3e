"""Kubelet device IDs of other device plugins, held to the shapes their sources publish (corpus/devices/*.yaml
and corpus/checkpoints/hami-vgpu.json name their sources): GKE's `nvidia<minor>` IDs resolve by device
minor, never by NVML index; HAMi's `GPU-<uuid>-<n>` slots resolve to the card their AllocResp gave the
container; an ID no known GPU stands for is a row that says so, and a `device-ids` health finding."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from periscope.core.allocation import reconcile
from periscope.core.devices import DeviceMap
from periscope.core.engine import holdings_at
from periscope.core.model import (
    DeviceInventory,
    Finding,
    GpuInfo,
    MigDeviceInfo,
    Output,
    PodAttribution,
)
from periscope.core.pods import PodRegistry
from periscope.sim.nvml import fake_pynvml, write_nvml_state
from services.probe.checkpoint_source import CheckpointSource
from services.probe.nvml import NvmlBackend
from tests.unit.core_builders import alloc, dev, meta, pod, pr, proc, run, tel, uid

CORPUS = Path(__file__).parent / "data" / "corpus"
GKE: dict[str, Any] = yaml.safe_load((CORPUS / "devices" / "gke-minors.yaml").read_text())
S = 1000


@pytest.mark.parametrize("path", sorted((CORPUS / "devices").glob("*.yaml")), ids=lambda p: p.name)
def test_every_artifact_names_its_source(path: Path) -> None:
    head = path.read_text().splitlines()[0]
    assert head.startswith("# source: ") and len(head) > 40


def gke_inventory(t: int = 0, minors: bool = True) -> DeviceInventory:
    gpus = tuple(
        GpuInfo(
            uuid=g["uuid"], index=g["index"], model="NVIDIA A100-SXM4-40GB", memory_mib=40960.0,
            minor=g["minor"] if minors else None, mig_enabled=bool(g.get("mig")),
            mig_devices=tuple(MigDeviceInfo(m["uuid"], m["profile"], m["gi"], m["ci"], 10240.0)
                              for m in g.get("mig", ())),
        )
        for g in GKE["inventory"]
    )
    return DeviceInventory(meta=meta(t, seq=0), gpus=gpus)


def uuid_at(index: int) -> str:
    return str(next(g["uuid"] for g in GKE["inventory"] if g["index"] == index))


@pytest.mark.parametrize("case", GKE["resolve"], ids=lambda c: c["id"])
def test_gke_ids_resolve_by_device_minor_not_by_index(case: dict[str, Any]) -> None:
    r = DeviceMap.from_inventory(gke_inventory()).resolve(case["id"])
    if "unresolved" in case:
        assert (r.gpu_uuid, r.mig) == ("", None)
        assert case["unresolved"] in r.unresolved
        return
    assert r.gpu_uuid == uuid_at(case["gpu_index"]) and not r.unresolved
    assert (r.mig.uuid if r.mig else None) == case.get("mig")
    assert r.replica == case.get("replica")


def test_a_gpu_whose_minor_nvml_cannot_tell_is_never_matched_by_its_index() -> None:
    r = DeviceMap.from_inventory(gke_inventory(minors=False)).resolve("nvidia0")
    assert r.gpu_uuid == ""
    assert r.unresolved == (
        "no GPU with device minor 0 in the node's NVML inventory (3 GPUs did not report their minor)"
    )


def test_the_probe_reports_an_unreadable_minor_as_unknown_not_as_the_index(tmp_path: Path) -> None:
    state = tmp_path / "nvml.json"
    write_nvml_state(state, {"gpus": [
        {"uuid": uuid_at(0), "minor": 2},
        {"uuid": uuid_at(1), "fail": {"nvmlDeviceGetMinorNumber": "NotSupported"}},
    ]})  # fmt: skip
    nv = NvmlBackend(fake_pynvml(state))
    nv.open()
    try:
        minors = [g.minor for g in nv.refresh().gpus]
    finally:
        nv.close()
    assert minors == [2, None]


def last(outs: list[Output], kind: type[Any], key: str) -> Any:
    return [o for o in outs if isinstance(o, kind) and (getattr(o, "pod_uid", None) == key or
                                                        getattr(o, "id", None) == key)][-1]


def test_a_gke_pod_gets_the_usage_of_the_gpu_its_minor_names() -> None:
    on_minor0, on_index0 = uuid_at(2), uuid_at(0)
    _, outs = run([
        gke_inventory(), pod(1, "train-0", 0),
        alloc(1 * S, pr("ml", "train-0", ("nvidia0",))),
        tel(2 * S, dev(on_index0, 3.0), dev(on_minor0, 71.0, procs=(proc(7, uid(1), 71.0, 900.0),), index=2)),
    ])
    [row] = last(outs, PodAttribution, uid(1)).rows
    assert (row.device_id, row.gpu_uuid, row.util_pct, row.unresolved) == ("nvidia0", on_minor0, 71.0, "")


def test_an_unknown_minor_is_an_unresolved_row_and_a_health_finding_never_a_guess() -> None:
    _, outs = run([
        gke_inventory(), pod(1, "train-0", 0),
        alloc(1 * S, pr("ml", "train-0", ("nvidia1",))),
        tel(2 * S, dev(uuid_at(0), 50.0), dev(uuid_at(1), 50.0, index=1), dev(uuid_at(2), 50.0, index=2)),
    ])
    [row] = last(outs, PodAttribution, uid(1)).rows
    assert (row.device_id, row.gpu_uuid, row.util_pct, row.share_basis) == ("nvidia1", "", None, "none")
    assert "no GPU with device minor 1" in row.unresolved
    health: Finding = last(outs, Finding, "source-health/gpu-a/device-ids")
    assert health.active
    assert health.message.startswith("device-ids error: 1 held device IDs unresolved: nvidia1")


def test_a_row_unresolved_before_the_inventory_resolves_once_it_arrives() -> None:
    state, outs = run([
        pod(1, "train-0", 0),
        alloc(1 * S, pr("ml", "train-0", ("nvidia0",))),
        tel(2 * S, dev(uuid_at(2), 40.0, index=2)),
        tel(4 * S, dev(uuid_at(2), 40.0, index=2)),  # releases the first sample, taken before the inventory
        gke_inventory(10 * S),
        tel(11 * S, dev(uuid_at(2), 40.0, index=2)),
    ])
    rows = [o.rows[0] for o in outs if isinstance(o, PodAttribution)]
    assert rows[0].unresolved == "no NVML inventory from the node's probe yet"
    assert (rows[-1].gpu_uuid, rows[-1].unresolved, rows[-1].util_pct) == (uuid_at(2), "", 40.0)
    cleared = [o for o in outs if isinstance(o, Finding) and o.id == "source-health/gpu-a/device-ids"]
    assert [f.active for f in cleared] == [True, False]
    assert holdings_at(state, 11 * S)[0].device.gpu_uuid == uuid_at(2)


# ---- HAMi


HAMI = CORPUS / "checkpoints" / "hami-vgpu.json"
CARD_A = "GPU-bf1f4cb8-a9b1-4945-bab3-e4fa624ff2a2"
CARD_B = "GPU-d6a0340b-786d-447b-aa78-c8a1dd8a7613"
INFER, NOTEBOOK = "6d1f0c2b-8a3e-4f5d-9b7c-1e2d3c4b5a69", "7e2a1d3c-9b4f-4a6e-8c8d-2f3e4d5c6b7a"


def hami_inventory() -> DeviceInventory:
    return DeviceInventory(meta=meta(0, seq=0), gpus=(
        GpuInfo(CARD_A, 0, "NVIDIA A10", 23028.0, minor=0),
        GpuInfo(CARD_B, 1, "NVIDIA A10", 23028.0, minor=1),
    ))  # fmt: skip


def hami_pods(registry: PodRegistry) -> PodRegistry:
    for n, (u, name, ctr) in enumerate(((INFER, "infer-0", "infer"), (NOTEBOOK, "nb-0", "notebook")), 1):
        ev = pod(n, name, 0, containers=(ctr,))
        registry.apply(type(ev)(ev.meta, type(ev.pod)(**{**{f: getattr(ev.pod, f) for f in ev.pod.__slots__},
                                                           "uid": u})))
    return registry


def test_the_probe_keeps_what_the_hami_allocresp_gave_each_container() -> None:
    entries, health = CheckpointSource(str(HAMI)).read()
    assert health.state == "ok"
    assert {(e.pod_uid, e.device_ids, e.visible_devices) for e in entries} == {
        (INFER, (f"{CARD_A}-3",), (CARD_B,)),
        (NOTEBOOK, (f"{CARD_B}-1",), (CARD_B,)),
    }


def test_hami_slots_resolve_to_the_card_the_container_got_and_share_it() -> None:
    entries, _ = CheckpointSource(str(HAMI)).read()
    snap = alloc(1 * S, *entries, pr("ml", "infer-0", (f"{CARD_A}-3",), container="infer"),
                 pr("ml", "nb-0", (f"{CARD_B}-1",), container="notebook"))
    held = reconcile(snap, hami_pods(PodRegistry()), DeviceMap.from_inventory(hami_inventory()), 1 * S)
    assert {(h.pod_uid, h.device.device_id, h.device.gpu_uuid, h.device.replica) for h in held} == {
        (INFER, f"{CARD_A}-3", CARD_B, 3),
        (NOTEBOOK, f"{CARD_B}-1", CARD_B, 1),
    }
    assert all(h.sources == ("checkpoint", "podresources") for h in held)


def test_hami_pods_on_one_card_split_its_usage_as_time_slicing_does() -> None:
    entries, _ = CheckpointSource(str(HAMI)).read()
    events = [hami_inventory()]
    reg = hami_pods(PodRegistry())
    events += [type(pod(1, "x", 0))(meta(0, seq=n, source="kube_watcher"), reg.pods[u].info)
               for n, u in enumerate((INFER, NOTEBOOK), 1)]
    events += [
        alloc(1 * S, *entries, pr("ml", "infer-0", (f"{CARD_A}-3",), container="infer"),
              pr("ml", "nb-0", (f"{CARD_B}-1",), container="notebook")),
        tel(2 * S, dev(CARD_A, 0.0), dev(CARD_B, 60.0, fb=6000.0, procs=(
            proc(11, INFER, 45.0, 4000.0), proc(12, NOTEBOOK, 15.0, 2000.0)), index=1)),
    ]
    _, outs = run(events)
    [infer] = last(outs, PodAttribution, INFER).rows
    [nb] = last(outs, PodAttribution, NOTEBOOK).rows
    assert (infer.gpu_uuid, infer.sharing, infer.share_basis, infer.util_pct, infer.fb_used_mib) == (
        CARD_B, "time-slicing", "process", 45.0, 4000.0)
    assert (nb.gpu_uuid, nb.util_pct, nb.fb_used_mib) == (CARD_B, 15.0, 2000.0)


def test_without_the_checkpoint_a_hami_slot_names_its_own_card() -> None:
    snap = alloc(1 * S, pr("ml", "infer-0", (f"{CARD_A}-3",), container="infer"))
    [h] = reconcile(snap, hami_pods(PodRegistry()), DeviceMap.from_inventory(hami_inventory()), 1 * S)
    assert (h.device.gpu_uuid, h.device.replica) == (CARD_A, 3)
