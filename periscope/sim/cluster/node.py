"""One simulated node as its consumers see it on disk and on its socket.

A NodeSim owns the node's FakeKubelet (PodResources gRPC on its own unix socket), the device-manager
checkpoint file (v2, v1 or none, including the torn writes of a checkpoint-corrupt fault), the /proc
tree with one process per container PID (plus nvidia-persistenced and, on an MPS node, the MPS server
in its daemon pod's cgroup), and the fake NVML state file with memory, utilisation, MIG instances, the
MPS server and XIDs. `apply(t)` brings all of them to scenario time t from the cluster model; NodePaths
names where each lives under the simulator's work directory, so the orchestrator can point each
node's probe at them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, cast

from periscope.core.cgroup import Driver, Qos, Runtime
from periscope.kubelet.checkpoint import CheckpointEntry, render_checkpoint
from periscope.sim.cluster.hardware import DRIVER_VERSION, mig_capable
from periscope.sim.cluster.model import ClusterModel, ContainerModel, GpuUsage, MigUsage, PodModel, mps_daemon
from periscope.sim.dcgm import FakeDcgmExporter
from periscope.sim.kubelet import FakeContainer, FakeDevices, FakeKubelet, FakePod
from periscope.sim.nvml import add_xid, write_nvml_state
from periscope.sim.procfs import FakeProcfs, atomic_write

_RUNTIMES: tuple[Runtime, ...] = ("containerd", "crio", "containerd")
MPS_SERVER_COMM = "nvidia-cuda-mps-server"
MPS_SERVER_USED_MIB = 30.0  # the MPS server's own context on each GPU
MEM_PER_SM = 0.4  # memory-controller busy as a share of SM busy


@dataclass(frozen=True, slots=True)
class NodePaths:
    kubelet_root: Path
    socket: Path
    checkpoint: Path
    proc_root: Path
    nvml_state: Path

    def to_json(self) -> dict[str, str]:
        return {k: str(v) for k, v in asdict(self).items()}


def node_paths(workdir: Path, node: str) -> NodePaths:
    root = workdir / "nodes" / node
    kubelet = root / "kubelet"
    return NodePaths(
        kubelet_root=kubelet,
        socket=kubelet / "pod-resources" / "kubelet.sock",
        checkpoint=kubelet / "device-plugins" / "kubelet_internal_checkpoint",
        proc_root=root / "proc",
        nvml_state=root / "nvml.json",
    )


class NodeSim:
    """One simulated node's kubelet, checkpoint, /proc and NVML state."""

    def __init__(self, model: ClusterModel, node: str, index: int, paths: NodePaths) -> None:
        self.model, self.node, self.paths = model, node, paths
        self.spec = model.scenario.node(node)
        self.kubelet = FakeKubelet(paths.socket)
        self.procfs = FakeProcfs(paths.proc_root)
        # Nodes differ the way real fleets do: runtime, cgroup driver and version vary.
        self.runtime: Runtime = _RUNTIMES[index % len(_RUNTIMES)]
        self.driver: Driver = "cgroupfs" if index % 2 else "systemd"
        self.cgroup_version: Literal[1, 2] = 1 if self.spec.checkpoint == "v1" else 2
        self.alive: dict[str, PodModel] = {}
        self.entries: dict[tuple[str, str], CheckpointEntry] = {}
        self.corrupt_until: int | None = None
        self._format = cast(Literal["v2", "v1"], self.spec.checkpoint)
        # The NVML state file's content: XIDs accumulate in it, every apply rewrites the GPUs.
        self.nvml: dict[str, Any] = {
            "driver_version": DRIVER_VERSION, "cuda_driver_version": 12040, "gpus": [], "xids": []
        }
        self.mps = mps_daemon(model, node)
        # The node's dcgm-exporter (Prometheus text over HTTP), fed from the same usage as NVML.
        self.dcgm = FakeDcgmExporter(node)
        paths.checkpoint.parent.mkdir(parents=True, exist_ok=True)

    async def start(self) -> None:
        self.kubelet.set_allocatable(
            FakeDevices(d.resource, (d.id,), (d.gpu.index // 4,)) for d in self.model.node_devices[self.node]
        )
        await self.kubelet.start()
        await self.dcgm.start()
        self.write_host_processes()

    def write_host_processes(self) -> None:
        """The node's processes that belong to no scenario pod: the host's init, containerd and the
        kubelet (what only a host PID namespace shows), nvidia-persistenced and, on an MPS node, the
        MPS server in the device plugin's daemon pod."""
        self.procfs.add_host_process(1, "/init.scope", comm="systemd")
        self.procfs.add_host_process(410, "/system.slice/containerd.service", comm="containerd")
        self.procfs.add_host_process(455, "/system.slice/kubelet.service", comm="kubelet")
        self.procfs.add_host_process(600 + sum(map(ord, self.node)) % 300, comm="nvidia-persistenced")
        if (d := self.mps) is not None:
            self._add_pod_process(d.server_pid, d.uid, d.container_id, "besteffort", MPS_SERVER_COMM)

    def _add_pod_process(self, pid: int, uid: str, container_id: str, qos: str, comm: str = "python") -> None:
        self.procfs.add_pod_process(
            pid, pod_uid=uid, container_id=container_id, qos=cast(Qos, qos), runtime=self.runtime,
            driver=self.driver, cgroup_version=self.cgroup_version, comm=comm,
        )

    def apply(self, t_ms: int) -> tuple[list[PodModel], list[PodModel]]:
        """Bring the node to scenario time t; returns (started, stopped) pods."""
        now = {p.uid: p for p in self.model.alive(t_ms, self.node)}
        started = [p for uid, p in now.items() if uid not in self.alive]
        stopped = [p for uid, p in self.alive.items() if uid not in now]
        for pid in (pid for p in stopped for c in p.containers for pid in c.pids):
            self.procfs.remove(pid)
        for p in started:
            for c in p.containers:
                for pid in c.pids:
                    self._add_pod_process(pid, p.uid, c.container_id, p.spec.qos)
        self.alive = now
        if started or stopped:
            self.kubelet.set_pods(_fake_pod(p, self.model) for p in now.values())  # in scenario order
        if started:
            # The device manager rewrites its checkpoint on admission, and only then drops the entries of
            # pods that ended since: between admissions the file still lists terminated pods.
            self.entries = {k: e for k, e in self.entries.items() if e.pod_uid in now}
            for p in started:
                self.entries.update(((p.uid, c.name), _entry(p, c, self.model)) for c in p.containers)
            self.write_checkpoint(t_ms)
        elif self.corrupt_until is not None and t_ms >= self.corrupt_until:
            self.write_checkpoint(t_ms)  # the kubelet's next write replaces the torn file
        self._write_nvml(t_ms)
        return started, stopped

    def write_checkpoint(self, t_ms: int) -> None:
        if self.spec.checkpoint == "none" or (self.corrupt_until is not None and t_ms < self.corrupt_until):
            return
        self.corrupt_until = None
        atomic_write(self.paths.checkpoint, self._checkpoint())

    def corrupt_checkpoint(self, t_ms: int, duration_ms: int) -> None:
        """A torn write: the file ends mid-JSON until the kubelet writes it again."""
        data = self._checkpoint()
        atomic_write(self.paths.checkpoint, data[: max(1, len(data) // 2)])
        self.corrupt_until = t_ms + duration_ms

    def _checkpoint(self) -> bytes:
        return render_checkpoint(self.entries.values(), self.model.registered(self.node), self._format)

    def add_xid(self, gpu: int, code: int, mig: int | None) -> None:
        g = self.model.gpus[self.node][gpu]
        inst = g.mig[mig] if mig is not None else None
        add_xid(self.nvml, g.uuid, code, inst.gi if inst else None, inst.ci if inst else None)

    def _write_nvml(self, t_ms: int) -> None:
        usage = self.model.usage(self.node, t_ms)
        self.nvml["gpus"] = [self._gpu_state(u) for u in usage]
        write_nvml_state(self.paths.nvml_state, self.nvml)
        self.dcgm.update(usage, self.model.holdings(t_ms, self.node))

    def _gpu_state(self, u: GpuUsage) -> dict[str, Any]:
        """One GPU of the NVML state file, laid out as its format (periscope.sim.nvml.state) lists it."""
        g = u.gpu
        doc: dict[str, Any] = {
            "uuid": g.uuid, "name": g.model, "minor": g.index,
            "pci_bus_id": g.pci_bus_id, "memory_total_mib": g.memory_mib, "memory_used_mib": u.fb_used_mib,
            "power_w": u.power_w, "temp_c": u.temp_c, "mig_capable": bool(g.mig) or mig_capable(g.model),
        }
        if g.mig:
            return doc | {"mig": [_mig_state(m) for m in u.mig]}
        if g.sharing == "mps" and (d := self.mps) is not None:
            doc["mps"] = {"server_pid": d.server_pid, "server_used_mib": MPS_SERVER_USED_MIB,
                          "utilization": "clients"}  # utilization samples per client
        util = u.util_pct or 0.0
        return doc | {
            "util_pct": round(util), "mem_util_pct": round(util * MEM_PER_SM),
            "processes": [
                {"pid": p.pid, "used_mib": p.used_mib, "sm_util": round(p.sm_util or 0.0, 3),
                 "mem_util": round((p.sm_util or 0.0) * MEM_PER_SM)}
                for p in u.processes
            ],
        }


def _mig_state(m: MigUsage) -> dict[str, Any]:
    i = m.instance
    return {
        "uuid": i.uuid, "profile": i.profile, "gi": i.gi, "ci": i.ci,
        "profile_id": i.profile_id, "placement_start": i.placement_start, "placement_size": i.slices,
        "memory_total_mib": i.memory_mib, "memory_used_mib": m.fb_used_mib,
        "processes": [{"pid": p.pid, "used_mib": p.used_mib} for p in m.processes],
    }


def _fake_pod(p: PodModel, model: ClusterModel) -> FakePod:
    return FakePod(
        p.namespace,
        p.name,
        tuple(
            FakeContainer(c.name, (FakeDevices(c.spec.resource, c.device_ids, _numa(c.device_ids, model)),))
            for c in p.containers
        ),
    )


def _numa(ids: tuple[str, ...], model: ClusterModel) -> tuple[int, ...]:
    return tuple(sorted({model.devices[i].gpu.index // 4 for i in ids}))


def _entry(p: PodModel, c: ContainerModel, model: ClusterModel) -> CheckpointEntry:
    numa: dict[str, tuple[str, ...]] = {}
    for i in c.device_ids:
        zone = str(model.devices[i].gpu.index // 4)
        numa[zone] = (*numa.get(zone, ()), i)
    visible = ",".join(dict.fromkeys(i.split("::")[0] for i in c.device_ids))
    alloc = {"envs": {"NVIDIA_VISIBLE_DEVICES": visible}}
    return CheckpointEntry(p.uid, c.name, c.spec.resource, c.device_ids, numa, alloc)
