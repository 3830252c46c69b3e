"""The simulator process: serves a scenario's cluster through the real interfaces the services read.

Per simulated node: a FakeKubelet (PodResources gRPC on its own unix socket), the device-manager
checkpoint file (v2, v1 or none), a /proc tree and the fake NVML state file; for the cluster: one
FakeApiServer with pods, GPU nodes (GFD and operator labels), the ClusterPolicy and operand DaemonSets.
The cluster is frozen at scenario time 0 until `start <sim_ms>` arrives on stdin, so every service can
come up first; then each tick applies the model at that tick and writes the ground truth.
Faults of the node itself (kubelet-restart, checkpoint-corrupt) are executed here; process restarts
are the orchestrator's (`periscope up` reads the same fault schedule).

Run as `python -m periscope.sim.runner CONFIG.json`; it writes `ready.json` into the work directory
once everything serves. Stdin EOF (the orchestrator is gone) or `stop` ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from periscope.clock import ScaledClock, WallClock, clock_from_setting
from periscope.core.cgroup import Driver, Qos, Runtime
from periscope.kubelet.checkpoint import CheckpointEntry, render_checkpoint
from periscope.sim.apiserver import FakeApiServer
from periscope.sim.cluster import (
    ClusterModel,
    PodModel,
    deploy_nodes,
    gen_uuid,
    mig_capable,
    model_profile,
    operands,
)
from periscope.sim.kubelet import FakeContainer, FakeDevices, FakeKubelet, FakePod
from periscope.sim.nvml import add_xid, write_nvml_state
from periscope.sim.procfs import FakeProcfs
from periscope.sim.scenario import load_scenario
from periscope.sim.truth import TruthWriter, rfc3339

log = logging.getLogger("periscope.sim")
OPERATOR_NAMESPACE = "gpu-operator"
_RUNTIMES: tuple[Runtime, ...] = ("containerd", "crio", "containerd")


@dataclass(frozen=True, slots=True)
class NodePaths:
    kubelet_root: Path
    socket: Path
    checkpoint: Path
    proc_root: Path
    nvml_state: Path

    def to_json(self) -> dict[str, str]:
        return {
            k: str(getattr(self, k))
            for k in ("kubelet_root", "socket", "checkpoint", "proc_root", "nvml_state")
        }


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
        self.xids: dict[str, Any] = {"xids": []}
        paths.checkpoint.parent.mkdir(parents=True, exist_ok=True)

    async def start(self) -> None:
        self.kubelet.set_allocatable(
            FakeDevices(d.resource, (d.id,), (d.gpu.index // 4,)) for d in self.model.node_devices[self.node]
        )
        await self.kubelet.start()
        self.procfs.add_host_process(self._host_pid(), comm="nvidia-persistenced")

    def _host_pid(self) -> int:
        return 600 + sum(map(ord, self.node)) % 300

    def apply(self, t_ms: int) -> tuple[list[PodModel], list[PodModel]]:
        """Bring the node to scenario time t; returns (started, stopped) pods."""
        now = {p.uid: p for p in self.model.alive(t_ms, self.node)}
        started = [p for uid, p in now.items() if uid not in self.alive]
        stopped = [p for uid, p in self.alive.items() if uid not in now]
        for p in stopped:
            for c in p.containers:
                for pid in c.pids:
                    self.procfs.remove(pid)
        for p in started:
            for c in p.containers:
                for pid in c.pids:
                    self.procfs.add_pod_process(
                        pid,
                        pod_uid=p.uid,
                        container_id=c.container_id,
                        qos=cast(Qos, p.spec.qos),
                        runtime=self.runtime,
                        driver=self.driver,
                        cgroup_version=self.cgroup_version,
                    )
        self.alive = now
        if started or stopped:
            self.kubelet.set_pods(
                _fake_pod(p, self.model) for p in sorted(now.values(), key=lambda p: p.index)
            )
        if started:
            # The device manager rewrites its checkpoint on admission, and only then drops the entries of
            # pods that ended since: between admissions the file still lists terminated pods.
            self.entries = {k: e for k, e in self.entries.items() if e.pod_uid in now}
            for p in started:
                for c in p.containers:
                    self.entries[(p.uid, c.name)] = _entry(
                        p, c.name, c.spec.resource, c.device_ids, self.model
                    )
            self.write_checkpoint(t_ms)
        elif self.corrupt_until is not None and t_ms >= self.corrupt_until:
            self.write_checkpoint(t_ms)  # the kubelet's next write replaces the torn file
        self._write_nvml(t_ms)
        return started, stopped

    def write_checkpoint(self, t_ms: int) -> None:
        if self.spec.checkpoint == "none" or (self.corrupt_until is not None and t_ms < self.corrupt_until):
            return
        self.corrupt_until = None
        data = render_checkpoint(self.entries.values(), self.model.registered(self.node), self._format)
        _atomic_write(self.paths.checkpoint, data)

    def corrupt_checkpoint(self, t_ms: int, duration_ms: int) -> None:
        """A torn write: the file ends mid-JSON until the kubelet writes it again."""
        data = render_checkpoint(self.entries.values(), self.model.registered(self.node), self._format)
        _atomic_write(self.paths.checkpoint, data[: max(1, len(data) // 2)])
        self.corrupt_until = t_ms + duration_ms

    def add_xid(self, gpu: int, code: int, mig: int | None) -> None:
        g = self.model.gpus[self.node][gpu]
        inst = g.mig[mig] if mig is not None else None
        add_xid(self.xids, g.uuid, code, inst.gi if inst else None, inst.ci if inst else None)

    def _write_nvml(self, t_ms: int) -> None:
        gpus = []
        for u in self.model.usage(self.node, t_ms):
            g = u.gpu
            doc: dict[str, Any] = {
                "uuid": g.uuid,
                "name": g.model,
                "minor": g.minor,
                "pci_bus_id": g.pci_bus_id,
                "memory_total_mib": g.memory_mib,
                "memory_used_mib": u.fb_used_mib,
                "power_w": u.power_w,
                "temp_c": u.temp_c,
                "mig_capable": bool(g.mig) or mig_capable(g.model),
            }
            if g.mig:
                doc["mig"] = [
                    {
                        "uuid": m.instance.uuid,
                        "profile": m.instance.profile,
                        "gi": m.instance.gi,
                        "ci": m.instance.ci,
                        "profile_id": m.instance.profile_id,
                        "placement_start": m.instance.placement_start,
                        "placement_size": m.instance.slices,
                        "memory_total_mib": m.instance.memory_mib,
                        "memory_used_mib": m.fb_used_mib,
                        "processes": [{"pid": p.pid, "used_mib": p.used_mib} for p in m.processes],
                    }
                    for m in u.mig
                ]
            else:
                doc["util_pct"] = round(u.util_pct or 0.0)
                doc["mem_util_pct"] = round((u.util_pct or 0.0) * 0.4)
                doc["processes"] = [
                    {
                        "pid": p.pid,
                        "used_mib": p.used_mib,
                        "sm_util": round(p.sm_util or 0.0, 3),
                        "mem_util": round((p.sm_util or 0.0) * 0.4),
                    }
                    for p in u.processes
                ]
            gpus.append(doc)
        write_nvml_state(
            self.paths.nvml_state,
            {
                "driver_version": "550.54.15",
                "cuda_driver_version": 12040,
                "gpus": gpus,
                "xids": self.xids["xids"],
            },
        )


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


def _entry(
    p: PodModel, container: str, resource: str, ids: tuple[str, ...], model: ClusterModel
) -> CheckpointEntry:
    numa: dict[str, tuple[str, ...]] = {}
    for i in ids:
        numa.setdefault(str(model.devices[i].gpu.index // 4), ())
        numa[str(model.devices[i].gpu.index // 4)] += (i,)
    visible = ",".join(dict.fromkeys(i.split("::")[0] for i in ids))
    return CheckpointEntry(
        p.uid, container, resource, ids, numa, {"envs": {"NVIDIA_VISIBLE_DEVICES": visible}}
    )


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# ---------------------------------------------------------------- apiserver objects


def _ts(ms: int) -> str:
    return rfc3339(ms)


_CRI_SCHEME = {"containerd": "containerd", "crio": "cri-o", "docker": "docker"}


def pod_object(
    p: PodModel, created_ms: int, deleted_ms: int | None = None, runtime: str = "containerd"
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": p.name,
        "namespace": p.namespace,
        "uid": p.uid,
        "creationTimestamp": _ts(created_ms),
        "labels": dict(p.spec.labels),
    }
    if p.spec.owner_kind:
        api = "batch/v1" if p.spec.owner_kind in ("Job", "CronJob") else "apps/v1"
        meta["ownerReferences"] = [
            {
                "apiVersion": api,
                "kind": p.spec.owner_kind,
                "name": p.spec.owner_name,
                "controller": True,
                "blockOwnerDeletion": True,
                "uid": gen_uuid(0, "owner", p.namespace, p.spec.owner_kind, p.spec.owner_name),
            }
        ]
    if deleted_ms is not None:
        meta["deletionTimestamp"] = _ts(deleted_ms)
        meta["deletionGracePeriodSeconds"] = 0
    containers, statuses = [], []
    for c in p.containers:
        qty = str(c.spec.count)
        res: dict[str, Any] = {"limits": {c.spec.resource: qty}, "requests": {c.spec.resource: qty}}
        if p.spec.qos != "besteffort":
            res["requests"].update({"cpu": "2", "memory": "8Gi"})
            if p.spec.qos == "guaranteed":
                res["limits"].update({"cpu": "2", "memory": "8Gi"})
        containers.append(
            {"name": c.name, "image": f"registry.example/{p.namespace}/{c.name}:1", "resources": res}
        )
        statuses.append(
            {
                "name": c.name,
                "containerID": f"{_CRI_SCHEME[runtime]}://{c.container_id}",
                "ready": deleted_ms is None,
                "restartCount": 0,
                "image": f"registry.example/{p.namespace}/{c.name}:1",
                "state": {"running": {"startedAt": _ts(created_ms)}},
            }
        )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"nodeName": p.node, "containers": containers, "restartPolicy": "Always"},
        "status": {
            "phase": "Running",
            "qosClass": p.spec.qos.capitalize().replace("Besteffort", "BestEffort"),
            "startTime": _ts(created_ms),
            "containerStatuses": statuses,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "False" if deleted_ms else "True",
                    "lastTransitionTime": _ts(deleted_ms or created_ms),
                }
            ],
        },
    }


def node_object(model: ClusterModel, node: str) -> dict[str, Any]:
    spec = model.scenario.node(node)
    gpus = model.gpus[node]
    first = gpus[0]
    _, _, family = model_profile(first.model)
    shared = spec.sharing.strategy != "none"
    product = first.model.replace(" ", "-") + ("-SHARED" if shared and not spec.sharing.rename else "")
    labels = {
        "kubernetes.io/hostname": node,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.memory": str(first.memory_mib),
        "nvidia.com/gpu.count": str(len(gpus)),
        "nvidia.com/gpu.family": family,
        "nvidia.com/gpu.replicas": str(spec.sharing.replicas if shared else 1),
        "nvidia.com/gpu.sharing-strategy": spec.sharing.strategy,
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig.capable": str(any(mig_capable(g.model) for g in gpus)).lower(),
        "nvidia.com/mps.capable": str(spec.sharing.strategy == "mps").lower(),
        "nvidia.com/cuda.driver-version.full": "550.54.15",
        "nvidia.com/gpu.deploy.operands": "true",
        "nvidia.com/gpu.workload.config": "container",
    }
    for profile, count in _mig_counts(model, node).items():
        labels[f"nvidia.com/mig-{profile}.count"] = str(count)
    if model.scenario.policy is not None:
        for op in operands(model.scenario):
            if node in deploy_nodes(model.scenario, op.component):
                labels[f"nvidia.com/gpu.deploy.{op.deploy_label}"] = "true"
    capacity = {"cpu": "64", "memory": "515920Mi", "pods": "110"}
    for resource, ids in model.registered(node).items():
        capacity[resource] = str(len(ids))
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node, "labels": labels},
        "spec": {},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def _mig_counts(model: ClusterModel, node: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for g in model.gpus[node]:
        for m in g.mig:
            out[m.profile] = out.get(m.profile, 0) + 1
    return out


def cluster_policy_object(model: ClusterModel) -> dict[str, Any] | None:
    policy = model.scenario.policy
    if policy is None:
        return None
    spec: dict[str, Any] = {"operator": {"defaultRuntime": "containerd"}, "mig": {"strategy": "mixed"}}
    for comp, c in policy.components:
        if c.enabled is not None:
            spec[comp] = {"enabled": c.enabled}
    return {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": policy.name},
        "spec": spec,
        "status": {"state": policy.state, "namespace": OPERATOR_NAMESPACE},
    }


def daemonset_objects(model: ClusterModel) -> list[dict[str, Any]]:
    out = []
    for op in operands(model.scenario):
        if not op.present:
            continue
        labels = {"app": op.daemonset}
        out.append(
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "metadata": {"name": op.daemonset, "namespace": OPERATOR_NAMESPACE, "labels": labels},
                "spec": {
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "nodeSelector": {f"nvidia.com/gpu.deploy.{op.deploy_label}": "true"},
                            "containers": [
                                {"name": op.component.lower(), "image": f"nvcr.io/nvidia/{op.daemonset}"}
                            ],
                        },
                    },
                },
                "status": {
                    "desiredNumberScheduled": op.desired,
                    "currentNumberScheduled": op.desired,
                    "updatedNumberScheduled": op.desired,
                    "numberReady": op.ready,
                    "numberAvailable": op.ready,
                    "numberMisscheduled": 0,
                    "observedGeneration": 1,
                },
            }
        )
    return out


# ---------------------------------------------------------------- the simulator process


class Simulator:
    def __init__(self, config: dict[str, Any]) -> None:
        self.model = ClusterModel(load_scenario(config["scenario"]))
        self.scenario = self.model.scenario
        self.clock: WallClock | ScaledClock = clock_from_setting(config.get("clock", "wall"))
        self.workdir = Path(config["workdir"])
        self.truth_path = config.get("truth")
        self.idle_window_ms = int(config.get("idle_window_ms", 600_000))
        self.idle_threshold = float(config.get("idle_threshold", 5.0))
        self.truth_meta: dict[str, Any] = dict(config.get("truth_meta") or {})
        self.nodes = {
            n.name: NodeSim(self.model, n.name, i, node_paths(self.workdir, n.name))
            for i, n in enumerate(self.scenario.nodes)
        }
        self.api = FakeApiServer("127.0.0.1", 0)
        self.created: dict[str, int] = {}
        self.start_ms: int | None = None
        self.prepared_ms = 0  # when the time-0 state was first served
        self._begin = asyncio.Event()
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ control

    def begin(self, start_ms: int) -> None:
        if self.start_ms is None:
            self.start_ms = start_ms
            self._begin.set()

    def stop(self) -> None:
        self._stop.set()
        self._begin.set()

    # ------------------------------------------------------------------ state

    def apply(self, t_ms: int, stamp_ms: int) -> None:
        gone: list[PodModel] = []
        new: list[PodModel] = []
        for node in self.nodes.values():
            started, stopped = node.apply(t_ms)
            new += started
            gone += stopped
        for p in gone:  # deletions first: a recreated pod may reuse the name
            runtime = self.nodes[p.node].runtime
            self.api.upsert("pods", pod_object(p, self.created.get(p.uid, stamp_ms), stamp_ms, runtime))
            self.api.delete("pods", p.namespace, p.name)
        for p in sorted(new, key=lambda p: p.index):
            self.created[p.uid] = stamp_ms
            self.api.upsert("pods", pod_object(p, stamp_ms, runtime=self.nodes[p.node].runtime))

    def _fire_events(self, lo_ms: int, hi_ms: int) -> None:
        """XIDs and node faults with lo < at <= hi (scenario time); `lo` < 0 includes time 0."""
        for x in self.scenario.xids:
            if lo_ms < x.at_ms <= hi_ms:
                log.info(
                    "xid %d on %s GPU %d%s", x.code, x.node, x.gpu, "" if x.mig is None else f" MIG {x.mig}"
                )
                self.nodes[x.node].add_xid(x.gpu, x.code, x.mig)
        for f in self.scenario.faults:
            if not lo_ms < f.at_ms <= hi_ms or f.node is None:
                continue
            node = self.nodes[f.node]
            if f.fault == "kubelet-restart":
                log.info("fault: kubelet on %s restarts (socket gone for %d ms)", f.node, f.duration_ms)
                task = asyncio.create_task(
                    node.kubelet.restart(down_s=f.duration_ms / 1000 / self.clock.speed)
                )
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            elif f.fault == "checkpoint-corrupt":
                log.info("fault: checkpoint on %s corrupt for %d ms", f.node, f.duration_ms)
                node.corrupt_checkpoint(f.at_ms, f.duration_ms)

    # ------------------------------------------------------------------ run

    async def run(self) -> None:
        self.api.start()
        kubeconfig = self.api.write_kubeconfig(self.workdir / "kubeconfig")
        for node in self.nodes.values():
            await node.start()
        for name in self.nodes:
            self.api.upsert("nodes", node_object(self.model, name))
        policy = cluster_policy_object(self.model)
        if policy is None:
            self.api.set_crd_installed(False)
        else:
            self.api.upsert("clusterpolicies", policy)
            for ds in daemonset_objects(self.model):
                self.api.upsert("daemonsets", ds)
        self._fire_events(-1, 0)
        self.prepared_ms = self.clock.now_ms()
        self.apply(0, self.prepared_ms)
        ready = {
            "apiserver": self.api.url,
            "kubeconfig": str(kubeconfig),
            "pid": os.getpid(),
            "nodes": {n: s.paths.to_json() for n, s in self.nodes.items()},
        }
        _atomic_write(self.workdir / "ready.json", json.dumps(ready).encode())
        log.info("simulated cluster %s ready (frozen at 0s until started)", self.scenario.name)
        await self._begin.wait()
        if not self._stop.is_set() and self.start_ms is not None:
            await self._ticks(self.start_ms)
        await self._stop.wait()

    async def _ticks(self, start_ms: int) -> None:
        tick = self.scenario.tick_ms
        truth = None
        if self.truth_path:
            truth = TruthWriter(
                self.truth_path,
                self.model,
                start_ms,
                self.clock.speed,
                self.idle_window_ms,
                self.idle_threshold,
                prestart_ms=max(0, start_ms - self.prepared_ms),
                extra_meta=self.truth_meta,
            )
        log.info(
            "scenario %s started (%d ticks of %d ms at speed %g)",
            self.scenario.name,
            len(self.model.tick_times()),
            tick,
            self.clock.speed,
        )
        try:
            prev = 0
            for k, t in enumerate(self.model.tick_times()):
                delay = (start_ms + t - self.clock.now_ms()) / 1000 / self.clock.speed
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), delay)
                if self._stop.is_set():
                    return
                if k:
                    self._fire_events(prev, t)
                    self.apply(t, start_ms + t)
                else:
                    self.apply(0, start_ms)  # the frozen start state: only the NVML sample is rewritten
                if truth is not None:
                    truth.write_tick(k)
                prev = t
            log.info("scenario %s ended; holding the last state", self.scenario.name)
        finally:
            if truth is not None:
                truth.close()

    async def shutdown(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for node in self.nodes.values():
            await node.kubelet.stop()
        self.api.stop()


def _read_commands(sim: Simulator, loop: asyncio.AbstractEventLoop) -> None:
    """Orchestrator commands on stdin: `start <sim_ms>`, `stop`; EOF means the orchestrator is gone."""
    for line in sys.stdin:
        parts = line.split()
        if parts[:1] == ["start"] and len(parts) == 2 and parts[1].isdigit():
            loop.call_soon_threadsafe(sim.begin, int(parts[1]))
        elif parts[:1] == ["stop"]:
            break
    loop.call_soon_threadsafe(sim.stop)


async def _main(config: dict[str, Any]) -> None:
    sim = Simulator(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, sim.stop)
    threading.Thread(target=_read_commands, args=(sim, loop), daemon=True, name="commands").start()
    try:
        await sim.run()
    finally:
        await sim.shutdown()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m periscope.sim.runner CONFIG.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    config = json.loads(Path(args[0]).read_text())
    asyncio.run(_main(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
