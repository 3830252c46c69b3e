"""The simulated MPS node as the probe and the watcher read it: the device plugin's daemon pod, its
server process in /proc and in the compute list, the clients only in the MPS list."""

from __future__ import annotations

from pathlib import Path

import pytest

from periscope.core.cgroup import parse_cgroup
from periscope.core.mps import is_mps_daemon
from periscope.sim.cluster.kube_objects import mps_daemon_pod_object
from periscope.sim.cluster.model import ClusterModel, mps_daemon
from periscope.sim.cluster.node import NodeSim, node_paths
from periscope.sim.nvml import fake_pynvml
from periscope.sim.scenario import load_scenario
from services.kube_watcher import mappers
from services.probe.nvml import NvmlBackend
from services.probe.procfs import ProcMapper

T = 10_000


@pytest.fixture(scope="module")
def churn() -> ClusterModel:
    return ClusterModel(load_scenario("churn"))


def started(model: ClusterModel, tmp: Path, name: str) -> NodeSim:
    index = [n.name for n in model.scenario.nodes].index(name)
    sim = NodeSim(model, name, index, node_paths(tmp, name))
    sim.write_host_processes()  # what start() writes besides serving the kubelet socket
    sim.apply(T)
    return sim


def test_only_mps_nodes_run_the_daemon(churn: ClusterModel) -> None:
    assert mps_daemon(churn, "churn-a") is None
    d = mps_daemon(churn, "churn-b")
    assert d is not None and d.name.startswith("nvidia-device-plugin-mps-control-daemon-")


def test_the_daemon_pod_maps_to_a_recognised_mps_daemon(churn: ClusterModel) -> None:
    d = mps_daemon(churn, "churn-b")
    assert d is not None
    obj = mps_daemon_pod_object(d, 0, "containerd")
    assert not mappers.wants_gpu(obj) and mappers.is_gpu_pod(obj, {"churn-b"})  # tracked: on a GPU node
    info = mappers.pod_info(obj)
    assert (info.uid, info.owner_kind) == (d.uid, "DaemonSet") and is_mps_daemon(info)


def test_the_server_is_in_proc_and_the_compute_list_the_clients_only_in_the_mps_list(
    churn: ClusterModel, tmp_path: Path
) -> None:
    sim = started(churn, tmp_path, "churn-b")
    d = sim.mps
    assert d is not None
    base = sim.paths.proc_root / str(d.server_pid)
    assert (base / "comm").read_text() == "nvidia-cuda-mps\n"
    cg = parse_cgroup((base / "cgroup").read_text())
    assert (cg.pod_uid, cg.container_id) == (d.uid, d.container_id)

    nv = fake_pynvml(sim.paths.nvml_state)
    nv.nvmlInit()
    clients = {
        pid
        for p in churn.alive(T, "churn-b")
        for c in p.containers
        if c.device_ids and c.device_ids[0].startswith(churn.gpus["churn-b"][0].uuid)
        for pid in c.pids
    }
    assert clients
    h = nv.nvmlDeviceGetHandleByIndex(0)
    assert [p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(h)] == [d.server_pid]
    assert {p.pid for p in nv.nvmlDeviceGetMPSComputeRunningProcesses(h)} == clients
    assert nv.nvmlDeviceGetComputeMode(h) == nv.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS

    backend = NvmlBackend(nv, proc_name=ProcMapper(str(sim.paths.proc_root)).comm)
    backend.refresh()
    by_uuid = {s.uuid: s for s in backend.sample()}
    g0 = by_uuid[churn.gpus["churn-b"][0].uuid]
    assert {p.pid for p in g0.processes} == clients
    assert backend.mps_servers[g0.uuid] == (d.server_pid,)
