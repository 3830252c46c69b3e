"""DRA admin access (corpus/kube/dra-admin-access.yaml, as GPU Operator v26.7's DRA stack creates it): the
monitoring pods' claims get every GPU of the node with adminAccess, beside the workloads' ordinary claims.
Admin access never makes a holder or takes a share: the GPU shows those pods as monitors only."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from periscope.core.model import (
    AllocationEntry,
    AllocSource,
    Finding,
    GpuState,
    Meta,
    Owner,
    PodAttribution,
    PodEvent,
)
from services.api import access, render
from services.kube_watcher import mappers
from tests.unit.core_builders import NODE, alloc, dev, gpu, inventory, proc, run, tel

DOC = yaml.safe_load((Path(__file__).parent / "data/corpus/kube/dra-admin-access.yaml").read_text())
CLAIMS = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in DOC["items"]
          if o["kind"] == "ResourceClaim"}  # fmt: skip
PODS = {o["metadata"]["name"]: o for o in DOC["items"] if o["kind"] == "Pod"}
EXPORTER, DCGM, TRAIN = "nvidia-dcgm-exporter-dra-5kq2x", "nvidia-dcgm-dra-w9h3c", "train-1"
S = 1000


def test_the_namespace_is_the_one_kubernetes_lets_create_admin_claims() -> None:
    [ns] = [o for o in DOC["items"] if o["kind"] == "Namespace"]
    assert ns["metadata"]["labels"]["resource.kubernetes.io/admin-access"] == "true"


def test_admin_access_is_read_from_the_result_or_else_the_request() -> None:
    exporter = mappers.pod_info(PODS[EXPORTER], CLAIMS)
    dcgm = mappers.pod_info(PODS[DCGM], CLAIMS)  # v1beta1, the result does not echo it
    train = mappers.pod_info(PODS[TRAIN], CLAIMS)
    assert [(d.device, d.admin_access) for d in exporter.claim_devices] == [("gpu-0", True), ("gpu-1", True)]
    assert [(d.device, d.admin_access) for d in dcgm.claim_devices] == [("gpu-0", True), ("gpu-1", True)]
    assert [(d.device, d.admin_access) for d in train.claim_devices] == [("gpu-0", False)]


def pod_event(name: str, t: int, seq: int) -> PodEvent:
    # The scenario runs on a clock of its own: the pods exist from its start.
    info = replace(mappers.pod_info(PODS[name], CLAIMS), created_ms=t, node=NODE)
    return PodEvent(Meta(NODE, "kube_watcher", 1, seq, t), info)


def dra(name: str, container: str, claim: str, device: str, uuid: str) -> AllocationEntry:
    ns = PODS[name]["metadata"]["namespace"]
    return AllocationEntry(AllocSource.DRA, container, "gpu.nvidia.com", (uuid,), namespace=ns, pod=name,
                           claim_name=claim, claim_namespace=ns, driver="gpu.nvidia.com", pool="gpu-node-1",
                           device=device)  # fmt: skip


def scenario() -> list[Any]:
    g0, g1 = gpu(0), gpu(1)
    ex_claim = "nvidia-dcgm-exporter-dra-5kq2x-admin-gpus-r7m4t"
    dcgm_claim = "nvidia-dcgm-dra-w9h3c-admin-gpus-b2n8v"
    entries = [
        dra(EXPORTER, "nvidia-dcgm-exporter-dra", ex_claim, "gpu-0", g0),
        dra(EXPORTER, "nvidia-dcgm-exporter-dra", ex_claim, "gpu-1", g1),
        dra(DCGM, "nvidia-dcgm-ctr", dcgm_claim, "gpu-0", g0),
        dra(DCGM, "nvidia-dcgm-ctr", dcgm_claim, "gpu-1", g1),
        dra(TRAIN, "trainer", "train-1-gpu-q8z5n", "gpu-0", g0),
    ]
    train_uid = PODS[TRAIN]["metadata"]["uid"]
    dcgm_uid = PODS[DCGM]["metadata"]["uid"]
    return [
        inventory(), pod_event(EXPORTER, 0, 1), pod_event(DCGM, 0, 2), pod_event(TRAIN, 0, 3),
        alloc(1 * S, *entries),
        # The trainer works on gpu-0; DCGM's hostengine shows up as a process on both GPUs.
        tel(2 * S, dev(g0, 80.0, fb=30000.0, power=250.0,
                       procs=(proc(50, train_uid, 80.0, 29000.0), proc(60, dcgm_uid, 0.0, 200.0))),
            dev(g1, 0.0, fb=200.0, power=60.0, procs=(proc(61, dcgm_uid, 0.0, 200.0),), index=1)),
    ]  # fmt: skip


def test_an_exclusive_gpu_stays_exclusive_beside_monitoring_claims() -> None:
    _, outs = run(scenario())
    train_uid = PODS[TRAIN]["metadata"]["uid"]
    [row] = [o for o in outs if isinstance(o, PodAttribution) and o.pod_uid == train_uid][-1].rows
    assert (row.gpu_uuid, row.sharing, row.share_basis) == (gpu(0), "exclusive", "exclusive")
    assert (row.util_pct, row.fb_used_mib, row.power_w, row.gpu_fraction) == (80.0, 30000.0, 250.0, 1.0)
    # Monitoring pods are no pod rows at all.
    monitors = {PODS[n]["metadata"]["uid"] for n in (EXPORTER, DCGM)}
    assert not [o for o in outs if isinstance(o, PodAttribution) and o.pod_uid in monitors]


def test_the_gpu_shows_monitors_apart_from_owners() -> None:
    _, outs = run(scenario())
    g0 = [o for o in outs if isinstance(o, GpuState) and o.gpu_uuid == gpu(0)][-1]
    g1 = [o for o in outs if isinstance(o, GpuState) and o.gpu_uuid == gpu(1)][-1]
    assert [o.pod for o in g0.owners] == [TRAIN] and g0.sharing == "exclusive"
    assert sorted(o.pod for o in g0.monitors) == [DCGM, EXPORTER]
    assert g1.owners == () and sorted(o.pod for o in g1.monitors) == [DCGM, EXPORTER]
    # The hostengine's own process on the GPUs it monitors is not unattributed usage.
    assert not [o for o in outs if isinstance(o, Finding) and o.kind == "unattributed-usage"]


def test_monitors_on_the_wire_and_behind_access_control() -> None:
    _, outs = run(scenario())
    g0 = [o for o in outs if isinstance(o, GpuState) and o.gpu_uuid == gpu(0)][-1]
    row = render.gpu_row(g0)
    assert sorted(m["pod"] for m in row["monitors"]) == [DCGM, EXPORTER] and row["hidden_owners"] == 0
    scoped = access.gpu_row(row, access.Scope(cluster=False, namespaces=frozenset({"ml"})))
    assert scoped["monitors"] == [] and [o["pod"] for o in scoped["owners"]] == [TRAIN]
    assert scoped["hidden_owners"] == 0  # a monitor holds nothing: it is not a hidden owner
    assert isinstance(g0.monitors[0], Owner)
