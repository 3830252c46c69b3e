"""NVML backend: device inventory (GPUs and MIG layout) and one telemetry sample of every device.

The `pynvml` module is injected (the real nvidia-ml-py module, or `periscope.sim.nvml.fake_pynvml`),
so the same code runs against real GPUs and the simulator. Rules from the NVML documentation:
a metric that answers NotSupported (utilization on MIG, per-process utilization with MIG) becomes
None; GpuIsLost marks the device lost; any other error is recorded on that device only and the
other devices are still sampled. Calls block, so the service runs them in a worker thread.

Processes come from the compute, MPS-compute and graphics lists (newest versioned call first), one
per PID. On an MPS GPU the driver lists the clients only in the MPS list and the MPS control server
(`nvidia-cuda-mps-server`) in the compute list; the server, named by NVML or by /proc, is left out:
it runs the clients' work, it is not a consumer of its own. With `identify` (the probe's /proc
lookup), each process is built with its pod UID, container ID and QoS at once, not copied afterwards.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from periscope.core.model import DeviceSample, GpuInfo, MigDeviceInfo, MigRef, ProcessSample, SourceHealth
from services.probe.mig_profiles import PRIVILEGE_FIX, MigProfiles
from services.probe.procfs import ProcIdentity

_MIB = 1024.0 * 1024.0
_NO_INSTANCE = 0xFFFFFFFF
# Only when NVML's profile tables give no name (services.probe.mig_profiles): the MIG device's name,
# "NVIDIA B200 MIG 1c.2g.45gb+me", carries it too.
_PROFILE = re.compile(r"((?:\d+c\.)?\d+g\.\d+gb(?:[+-][a-z]+(?:\.[a-z]+)?)?)", re.IGNORECASE)
# The MPS control server: listed by the driver as a compute process of every GPU it serves.
MPS_SERVER = "nvidia-cuda-mps-server"
_COMM_LEN = 15  # TASK_COMM_LEN - 1
# Process lists read on every GPU; each tried as `_v3`, `_v2`, then unversioned.
_PROCESS_LISTS = (
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetMPSComputeRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses",
)


class NvmlUnavailable(Exception):
    """NVML could not be initialised (no driver, no library, no state file)."""


@dataclass(frozen=True, slots=True)
class MigPlacement:
    """Where a MIG instance sits; the NVIDIA DRA driver names MIG devices after these numbers."""

    uuid: str
    parent_uuid: str
    parent_minor: int | None
    profile: str
    profile_id: int | None
    start: int | None
    size: int | None
    denied: str = ""  # why the placement is unknown when NVML refused it (requires privileged user)


@dataclass
class _Gpu:
    info: GpuInfo
    handle: Any
    migs: list[tuple[MigDeviceInfo, Any]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class NvmlInventory:
    gpus: tuple[GpuInfo, ...]
    driver_version: str = ""
    cuda_driver_version: str = ""
    placements: tuple[MigPlacement, ...] = ()
    errors: tuple[str, ...] = ()
    placement_denied: str = ""  # why GPU-instance placement could not be read ("" when it could)

    def mig_ref(self, parent_uuid: str, gi: int, ci: int) -> MigRef | None:
        for g in self.gpus:
            if g.uuid == parent_uuid:
                for m in g.mig_devices:
                    if m.gi == gi and m.ci == ci:
                        return MigRef(uuid=m.uuid, profile=m.profile, gi=gi, ci=ci)
        return None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}" if v > 0 else ""


class NvmlBackend:
    def __init__(
        self,
        nvml: Any,
        proc_name: Callable[[int], str | None] | None = None,
        identify: Callable[[int], ProcIdentity | None] | None = None,
    ) -> None:
        self.nvml = nvml
        self.proc_name = proc_name  # PID -> command from /proc, where NVML cannot name a process
        self.identify = identify  # PID -> pod identity from /proc (None: gone, or not looked up)
        self._names: dict[int, str] = {}  # PID -> process name, for PIDs still on a GPU
        self.mps_servers: dict[str, tuple[int, ...]] = {}  # device UUID -> MPS server PIDs seen
        self.opened = False
        self._lock = threading.Lock()
        self._gpus: list[_Gpu] = []
        self._last_seen: dict[str, int] = {}  # per GPU: newest per-process sample timestamp (µs)
        self.profiles = MigProfiles(nvml)
        self.inventory = NvmlInventory(gpus=())

    def _is(self, e: BaseException, name: str) -> bool:
        cls = getattr(self.nvml, f"NVMLError_{name}", None)
        return cls is not None and isinstance(e, cls)

    def _opt(self, fn: str, *args: Any) -> Any:
        """Call one NVML function; None when the device cannot report it (NotSupported)."""
        try:
            return getattr(self.nvml, fn)(*args)
        except self.nvml.NVMLError as e:
            if self._is(e, "NotSupported") or self._is(e, "FunctionNotFound"):
                return None
            raise

    def open(self) -> None:
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as e:
            raise NvmlUnavailable(f"nvmlInit: {e}") from e
        self.opened = True

    def close(self) -> None:
        if self.opened:
            self.opened = False
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlShutdown()

    # ------------------------------------------------------------------ inventory

    def refresh(self) -> NvmlInventory:
        """Enumerate GPUs and MIG instances; a GPU that fails here is listed as lost, not skipped."""
        nv = self.nvml
        gpus: list[_Gpu] = []
        placements: list[MigPlacement] = []
        errors: list[str] = []
        driver = _text(self._opt("nvmlSystemGetDriverVersion") or "")
        cuda = _cuda_version(int(self._opt("nvmlSystemGetCudaDriverVersion") or 0))
        for index in range(int(nv.nvmlDeviceGetCount())):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                gpu = self._describe(index, handle, placements)
            except nv.NVMLError as e:
                errors.append(f"gpu {index}: {e}")
                old = next((g for g in self._gpus if g.info.index == index), None)
                if old is None:
                    continue
                gpu = _Gpu(replace(old.info, lost=self._is(e, "GpuIsLost")), old.handle)
            gpus.append(gpu)
        with self._lock:
            self._gpus = gpus
        denied = next((p.denied for p in placements if p.denied), "")
        self.inventory = NvmlInventory(
            tuple(g.info for g in gpus), driver, cuda, tuple(placements), tuple(errors), denied
        )
        return self.inventory

    def _describe(self, index: int, handle: Any, placements: list[MigPlacement]) -> _Gpu:
        nv = self.nvml
        uuid = _text(nv.nvmlDeviceGetUUID(handle))
        try:  # GKE IDs and NVIDIA DRA names use the minor: unknown stays unknown, never the index
            minor = self._opt("nvmlDeviceGetMinorNumber", handle)
        except nv.NVMLError:
            minor = None
        pci = self._opt("nvmlDeviceGetPciInfo", handle)
        mode = self._opt("nvmlDeviceGetMigMode", handle)
        mig_enabled = bool(mode and int(mode[0]) == nv.NVML_DEVICE_MIG_ENABLE)
        lost = False
        try:
            mem = self._opt("nvmlDeviceGetMemoryInfo", handle)
        except nv.NVMLError as e:
            # Identity calls can still answer for a GPU that fell off the bus; a metric call cannot.
            # MIG parents may also refuse without privileges: the total is not essential.
            mem, lost = None, self._is(e, "GpuIsLost")
        gpu = _Gpu(
            GpuInfo(
                uuid=uuid,
                index=index,
                model=_text(nv.nvmlDeviceGetName(handle)),
                memory_mib=(mem.total / _MIB) if mem else 0.0,
                minor=int(minor) if minor is not None else None,
                mig_enabled=mig_enabled,
                pci_bus_id=_text(pci.busId) if pci is not None else "",
                lost=lost,
            ),
            handle,
        )
        if mig_enabled and not lost:
            for slot in range(int(nv.nvmlDeviceGetMaxMigDeviceCount(handle))):
                try:
                    mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                except nv.NVMLError:
                    continue  # slots are sparse
                info, placement = self._describe_mig(gpu.info, handle, mh)
                gpu.migs.append((info, mh))
                placements.append(placement)
            gpu.info = replace(gpu.info, mig_devices=tuple(m for m, _ in gpu.migs))
        return gpu

    def _describe_mig(self, parent: GpuInfo, handle: Any, mh: Any) -> tuple[MigDeviceInfo, MigPlacement]:
        nv = self.nvml
        uuid = _text(nv.nvmlDeviceGetUUID(mh))
        gi, ci = int(nv.nvmlDeviceGetGpuInstanceId(mh)), int(nv.nvmlDeviceGetComputeInstanceId(mh))
        mem = self._opt("nvmlDeviceGetMemoryInfo", mh)
        # Placement (DRA MIG names carry it) and the profile's name, from NVML's profile tables.
        where = self.profiles.placement(parent.uuid, handle, gi, ci)
        profile = where.profile
        if not profile:
            m = _PROFILE.search(_text(self._opt("nvmlDeviceGetName", mh) or ""))
            profile = m.group(1) if m else ""
        info = MigDeviceInfo(
            uuid=uuid, profile=profile, gi=gi, ci=ci, memory_mib=(mem.total / _MIB) if mem else 0.0
        )
        placement = MigPlacement(uuid, parent.uuid, parent.minor, profile, where.profile_id, where.start,
                                 where.size, where.denied)  # fmt: skip
        return info, placement

    # ------------------------------------------------------------------ sampling

    def sample(self) -> tuple[DeviceSample, ...]:
        with self._lock:
            gpus = list(self._gpus)
        out: list[DeviceSample] = []
        for gpu in gpus:
            out.extend(self._sample_gpu(gpu))
        live = {p.pid for d in out for p in d.processes} | {
            pid for pids in self.mps_servers.values() for pid in pids
        }
        self._names = {pid: n for pid, n in self._names.items() if pid in live}
        return tuple(out)

    def _metric(self, errors: list[str], fn: str, *args: Any) -> Any:
        """One metric: None when unsupported or failing (noted in `errors`); GpuIsLost propagates."""
        try:
            return self._opt(fn, *args)
        except self.nvml.NVMLError as e:
            if self._is(e, "GpuIsLost"):
                raise
            errors.append(f"{fn}: {e}")
            return None

    def _sample_gpu(self, gpu: _Gpu) -> list[DeviceSample]:
        nv, info = self.nvml, gpu.info
        errors: list[str] = []
        try:
            util = self._metric(errors, "nvmlDeviceGetUtilizationRates", gpu.handle)
            mem = self._metric(errors, "nvmlDeviceGetMemoryInfo", gpu.handle)
            power = self._metric(errors, "nvmlDeviceGetPowerUsage", gpu.handle)
            temp = self._metric(errors, "nvmlDeviceGetTemperature", gpu.handle, nv.NVML_TEMPERATURE_GPU)
            procs = () if info.mig_enabled else self._processes(gpu.handle, info.uuid, errors)
        except nv.NVMLError as e:  # GpuIsLost: the device and its instances are gone
            err = str(e) or type(e).__name__
            return [DeviceSample(uuid=info.uuid, index=info.index, lost=True, error=err)] + [
                DeviceSample(
                    uuid=m.uuid,
                    parent_uuid=info.uuid,
                    index=info.index,
                    mig=MigRef(uuid=m.uuid, profile=m.profile, gi=m.gi, ci=m.ci),
                    lost=True,
                    error=err,
                )
                for m, _ in gpu.migs
            ]
        samples = [
            DeviceSample(
                uuid=info.uuid,
                index=info.index,
                util_pct=float(util.gpu) if util is not None else None,
                mem_util_pct=float(util.memory) if util is not None else None,
                fb_used_mib=mem.used / _MIB if mem is not None else None,
                fb_total_mib=mem.total / _MIB if mem is not None else None,
                power_w=power / 1000.0 if power is not None else None,
                temp_c=float(temp) if temp is not None else None,
                processes=procs,
                error="; ".join(errors),
            )
        ]
        for mig, mh in gpu.migs:
            ref = MigRef(uuid=mig.uuid, profile=mig.profile, gi=mig.gi, ci=mig.ci)
            merr: list[str] = []
            try:
                mmem = self._metric(merr, "nvmlDeviceGetMemoryInfo", mh)
                mprocs = self._processes(mh, mig.uuid, merr, utilization=False)
            except nv.NVMLError as e:
                samples.append(
                    DeviceSample(
                        uuid=mig.uuid,
                        parent_uuid=info.uuid,
                        index=info.index,
                        mig=ref,
                        lost=True,
                        error=str(e) or type(e).__name__,
                    )
                )
                continue
            samples.append(
                DeviceSample(
                    uuid=mig.uuid,
                    parent_uuid=info.uuid,
                    index=info.index,
                    mig=ref,
                    fb_used_mib=mmem.used / _MIB if mmem is not None else None,
                    fb_total_mib=mmem.total / _MIB if mmem is not None else None,
                    processes=mprocs,
                    error="; ".join(merr),
                )
            )
        return samples

    def _processes(
        self, handle: Any, uuid: str, errors: list[str], utilization: bool = True
    ) -> tuple[ProcessSample, ...]:
        running, servers = self._running(handle, uuid, errors)
        util = None
        if utilization and (running or servers):
            try:
                util = self._process_util(handle, uuid)
            except self.nvml.NVMLError as e:
                if self._is(e, "GpuIsLost"):
                    raise
                errors.append(f"nvmlDeviceGetProcessUtilization: {e}")
        if util and set(util) & set(servers) and not set(util) & set(running):
            # Under MPS some drivers charge the clients' work to the server's PID: the clients' own
            # utilization is then unknown (None), not zero, so the core falls back to their memory.
            util = None
        out = []
        identify = self.identify
        for pid, used in running.items():
            sm, mu = (None, None) if util is None else util.get(pid, (0.0, 0.0))
            ident = identify(pid) if identify is not None else None
            out.append(
                ProcessSample(
                    pid=pid,
                    sm_util_pct=sm,
                    mem_util_pct=mu,
                    used_mib=used / _MIB if used is not None else None,
                )
                if ident is None
                else ProcessSample(
                    pid=pid,
                    pod_uid=ident.pod_uid,
                    container_id=ident.container_id,
                    qos=ident.qos,
                    sm_util_pct=sm,
                    mem_util_pct=mu,
                    used_mib=used / _MIB if used is not None else None,
                )
            )
        return tuple(out)

    def _running(
        self, handle: Any, uuid: str, errors: list[str]
    ) -> tuple[dict[int, int | None], tuple[int, ...]]:
        """GPU processes (PID -> used bytes or None) from the compute, MPS-compute and graphics lists,
        one entry per PID, and the PIDs of MPS control servers, which are left out of the first.

        On an MPS GPU the driver lists the clients only in the MPS list and the server in the compute
        list; a PID can appear in more than one list."""
        running: dict[int, int | None] = {}
        for family in _PROCESS_LISTS:
            for p in self._process_list(handle, family, errors):
                pid, used = int(p.pid), getattr(p, "usedGpuMemory", None)
                if pid not in running or running[pid] is None:
                    running[pid] = None if used is None else int(used)
        servers = tuple(pid for pid in running if self._is_mps_server(pid))
        for pid in servers:
            del running[pid]
        self.mps_servers[uuid] = servers
        return running, servers

    def _process_list(self, handle: Any, family: str, errors: list[str]) -> list[Any]:
        """One process list, through the newest versioned call the module and the driver both have."""
        mismatch = getattr(self.nvml, "NVMLLibraryMismatchError", None)
        for name in (f"{family}_v3", f"{family}_v2", family):
            fn = getattr(self.nvml, name, None)
            if fn is None:
                continue
            try:
                return list(fn(handle) or [])
            except self.nvml.NVMLError as e:
                if self._is(e, "FunctionNotFound"):
                    continue  # an older driver: try the previous version of the call
                if self._is(e, "NotSupported"):
                    return []
                if self._is(e, "GpuIsLost"):
                    raise
                errors.append(f"{name}: {e}")
                return []
            except Exception as e:
                if mismatch is not None and isinstance(e, mismatch):
                    continue
                raise
        return []

    def _is_mps_server(self, pid: int) -> bool:
        name = self._names.get(pid)
        if name is None:
            name = self._process_name(pid)
            self._names[pid] = name
        base = name.rsplit("/", 1)[-1]
        # NVML names the executable; /proc/<pid>/comm keeps only its first 15 characters.
        return base == MPS_SERVER or base == MPS_SERVER[:_COMM_LEN]

    def _process_name(self, pid: int) -> str:
        """The command of `pid`: from NVML, else from /proc (the probe's `proc_name`), else ""."""
        try:
            name = _text(self.nvml.nvmlSystemGetProcessName(pid))
        except self.nvml.NVMLError:
            name = ""
        if not name and self.proc_name is not None:
            name = self.proc_name(pid) or ""
        return name.strip()

    def _process_util(self, handle: Any, uuid: str) -> dict[int, tuple[float, float]] | None:
        """Average per-process utilization over the samples newer than the last ones seen.

        NotFound means no newer sample: no process was active since the last tick (all zeros);
        NotSupported (MIG) gives None, i.e. unknown.
        """
        try:
            samples = self.nvml.nvmlDeviceGetProcessUtilization(handle, self._last_seen.get(uuid, 0))
        except self.nvml.NVMLError as e:
            if self._is(e, "NotFound") or getattr(e, "value", None) == 0:  # 0: the wrapper saw no samples
                return {}
            if self._is(e, "NotSupported") or self._is(e, "FunctionNotFound"):
                return None
            raise
        acc: dict[int, list[tuple[float, float]]] = {}
        for s in samples:
            acc.setdefault(int(s.pid), []).append((float(s.smUtil), float(s.memUtil)))
            self._last_seen[uuid] = max(self._last_seen.get(uuid, 0), int(s.timeStamp))
        return {pid: (sum(a for a, _ in v) / len(v), sum(b for _, b in v) / len(v)) for pid, v in acc.items()}

    def mig_health(self) -> SourceHealth | None:
        """The `mig` source: on a node with MIG on, whether GPU-instance placement (what DRA MIG names
        and NVML's profile names need) could be read. None without MIG."""
        inv = self.inventory
        if not any(g.mig_enabled for g in inv.gpus):
            return None
        if inv.placement_denied:
            why = f"GPU-instance placement unreadable: {inv.placement_denied}"
            return SourceHealth(
                "mig", "unavailable", f"{why}; DRA MIG devices cannot be resolved; fix: {PRIVILEGE_FIX}"
            )
        return SourceHealth("mig", "ok", "")

    def handles(self) -> list[Any]:
        """Handles of the physical GPUs (for event registration)."""
        with self._lock:
            return [g.handle for g in self._gpus if not g.info.lost]
