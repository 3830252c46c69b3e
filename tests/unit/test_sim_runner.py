"""What the simulator serves, read back with the project's real parsers and mappers: checkpoint files,
/proc cgroups, NVML state, and the apiserver objects the watcher maps."""

from __future__ import annotations

from pathlib import Path

import pytest

from periscope.core.cgroup import parse_cgroup
from periscope.core.model import Meta
from periscope.core.policy import policy_view
from periscope.kubelet.checkpoint import CheckpointError, parse_checkpoint
from periscope.sim.cluster.kube_objects import (
    cluster_policy_object,
    daemonset_objects,
    node_object,
    pod_object,
)
from periscope.sim.cluster.model import ClusterModel
from periscope.sim.cluster.node import NodeSim, node_paths
from periscope.sim.nvml import read_nvml_state
from periscope.sim.scenario import load_scenario
from services.kube_watcher import mappers

META = Meta(node="gpu-c", source="test", epoch=1, seq=1, time_ms=0)


@pytest.fixture(scope="module")
def demo() -> ClusterModel:
    return ClusterModel(load_scenario("demo"))


def node_sim(model: ClusterModel, tmp: Path, name: str) -> NodeSim:
    index = [n.name for n in model.scenario.nodes].index(name)
    return NodeSim(model, name, index, node_paths(tmp, name))


def test_checkpoint_keeps_ended_pods_until_the_next_admission(demo: ClusterModel, tmp_path: Path) -> None:
    sim = node_sim(demo, tmp_path, "gpu-c")
    sim.apply(0)
    cp = parse_checkpoint(sim.paths.checkpoint.read_bytes())
    assert cp.format == "v2" and cp.checksum_ok is True
    old = next(p for p in demo.alive(0, "gpu-c") if p.name == "api-6d4f8b7c9-7xk2m")
    assert {e.pod_uid for e in cp.entries} == {p.uid for p in demo.alive(0, "gpu-c")}
    entry = next(e for e in cp.entries if e.pod_uid == old.uid)
    assert entry.device_ids == old.containers[0].device_ids and entry.numa == {"0": entry.device_ids}
    assert entry.alloc is not None and entry.alloc["envs"]["NVIDIA_VISIBLE_DEVICES"] == entry.device_ids[0]
    assert cp.registered == {"nvidia.com/gpu": tuple(g.uuid for g in demo.gpus["gpu-c"])}
    sim.apply(49_000)
    started, stopped = sim.apply(50_000)  # the rollout: old pod gone, new pod (same name) admitted
    assert [p.uid for p in stopped] == [old.uid] and len(started) == 1 and started[0].uid != old.uid
    uids = {e.pod_uid for e in parse_checkpoint(sim.paths.checkpoint.read_bytes()).entries}
    assert old.uid not in uids and started[0].uid in uids


def test_checkpoint_formats_and_corruption(demo: ClusterModel, tmp_path: Path) -> None:
    sim = node_sim(demo, tmp_path, "gpu-b")  # checkpoint: v1
    sim.apply(0)
    assert parse_checkpoint(sim.paths.checkpoint.read_bytes()).format == "v1"
    sim.corrupt_checkpoint(5_000, 3_000)
    with pytest.raises(CheckpointError):
        parse_checkpoint(sim.paths.checkpoint.read_bytes())
    sim.apply(6_000)
    with pytest.raises(CheckpointError):
        parse_checkpoint(sim.paths.checkpoint.read_bytes())
    sim.apply(8_000)  # the kubelet's next write repairs it
    assert parse_checkpoint(sim.paths.checkpoint.read_bytes()).checksum_ok is True


def test_proc_tree_maps_every_gpu_process_to_its_pod(demo: ClusterModel, tmp_path: Path) -> None:
    sim = node_sim(demo, tmp_path, "gpu-b")
    sim.apply(10_000)
    for pod in demo.alive(10_000, "gpu-b"):
        for c in pod.containers:
            for pid in c.pids:
                info = parse_cgroup((sim.paths.proc_root / str(pid) / "cgroup").read_text())
                assert (info.pod_uid, info.container_id) == (pod.uid, c.container_id)
                assert info.runtime == sim.runtime and info.version == 1  # a v1-era node
    sim.apply(120_000 - 1000)
    gone = [
        pid
        for p in demo.pods
        if p.node == "gpu-b" and not p.alive_at(119_000)
        for c in p.containers
        for pid in c.pids
    ]
    assert all(not (sim.paths.proc_root / str(pid)).exists() for pid in gone)


def test_nvml_state_matches_the_model(demo: ClusterModel, tmp_path: Path) -> None:
    sim = node_sim(demo, tmp_path, "gpu-a")
    sim.add_xid(0, 94, 2)
    sim.apply(0)
    state = read_nvml_state(sim.paths.nvml_state)
    mig_gpu, whole = state["gpus"]
    assert "util_pct" not in mig_gpu and [m["profile"] for m in mig_gpu["mig"]] == [
        "3g.40gb",
        "2g.20gb",
        "1g.10gb",
        "1g.10gb",
    ]
    assert mig_gpu["mig"][0]["memory_used_mib"] == 36000 and len(mig_gpu["mig"][0]["processes"]) == 2
    assert whole["util_pct"] == 70 and whole["processes"][0]["sm_util"] == 70
    assert state["xids"] == [{"seq": 1, "gpu": mig_gpu["uuid"], "code": 94, "gi": 3, "ci": 0}]


def test_pod_objects_map_to_the_scenario_pods(demo: ClusterModel) -> None:
    pod = next(p for p in demo.pods if p.name == "infer-a-7d9f8c6b5-m8k2p")
    obj = pod_object(pod, 1_700_000_000_000, runtime="crio")
    info = mappers.pod_info(obj)
    assert (info.uid, info.namespace, info.name, info.node) == (pod.uid, "web", pod.name, "gpu-b")
    assert (info.owner_kind, info.owner_name) == ("ReplicaSet", "infer-a-7d9f8c6b5")
    assert info.created_ms == 1_700_000_000_000 and info.qos == "Burstable" and info.phase == "Running"
    assert info.containers[0].container_id == pod.containers[0].container_id
    assert obj["status"]["containerStatuses"][0]["containerID"].startswith("cri-o://")
    assert info.containers[0].limits == (("nvidia.com/gpu", "1"),)
    gone = mappers.pod_info(pod_object(pod, 1_700_000_000_000, 1_700_000_050_000))
    assert gone.deletion_ms == 1_700_000_050_000


def test_node_labels_and_capacity(demo: ClusterModel) -> None:
    labels = node_object(demo, "gpu-b")["metadata"]["labels"]
    assert (
        labels["nvidia.com/gpu.present"] == "true" and labels["nvidia.com/gpu.product"] == "Tesla-T4-SHARED"
    )
    assert (
        labels["nvidia.com/gpu.replicas"] == "4"
        and labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    )
    a = node_object(demo, "gpu-a")
    assert a["metadata"]["labels"]["nvidia.com/mig.strategy"] == "mixed"
    assert a["metadata"]["labels"]["nvidia.com/mig-1g.10gb.count"] == "2"
    assert (
        a["status"]["capacity"]["nvidia.com/mig-1g.10gb"] == "2"
        and a["status"]["capacity"]["nvidia.com/gpu"] == "1"
    )
    event = mappers.node_event(a, META)
    assert mappers.is_gpu_node(a) and event.ready


def test_policy_objects_give_the_expected_statuses(demo: ClusterModel) -> None:
    policy = mappers.policy_event(
        META,
        crd="installed",
        policies=[cluster_policy_object(demo) or {}],
        daemonsets=daemonset_objects(demo),
        namespace="gpu-operator",
        dra_available=False,
    )
    nodes = [mappers.node_event(node_object(demo, n.name), META) for n in demo.scenario.nodes]
    got = {c.name: c.status for c in policy_view(policy, nodes).components}
    assert got["dcgmExporter"] == "disabled-as-intended"
    assert got["devicePlugin"] == "degraded"
    assert got["driver"] == got["gfd"] == got["migManager"] == got["toolkit"] == got["validator"] == "ok"
