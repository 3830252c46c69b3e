"""The simulated cluster as a pure function of the scenario: at scenario time t, who holds what, doing what.

Everything generated (GPU and MIG UUIDs, pod UIDs, container IDs, host PIDs) is derived from the
scenario `seed` by hashing, so the same scenario always yields the same cluster, and adding a pod does
not renumber the others. The one exception: a real apiserver assigns a pod's UID itself, and the
simulator writing into one adopts it (`adopt_uid`) before the pod's kubelet state is written.
Allocation follows the device plugin: pins are honoured, otherwise the first free device in (GPU
index, MIG instance / replica) order; a device is free again when its pod stops.
Times here are scenario offsets in ms (0 = scenario start); the simulator adds the wall/simulated origin.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from periscope.sim.cluster.hardware import (
    Device,
    Gpu,
    MigInstance,
    build_gpus,
    digest,
    gen_uuid,
    gpu_devices,
    power_temp,
)
from periscope.sim.scenario import Container, Pod, Scenario, ScenarioError, XidSpec

MPS_DAEMONSET = "nvidia-device-plugin-mps-control-daemon"


@dataclass(frozen=True, slots=True)
class ContainerModel:
    spec: Container
    container_id: str  # 64 hex, as the CRI reports it
    device_ids: tuple[str, ...]
    pids: tuple[int, ...]

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True, slots=True)
class PodModel:
    index: int  # position in the scenario's `pods:` list
    uid: str
    spec: Pod
    containers: tuple[ContainerModel, ...]

    @property
    def namespace(self) -> str:
        return self.spec.namespace

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def node(self) -> str:
        return self.spec.node

    def alive_at(self, t_ms: int) -> bool:
        return self.spec.alive_at(t_ms)


@dataclass(frozen=True, slots=True)
class Holding:
    """Ground truth for one kubelet device at one moment: its holder (or none) and true usage."""

    device: Device
    pod: PodModel | None = None
    container: ContainerModel | None = None
    util_pct: float | None = None  # the holder's true SM share of the GPU (after the 100 % cap)
    fb_used_mib: float = 0.0


@dataclass(frozen=True, slots=True)
class ProcessUsage:
    pid: int
    pod_uid: str
    container_id: str
    used_mib: float
    sm_util: float | None  # None on MIG: the hardware cannot report it


@dataclass(frozen=True, slots=True)
class MigUsage:
    instance: MigInstance
    fb_used_mib: float
    processes: tuple[ProcessUsage, ...]


@dataclass(frozen=True, slots=True)
class GpuUsage:
    gpu: Gpu
    util_pct: float | None  # None when MIG is enabled (NVML reports no utilization)
    fb_used_mib: float
    power_w: float
    temp_c: float
    processes: tuple[ProcessUsage, ...]
    mig: tuple[MigUsage, ...] = ()


class ClusterModel:
    """Scenario → allocations, processes and per-device usage at any scenario time."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.gpus: dict[str, tuple[Gpu, ...]] = {n.name: build_gpus(scenario, n.name) for n in scenario.nodes}
        self.node_devices: dict[str, tuple[Device, ...]] = {}
        self._on_gpu: dict[tuple[str, int], tuple[Device, ...]] = {}  # (node, GPU index) -> devices
        for node, gpus in self.gpus.items():
            for g in gpus:
                self._on_gpu[node, g.index] = tuple(gpu_devices(g, scenario.node(node).shared_resource))
            self.node_devices[node] = tuple(d for g in gpus for d in self._on_gpu[node, g.index])
        self.devices: dict[str, Device] = {d.id: d for devs in self.node_devices.values() for d in devs}
        self.pods: tuple[PodModel, ...] = self._allocate()
        self._holders: dict[str, list[tuple[PodModel, ContainerModel]]] = {}
        for pod in self.pods:
            for c in pod.containers:
                for dev in c.device_ids:
                    self._holders.setdefault(dev, []).append((pod, c))

    # ------------------------------------------------------------------ build

    def _allocate(self) -> tuple[PodModel, ...]:
        seed = self.scenario.seed
        busy_until: dict[str, int | None] = {}  # device id -> stop of its holder (None = forever)
        used_pids: dict[str, set[int]] = {}
        built: dict[int, PodModel] = {}
        order = sorted(range(len(self.scenario.pods)), key=lambda i: (self.scenario.pods[i].start_ms, i))
        for i in order:
            spec = self.scenario.pods[i]
            uid = spec.uid or gen_uuid(seed, "pod", i, spec.namespace, spec.name)
            containers: list[ContainerModel] = []
            for j, c in enumerate(spec.containers):
                ids = self._pick(spec, c, busy_until, f"pods[{i}].containers[{j}]")
                for dev in ids:
                    busy_until[dev] = spec.stop_ms
                pids = _pids(seed, spec.node, i, c.name, c.processes, used_pids.setdefault(spec.node, set()))
                cid = digest(seed, "container", i, c.name).hex()
                containers.append(ContainerModel(c, cid, ids, pids))
            built[i] = PodModel(i, uid, spec, tuple(containers))
        return tuple(built[i] for i in range(len(self.scenario.pods)))

    def _pick(self, pod: Pod, c: Container, busy: dict[str, int | None], path: str) -> tuple[str, ...]:
        def free(d: Device) -> bool:
            stop = busy.get(d.id, -1)
            return stop is not None and stop <= pod.start_ms

        candidates = [d for d in self.node_devices[pod.node] if d.resource == c.resource]
        picked: list[str] = []
        for k in range(c.count):
            pool = candidates
            if c.devices is not None:
                g, _, m = c.devices[k].partition(":")
                pin = (int(g), int(m) if m else None)  # "<gpu>" or "<gpu>:<MIG position>"
                pool = [d for d in candidates if (d.gpu.index, d.mig.position if d.mig else None) == pin]
            choice = next((d for d in pool if free(d) and d.id not in picked), None)
            if choice is None:
                what = f"device {c.devices[k]!r}" if c.devices is not None else f"{c.resource} device"
                raise ScenarioError(
                    f"scenario {self.scenario.source}: {path}: no free {what} on node {pod.node} "
                    f"at {pod.start_ms / 1000:g}s (all held by pods still running)"
                )
            picked.append(choice.id)
        return tuple(picked)

    def adopt_uid(self, index: int, uid: str) -> PodModel:
        """Pod `index` carries `uid` from now on (the UID a real apiserver gave it at creation)."""
        old = self.pods[index]
        if old.uid == uid:
            return old
        new = replace(old, uid=uid)
        self.pods = tuple(new if p is old else p for p in self.pods)
        for holders in self._holders.values():
            holders[:] = [(new if p is old else p, c) for p, c in holders]
        return new

    # ------------------------------------------------------------------ queries

    def alive(self, t_ms: int, node: str | None = None) -> list[PodModel]:
        return [p for p in self.pods if p.alive_at(t_ms) and (node is None or p.node == node)]

    def holder(self, device_id: str, t_ms: int) -> tuple[PodModel, ContainerModel] | None:
        return next(((pod, c) for pod, c in self._holders.get(device_id, ()) if pod.alive_at(t_ms)), None)

    def tick_times(self) -> range:
        return range(0, self.scenario.duration_ms, self.scenario.tick_ms)

    def registered(self, node: str) -> dict[str, tuple[str, ...]]:
        out: dict[str, list[str]] = {}
        for d in self.node_devices[node]:
            out.setdefault(d.resource, []).append(d.id)
        return {k: tuple(v) for k, v in out.items()}

    def usage(self, node: str, t_ms: int) -> tuple[GpuUsage, ...]:
        return tuple(self._gpu_usage(g, t_ms) for g in self.gpus[node])

    def holdings(self, t_ms: int, node: str | None = None) -> list[Holding]:
        gpus = [g for name in (self.gpus if node is None else (node,)) for g in self.gpus[name]]
        return [h for g in gpus for h in self._gpu_holdings(g, t_ms)]

    def util_of(self, device_id: str, t_ms: int) -> float:
        """True util of whoever holds `device_id` at t (its capped share on a shared GPU); 0 when free."""
        d = self.devices[device_id]
        return self._holding(d, t_ms, self._shares(d.gpu, t_ms)).util_pct or 0.0

    def xid_owners(self, x: XidSpec) -> list[Holding]:
        """Holders of the GPU (or of the named MIG instance) at the moment of the error."""
        gpu = self.gpus[x.node][x.gpu]
        rows = [h for h in self.holdings(x.at_ms, x.node) if h.device.gpu is gpu and h.pod is not None]
        if x.mig is not None:
            rows = [h for h in rows if h.device.mig is not None and h.device.mig.position == x.mig]
        return rows

    # ------------------------------------------------------------------ usage

    def _holding(self, d: Device, t_ms: int, shares: dict[str, float]) -> Holding:
        if (h := self.holder(d.id, t_ms)) is None:
            return Holding(d)
        pod, c = h
        util = shares.get(c.container_id, 0.0) if d.mig is None else _util(c.spec, t_ms)
        return Holding(d, pod, c, util, c.spec.memory_mib)

    def _gpu_holdings(self, g: Gpu, t_ms: int) -> list[Holding]:
        shares = self._shares(g, t_ms)
        return [self._holding(d, t_ms, shares) for d in self._on_gpu[g.node, g.index]]

    def _shares(self, g: Gpu, t_ms: int) -> dict[str, float]:
        """container_id -> true util on a whole GPU; time-sliced demand above 100 % is scaled down."""
        devices = () if g.mig else self._on_gpu[g.node, g.index]  # MIG instances share no SM time
        held = [h[1] for d in devices if (h := self.holder(d.id, t_ms))]
        demand = {c.container_id: _util(c.spec, t_ms) for c in held}
        total = sum(demand.values())
        scale = 100.0 / total if total > 100.0 else 1.0
        return {k: v * scale for k, v in demand.items()}

    def _gpu_usage(self, g: Gpu, t_ms: int) -> GpuUsage:
        held = self._gpu_holdings(g, t_ms)
        if g.mig:  # one holding per MIG instance; NVML cannot show a process's util there
            on = list(zip(g.mig, held, strict=True))
            migs = tuple(MigUsage(i, h.fb_used_mib, _processes(h, None)) for i, h in on)
            busy = sum((h.util_pct or 0.0) * i.slices / 7.0 for i, h in on)
            return GpuUsage(g, None, sum(m.fb_used_mib for m in migs), *power_temp(g.model, busy), (), migs)
        # a container holding several replicas of the GPU runs its processes once
        once = {h.container.container_id: h for h in held if h.container is not None}.values()
        fb = sum((h.fb_used_mib for h in once), 0.0)
        util = min(100.0, sum(h.util_pct or 0.0 for h in once))
        procs = tuple(p for h in once for p in _processes(h, h.util_pct))
        return GpuUsage(g, util, fb, *power_temp(g.model, util), procs)


def _util(c: Container, t_ms: int) -> float:
    return c.util_at(t_ms) if c.processes > 0 else 0.0


def _processes(h: Holding, util: float | None) -> tuple[ProcessUsage, ...]:
    """The holder's processes, sharing its memory and `util` evenly (None: not observable)."""
    if h.pod is None or h.container is None:
        return ()
    uid, c = h.pod.uid, h.container
    n = len(c.pids)
    return tuple(
        ProcessUsage(pid, uid, c.container_id, c.spec.memory_mib / n, None if util is None else util / n)
        for pid in c.pids
    )


def _pids(seed: int, node: str, pod: int, container: str, n: int, used: set[int]) -> tuple[int, ...]:
    out: list[int] = []
    for k in range(n):
        pid = 1000 + int.from_bytes(digest(seed, "pid", node, pod, container, k)[:4], "big") % 3_000_000
        while pid in used:
            pid += 1
        used.add(pid)
        out.append(pid)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class MpsDaemon:
    """The device plugin's MPS control daemon on a node shared with `sharing.mps`: one pod of its
    DaemonSet, asking for no GPU resource, in which `nvidia-cuda-mps-control` starts
    `nvidia-cuda-mps-server`; the driver lists that server as the compute process of every GPU it
    serves (the clients appear only in the MPS list)."""

    node: str
    uid: str
    name: str
    container_id: str
    server_pid: int


def mps_daemon(model: ClusterModel, node: str) -> MpsDaemon | None:
    """The node's MPS daemon, or None when none of its GPUs is shared with MPS."""
    if not any(g.sharing == "mps" for g in model.gpus[node]):
        return None
    seed = model.scenario.seed
    suffix = "".join("bcdfghjklmnpqrstvwxz2456789"[b % 27] for b in digest(seed, "mps-pod", node)[:5])
    return MpsDaemon(
        node=node,
        uid=gen_uuid(seed, "mps-daemon", node),
        name=f"{MPS_DAEMONSET}-{suffix}",
        container_id=digest(seed, "mps-container", node).hex(),
        server_pid=400 + sum(map(ord, node)) % 100,  # below the pods' PIDs, apart from host daemons
    )
