"""Golden tests over apiserver objects in the shapes real clusters serve (corpus/kube/*.yaml, each headed
by the source it follows): ClusterPolicy CRs as the GPU Operator chart renders them with their status,
operand DaemonSets as the operator names and labels them, DRA ResourceClaims (resource.k8s.io/v1,
v1beta1, v1beta2) with the pods that use them, and GFD-labelled nodes; read by the watcher's mappers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from periscope.core.attribution import REPLICAS_LABEL, SHARING_LABEL
from periscope.core.cgroup import parse_cgroup
from periscope.core.model import ClaimDevice, Meta, OperandStatus
from periscope.core.policy import policy_view
from services.kube_watcher import mappers

KUBE = Path(__file__).parent / "data" / "corpus" / "kube"
META = Meta(node="", source="test", epoch=1, seq=1, time_ms=0)


def load(name: str) -> Any:
    return yaml.safe_load((KUBE / name).read_text())


def items(name: str) -> list[dict[str, Any]]:
    doc = load(name)
    assert doc["kind"] == "List"
    return list(doc["items"])


@pytest.mark.parametrize("path", sorted(KUBE.glob("*.yaml")), ids=lambda p: p.name)
def test_every_artifact_names_its_source(path: Path) -> None:
    head = path.read_text().splitlines()[0]
    assert head.startswith("# source: ") and len(head) > 40


def policy(cp: str, operands: str, namespace: str = "gpu-operator") -> Any:
    return mappers.policy_event(
        META,
        crd="installed",
        policies=[load(cp)],
        daemonsets=items(operands),
        namespace=namespace,
        dra_available=False,
    )


def test_chart_rendered_cluster_policy_ready() -> None:
    ev = policy("clusterpolicy-ready.yaml", "operands-default.yaml")
    assert (ev.name, ev.state, ev.namespace, ev.detail) == ("cluster-policy", "ready", "gpu-operator", "")
    assert dict(ev.components) == {
        "ccManager": False, "cdi": True, "daemonsets": None, "dcgm": False, "dcgmExporter": True,
        "devicePlugin": True, "driver": True, "gds": False, "gdrcopy": False, "gfd": True, "hostPaths": None,
        "kataManager": False, "mig": None, "migManager": True, "nodeStatusExporter": False, "operator": None,
        "psa": False, "sandboxDevicePlugin": True, "sandboxWorkloads": False, "toolkit": True,
        "validator": None, "vfioManager": True, "vgpuDeviceManager": True, "vgpuManager": False,
    }  # fmt: skip
    ops = {o.name: o for o in ev.operands}
    # The kernel-suffixed driver DaemonSet is the driver operand, not an unknown DaemonSet.
    assert ops["nvidia-driver-daemonset"] == OperandStatus("nvidia-driver-daemonset", "driver", True, 2, 2, 2)
    assert "nvidia-driver-daemonset-5.15.0-105-generic-ubuntu22.04" not in ops
    assert ops["nvidia-dcgm-exporter"] == OperandStatus("nvidia-dcgm-exporter", "dcgmExporter", True, 2, 1, 1)
    assert ops["nvidia-device-plugin-mps-control-daemon"] == OperandStatus(
        "nvidia-device-plugin-mps-control-daemon", "devicePlugin", True, 0, 0, 0
    )
    nfd = ops["gpu-operator-node-feature-discovery-worker"]
    assert nfd.present and nfd.component == ""
    view = {c.name: c.status for c in policy_view(ev).components}
    assert view == {
        "driver": "ok", "toolkit": "ok", "devicePlugin": "ok", "gfd": "ok", "dcgmExporter": "degraded",
        "dcgm": "disabled-as-intended", "validator": "ok", "migManager": "ok",
        "nodeStatusExporter": "disabled-as-intended",
    }  # fmt: skip


def test_cluster_policy_not_ready_carries_the_operators_error_condition() -> None:
    ev = policy("clusterpolicy-notready.yaml", "operands-default.yaml", namespace="gpu-operator")
    assert (ev.name, ev.state, ev.namespace) == ("gpu-cluster-policy", "notReady", "nvidia-gpu-operator")
    assert ev.detail == "OperandNotReady: ClusterPolicy is not ready, states not ready: [state-driver]"
    assert dict(ev.components)["nodeStatusExporter"] is True
    view = {c.name: c.status for c in policy_view(ev).components}
    assert view["nodeStatusExporter"] == "missing" and view["dcgm"] == "missing"


def test_driver_from_nvidiadriver_crs_is_summed_over_node_pools() -> None:
    ev = policy("clusterpolicy-ready.yaml", "operands-nvidiadriver-crd.yaml")
    ops = {o.name: o for o in ev.operands}
    assert ops["nvidia-driver-daemonset"] == OperandStatus("nvidia-driver-daemonset", "driver", True, 4, 3, 3)
    assert not any(name.startswith("nvidia-gpu-driver-") for name in ops)
    view = {c.name: c.status for c in policy_view(ev).components}
    assert view["driver"] == "degraded" and view["toolkit"] == "missing"


def test_a_cluster_policy_that_leaves_enabled_unset_means_the_operators_defaults() -> None:
    cp, *daemonsets = items("clusterpolicy-unset.yaml")
    ev = mappers.policy_event(META, crd="installed", policies=[cp], daemonsets=daemonsets,
                              namespace="gpu-operator", dra_available=False)  # fmt: skip
    assert all(enabled is None for _, enabled in ev.components)
    view = {c.name: (c.intended, c.status) for c in policy_view(ev).components}
    assert view == {
        "driver": ("default", "ok"), "toolkit": ("default", "ok"), "devicePlugin": ("default", "ok"),
        "gfd": ("default", "ok"), "dcgmExporter": ("default", "ok"),
        "dcgm": ("default", "ok"),  # IsEnabled(): nil is enabled; not "unexpected"
        "validator": ("default", "ok"), "migManager": ("default", "ok"),
        "nodeStatusExporter": ("default", "disabled-as-intended"),
    }  # fmt: skip


def gpucluster(cr: dict[str, Any] | None = None, policies: list[dict[str, Any]] | None = None) -> Any:
    found, *daemonsets = items("gpucluster-dra-stack.yaml")
    return mappers.policy_event(
        META, crd="installed", policies=policies or [], daemonsets=daemonsets, namespace="gpu-operator",
        dra_available=True, gpuclusters=[cr or found], gpucluster_crd="installed",
    )  # fmt: skip


def test_a_gpucluster_is_the_intent_when_no_cluster_policy_exists() -> None:
    ev = gpucluster()
    assert (ev.kind, ev.name, ev.state) == ("GPUCluster", "gpu-cluster", "notReady")
    assert ev.namespace == "gpu-operator"
    assert ev.detail == "OperandNotReady: Waiting for operand pods to be ready"
    view = policy_view(ev)
    assert view.cluster_policy is None and view.gpu_cluster == ("gpu-cluster", "notReady")
    got = {c.name: (c.daemonset, c.intended, c.desired, c.ready, c.status) for c in view.components}
    assert got == {
        "draDriver": ("nvidia-dra-driver-kubelet-plugin", "default", 3, 3, "ok"),  # no switch: always
        "dcgm": ("nvidia-dcgm-dra", "disabled", 0, 0, "disabled-as-intended"),
        "dcgmExporter": ("nvidia-dcgm-exporter-dra", "enabled", 3, 2, "degraded"),
        "validator": ("nvidia-dra-validator", "default", 3, 3, "ok"),
    }  # fmt: skip
    doc = view.to_json()
    assert doc["gpu_cluster"] == {"name": "gpu-cluster", "state": "notReady"}
    assert doc["cluster_policy"] is None
    assert doc["gpu_cluster_crd"] == "installed"


def test_gpucluster_defaults_are_its_controllers_not_the_cluster_policys() -> None:
    cr, *_ = items("gpucluster-dra-stack.yaml")
    spec = {k: v for k, v in cr["spec"].items() if k not in ("dcgm", "dcgmExporter")}
    view = {c.name: c.status for c in policy_view(gpucluster({**cr, "spec": spec})).components}
    # dcgmExporter absent: off (its pods run anyway: unexpected); dcgm absent: off, unlike ClusterPolicy's.
    assert (view["dcgmExporter"], view["dcgm"]) == ("unexpected", "disabled-as-intended")
    unset = {**spec, "dcgm": {"version": "4.5.2-1-ubuntu22.04"}, "dcgmExporter": {"version": "4.5.1"}}
    view = {c.name: c.status for c in policy_view(gpucluster({**cr, "spec": unset})).components}
    assert (view["dcgmExporter"], view["dcgm"]) == ("degraded", "disabled-as-intended")


def test_with_both_crs_the_cluster_policy_is_in_force_and_the_detail_says_so() -> None:
    ev = gpucluster(policies=[load("clusterpolicy-ready.yaml")])
    assert (ev.kind, ev.name) == ("ClusterPolicy", "cluster-policy")
    assert ev.detail == (
        "GPUCluster gpu-cluster exists beside the ClusterPolicy; the operator reconciles only the latter"
    )


@pytest.mark.parametrize(("pod", "runtime"), [
    ("train-c", "containerd"), ("train-o", "crio"), ("train-d", "docker"), ("train-p", ""),
])  # fmt: skip
def test_the_runtime_comes_from_the_container_id_scheme(pod: str, runtime: str) -> None:
    obj = next(p for p in items("pods-container-ids.yaml") if p["metadata"]["name"] == pod)
    [c] = mappers.pod_info(obj).containers
    assert c.runtime == runtime
    assert c.container_id == (obj["status"]["containerStatuses"][0].get("containerID", "").split("://")[-1])


def test_a_cgroupfs_path_alone_cannot_tell_containerd_from_cri_dockerd() -> None:
    cid = "2b4d747eae5ed34775c069d913c81833b67a0148e731a36535c9f3b97ebfb87f"
    path = parse_cgroup(f"0::/kubepods/besteffort/pod1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d/{cid}\n")
    assert (path.container_id, path.runtime, path.driver) == (cid, "unknown", "cgroupfs")
    # Two pods with that very path shape, on containerd and on cri-dockerd: the watcher knows which.
    runtimes = {p["metadata"]["name"]: mappers.pod_info(p).containers[0].runtime
                for p in items("pods-container-ids.yaml")}  # fmt: skip
    assert (runtimes["train-c"], runtimes["train-d"]) == ("containerd", "docker")


CLAIMS = {
    (c["metadata"]["namespace"], c["metadata"]["name"]): c for c in items("dra-claims.yaml")
}  # fmt: skip
PODS = {p["metadata"]["name"]: p for p in items("dra-pods.yaml")}


def dev(claim: str, request: str, pool: str, device: str, share: str = "") -> ClaimDevice:
    return ClaimDevice(claim, request, "gpu.nvidia.com", pool, device, share)


SHARE = "3f1a9c2e-7b4d-4e8f-a6c1-2d9e8f7a6b5c"
MIG_SMALL = dev("shared-mig", "mig/small", "gpu-node-2", "gpu-0-mig-1g10gb-19-6", SHARE)
TRAIN = "train-0-gpu-x7k2q"


DRA_GOLDEN = {
    "train-0": (
        ("train-0-gpu-x7k2q",),
        (dev(TRAIN, "gpu", "gpu-node-1", "gpu-0"), dev(TRAIN, "gpu", "gpu-node-1", "gpu-1")),
    ),
    "infer-a": (
        ("shared-mig",),
        (MIG_SMALL,),
    ),
    # v1beta1
    "notebook": (("notebook-gpu-4m9zt",), (dev("notebook-gpu-4m9zt", "gpu", "gpu-node-3", "gpu-3"),)),
    "batch-7": (("batch-7-gpu-p2w8d",), (dev("batch-7-gpu-p2w8d", "gpu", "gpu-node-3", "gpu-2"),)),  # v1beta2
    "legacy-gpu-pod": (
        ("legacy-gpu-pod-extended-resources-5qv7c",),
        (dev("legacy-gpu-pod-extended-resources-5qv7c", "container-0-request-0", "gpu-node-1", "gpu-3"),),
    ),
    # 1.26-1.30: spec.resourceClaims[].source.resourceClaimName
    "old-dra": (
        ("shared-mig",),
        (MIG_SMALL,),
    ),
    "waiting": (("pending-gpu-m2c4x",), ()),  # generated, not yet allocated
}  # fmt: skip


@pytest.mark.parametrize("name", list(DRA_GOLDEN))
def test_dra_claims_resolve_to_devices(name: str) -> None:
    pod = PODS[name]
    names, devices = DRA_GOLDEN[name]
    assert mappers.pod_claim_names(pod) == names
    assert mappers.wants_gpu(pod)
    info = mappers.pod_info(pod, CLAIMS)
    assert info.claim_devices == devices
    assert info.uid == pod["metadata"]["uid"]


def test_pod_claim_statuses_and_container_claims() -> None:
    info = mappers.pod_info(PODS["train-0"], CLAIMS)
    assert [(s.name, s.resource_claim_name) for s in info.claim_statuses] == [("gpu", "train-0-gpu-x7k2q")]
    assert info.containers[0].claims == ("gpu",)
    assert (
        info.containers[0].container_id == "5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d2e3f4a5b6c"
    )


def test_claim_api_versions_share_the_results_shape() -> None:
    versions = {c["apiVersion"] for c in CLAIMS.values()}
    assert versions == {"resource.k8s.io/v1", "resource.k8s.io/v1beta1", "resource.k8s.io/v1beta2"}
    assert mappers.claim_devices(CLAIMS[("ml", "pending-gpu-m2c4x")]) == ()


NODES = {n["metadata"]["name"]: n for n in items("nodes-gfd.yaml")}


@pytest.mark.parametrize(
    ("name", "sharing", "replicas", "gpus", "ready"),
    [
        ("gpu-node-ts", "time-slicing", "4", "16", True),
        ("gpu-node-mps", "mps", "10", "10", True),
        ("gpu-node-mig", "none", "1", "0", False),
    ],
)
def test_gfd_labelled_nodes(name: str, sharing: str, replicas: str, gpus: str, ready: bool) -> None:
    node = NODES[name]
    ev = mappers.node_event(node, META)
    assert mappers.is_gpu_node(node)
    assert (ev.label(SHARING_LABEL), ev.label(REPLICAS_LABEL)) == (sharing, replicas)
    assert dict(ev.capacity)["nvidia.com/gpu"] == gpus and ev.ready is ready
    assert ev.unschedulable is (name == "gpu-node-mig")


def test_gfd_deploy_labels_count_as_intent() -> None:
    ev = policy("clusterpolicy-ready.yaml", "operands-default.yaml")
    nodes = [mappers.node_event(n, META) for n in NODES.values()]
    exporter = next(c for c in policy_view(ev, nodes).components if c.name == "dcgmExporter")
    assert (exporter.nodes_on, exporter.nodes_off) == (1, 1)
    assert dict(nodes[2].capacity)["nvidia.com/mig-1g.10gb"] == "7"
