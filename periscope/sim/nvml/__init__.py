"""A stand-in for the `pynvml` module (nvidia-ml-py 13.615.71) driven by a JSON state file.

The simulator process owns the state and rewrites it (atomically) whenever the simulated GPUs change;
each probe, in any process, loads `fake_pynvml(path)` in place of `import pynvml` (probe setting
NVML_BACKEND=fake:<path>) and sees the new state on its next call (re-read on mtime/inode change).
Functions have the pynvml names, arguments and return shapes for the calls the probe makes; errors
are pynvml's own `NVMLError` subclasses (`NVMLError_NotSupported`, ...).
The state file's format, and the state access under every call, are in `periscope.sim.nvml.state`.
"""

from __future__ import annotations

import ctypes
import time

import pynvml
from pynvml import NVMLError

from periscope.sim.nvml.profiles import (
    ci_profile_index,
    ci_profile_info,
    ci_slices,
    gi_profile_index,
    gi_profile_info,
)
from periscope.sim.nvml.state import (
    Device,
    EventSet,
    Gpu,
    NvmlBase,
    Struct,
    add_xid,
    fail,
    instance_id,
    mib_bytes,
    percent,
    read_nvml_state,
    write_nvml_state,
)

__all__ = ["FakePynvml", "NVMLError", "add_xid", "fake_pynvml", "read_nvml_state", "write_nvml_state"]
MPS_SERVER_PATH = "nvidia-cuda-mps-server"  # what nvmlSystemGetProcessName names the MPS server


class FakePynvml(NvmlBase):
    """Module object exposing the pynvml API over one state file."""

    # ------------------------------------------------------------------ init / system

    def nvmlInit(self) -> None:
        self._load()
        self._initialized += 1

    def nvmlShutdown(self) -> None:
        if not self._initialized:
            fail("Uninitialized")
        self._initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return str(self._ready().get("driver_version", "550.54.15"))

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return int(self._ready().get("cuda_driver_version", 12040))

    # ------------------------------------------------------------------ enumeration

    def nvmlDeviceGetCount(self) -> int:
        return len(self._gpus())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Device:
        gpus = self._gpus()
        if not 0 <= index < len(gpus):
            fail("InvalidArgument")
        return Device(gpus[index]["uuid"], False)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Device:
        found = self._lookup(uuid)
        if found is None:
            fail("NotFound")
        return Device(uuid, found[1] is not None)

    def nvmlDeviceGetUUID(self, handle: Device) -> str:
        self._find(handle, "nvmlDeviceGetUUID", metric=False)
        return handle.uuid

    def nvmlDeviceGetName(self, handle: Device) -> str:
        gpu, mig = self._find(handle, "nvmlDeviceGetName", metric=False)
        name = str(gpu.get("name", "NVIDIA A100-SXM4-80GB"))
        return f"{name} MIG {mig.get('profile', '')}" if mig is not None else name

    def nvmlDeviceGetIndex(self, handle: Device) -> int:
        gpu, _ = self._find(handle, "nvmlDeviceGetIndex", metric=False)
        return [g["uuid"] for g in self._state.get("gpus", [])].index(gpu["uuid"])

    def nvmlDeviceGetMinorNumber(self, handle: Device) -> int:
        gpu, _ = self._find(handle, "nvmlDeviceGetMinorNumber", metric=False, whole=True)
        return int(gpu.get("minor", self.nvmlDeviceGetIndex(handle)))

    def nvmlDeviceGetPciInfo(self, handle: Device) -> Struct:
        gpu, _ = self._find(handle, "nvmlDeviceGetPciInfo", metric=False)
        bus = str(gpu.get("pci_bus_id", "00000000:00:00.0")).encode()
        return Struct(busId=bus, busIdLegacy=bus, domain=0, bus=0, device=0, pciDeviceId=0, pciSubSystemId=0)

    # ------------------------------------------------------------------ metrics

    def nvmlDeviceGetUtilizationRates(self, handle: Device) -> Struct:
        gpu, _ = self._find(handle, "nvmlDeviceGetUtilizationRates", whole=True)
        if gpu.get("mig") is not None:
            fail("NotSupported")  # as on real MIG-enabled GPUs
        return Struct(gpu=percent(gpu.get("util_pct", 0)), memory=percent(gpu.get("mem_util_pct", 0)))

    def nvmlDeviceGetMemoryInfo(self, handle: Device, version: int | None = None) -> Struct:
        gpu, mig = self._find(handle, "nvmlDeviceGetMemoryInfo")
        src = mig if mig is not None else gpu
        parts = gpu["mig"] if mig is None and gpu.get("mig") is not None else [src]  # MIG on: its instances
        total = mib_bytes(src.get("memory_total_mib", 0))
        used = mib_bytes(sum(float(m.get("memory_used_mib", 0)) for m in parts))
        mem = Struct(total=total, free=max(total - used, 0), used=used)
        if version:
            mem.version, mem.reserved = version, 0
        return mem

    def nvmlDeviceGetPowerUsage(self, handle: Device) -> int:
        gpu, _ = self._find(handle, "nvmlDeviceGetPowerUsage", whole=True)
        return int(float(gpu.get("power_w", 0.0)) * 1000)

    def nvmlDeviceGetTemperature(self, handle: Device, sensor: int) -> int:
        gpu, _ = self._find(handle, "nvmlDeviceGetTemperature", whole=True)
        if sensor != 0:
            fail("NotSupported")
        return int(gpu.get("temp_c", 0))

    def _listed(self, handle: Device, call: str, kind: str) -> list[Struct]:
        """One process list. `kind`: compute | mps | graphics. On an MPS GPU (state `mps`) the
        driver lists the clients only as MPS processes and the MPS server as a compute process."""
        gpu, mig = self._find(handle, call)
        instances = [mig] if mig is not None else gpu.get("mig")
        sources: list[tuple[Gpu | None, list[Gpu]]]
        if kind == "graphics":
            sources = [(None, gpu.get("graphics_processes", []) if mig is None else [])]
        elif instances is not None:
            if mig is None and gpu.get("mig_list_needs_privilege"):
                fail("NoPermission")  # the whole-GPU list on MIG needs root; the instances answer
            sources = [(m, m.get("processes", []) if kind == "compute" else []) for m in instances]
        elif (mps := gpu.get("mps")) is not None:
            server = {"pid": mps.get("server_pid", 0), "used_mib": mps.get("server_used_mib", 0)}
            sources = [(None, [server] if kind == "compute" else gpu.get("processes", []))]
        else:
            sources = [(None, gpu.get("processes", []) if kind == "compute" else [])]
        return [Struct(pid=int(p["pid"]),
                       usedGpuMemory=None if p.get("used_mib") is None else mib_bytes(p["used_mib"]),
                       gpuInstanceId=instance_id(None if inst is None else inst.get("gi", 0)),
                       computeInstanceId=instance_id(None if inst is None else inst.get("ci", 0)))
                for inst, procs in sources for p in procs]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Device) -> list[Struct]:
        return self._listed(handle, "nvmlDeviceGetComputeRunningProcesses", "compute")

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Device) -> list[Struct]:
        return self._listed(handle, "nvmlDeviceGetMPSComputeRunningProcesses", "mps")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Device) -> list[Struct]:
        return self._listed(handle, "nvmlDeviceGetGraphicsRunningProcesses", "graphics")

    # pynvml's unversioned names call the _v3 ones
    nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses
    nvmlDeviceGetMPSComputeRunningProcesses_v3 = nvmlDeviceGetMPSComputeRunningProcesses
    nvmlDeviceGetGraphicsRunningProcesses_v3 = nvmlDeviceGetGraphicsRunningProcesses

    def nvmlDeviceGetComputeMode(self, handle: Device) -> int:
        gpu, _ = self._find(handle, "nvmlDeviceGetComputeMode", whole=True)
        # The MPS control daemon sets EXCLUSIVE_PROCESS so that only its server opens the GPU.
        return pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS if "mps" in gpu else pynvml.NVML_COMPUTEMODE_DEFAULT

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        for gpu in self._gpus():
            mps = gpu.get("mps")
            if mps is not None and int(mps.get("server_pid", 0)) == pid:
                return MPS_SERVER_PATH
            procs = list(gpu.get("processes", [])) + list(gpu.get("graphics_processes", []))
            procs += [p for m in gpu.get("mig") or [] for p in m.get("processes", [])]
            for p in procs:
                if int(p["pid"]) == pid:
                    return str(p.get("name", "python3"))
        fail("NotFound")

    def nvmlDeviceGetProcessUtilization(self, handle: Device, timeStamp: int) -> list[Struct]:
        gpu, _ = self._find(handle, "nvmlDeviceGetProcessUtilization", whole=True)
        if gpu.get("mig") is not None:
            fail("NotSupported")
        sampled = [p for p in gpu.get("processes", []) if p.get("sm_util") is not None]
        mps = gpu.get("mps")
        by = "clients" if mps is None else str(mps.get("utilization", "clients"))
        if by == "none":
            fail("NotSupported")
        if mps is not None and by == "server" and sampled:
            # Some drivers charge the clients' work to the server's PID.
            sm = min(sum(float(p["sm_util"]) for p in sampled), 100.0)
            mu = min(sum(float(p.get("mem_util", 0)) for p in sampled), 100.0)
            sampled = [{"pid": mps["server_pid"], "sm_util": sm, "mem_util": mu}]
        if not sampled:
            fail("NotFound")  # no sample newer than timeStamp
        ts = max(int(time.time() * 1_000_000), int(timeStamp) + 1)
        return [Struct(pid=int(p["pid"]), timeStamp=ts, smUtil=percent(p["sm_util"]),
                       memUtil=percent(p.get("mem_util", 0)), encUtil=0, decUtil=0) for p in sampled]

    # ------------------------------------------------------------------ MIG

    def nvmlDeviceGetMigMode(self, device: Device) -> list[int]:
        gpu, _ = self._find(device, "nvmlDeviceGetMigMode", metric=False, whole=True)
        if gpu.get("mig") is None and not gpu.get("mig_capable"):
            fail("NotSupported")
        return [1, 1] if gpu.get("mig") is not None else [0, 0]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Device) -> int:
        gpu, _ = self._find(device, "nvmlDeviceGetMaxMigDeviceCount", metric=False)
        return 7 if gpu.get("mig") is not None or gpu.get("mig_capable") else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Device, index: int) -> Device:
        gpu, _ = self._find(device, "nvmlDeviceGetMigDeviceHandleByIndex", metric=False)
        migs = gpu.get("mig") or []
        if not 0 <= index < len(migs):
            fail("NotFound")
        return Device(migs[index]["uuid"], True)

    def nvmlDeviceIsMigDeviceHandle(self, device: Device) -> ctypes.c_uint:
        _, mig = self._find(device, "nvmlDeviceIsMigDeviceHandle", metric=False)
        return ctypes.c_uint(1 if mig is not None else 0)

    def _mig(self, dev: Device, call: str) -> tuple[Gpu, Gpu]:
        """(gpu, mig) for a call only a MIG device handle answers."""
        gpu, mig = self._find(dev, call, metric=False)
        if mig is None:
            fail("InvalidArgument")
        return gpu, mig

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Device) -> Device:
        gpu, _ = self._mig(migDevice, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
        return Device(gpu["uuid"], False)

    def nvmlDeviceGetGpuInstanceId(self, device: Device) -> int:
        return int(self._mig(device, "nvmlDeviceGetGpuInstanceId")[1].get("gi", 0))

    def nvmlDeviceGetComputeInstanceId(self, device: Device) -> int:
        return int(self._mig(device, "nvmlDeviceGetComputeInstanceId")[1].get("ci", 0))

    def nvmlDeviceGetGpuInstanceById(self, device: Device, gpuInstanceId: int) -> Struct:
        gpu, _ = self._find(device, "nvmlDeviceGetGpuInstanceById", metric=False)
        for m in gpu.get("mig") or []:
            if int(m.get("gi", 0)) == gpuInstanceId:
                return Struct(parent=gpu["uuid"], id=gpuInstanceId, mig=m)
        fail("NotFound")

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Struct) -> Struct:
        m = gpuInstance.mig
        placement = Struct(start=int(m.get("placement_start", 0)), size=int(m.get("placement_size", 1)))
        return Struct(device=Device(gpuInstance.parent, False), id=gpuInstance.id,
                      profileId=int(m.get("profile_id", 0)), placement=placement)

    # Profile tables, as NVML answers them for the profiles the GPU's instances use (state.py: names).

    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: Device, profile: int, version: int = 2) -> Struct:
        gpu, _ = self._find(device, "nvmlDeviceGetGpuInstanceProfileInfo", metric=False, whole=True)
        if version not in (1, 2):
            fail("FunctionNotFound")
        for m in gpu.get("mig") or []:
            if gi_profile_index(m) == profile:
                return gi_profile_info(m, version)
        fail("NotSupported")  # no such profile on this GPU (or none of its instances uses it)

    def nvmlDeviceGetGpuInstanceProfileInfoById(self, device: Device, profileId: int) -> Struct:
        gpu, _ = self._find(device, "nvmlDeviceGetGpuInstanceProfileInfoById", metric=False, whole=True)
        for m in gpu.get("mig") or []:
            if int(m.get("profile_id", 0)) == profileId:
                return gi_profile_info(m, 2)
        fail("InvalidArgument")

    nvmlDeviceGetGpuInstanceProfileInfoV = nvmlDeviceGetGpuInstanceProfileInfo
    nvmlDeviceGetGpuInstanceProfileInfoByIdV = nvmlDeviceGetGpuInstanceProfileInfoById

    def nvmlGpuInstanceGetComputeInstanceById(self, gpuInstance: Struct, computeInstanceId: int) -> Struct:
        found = self._lookup(gpuInstance.parent)
        for m in (found[0].get("mig") or []) if found else []:  # the GPU instance's compute instances
            if int(m.get("gi", 0)) == gpuInstance.id and int(m.get("ci", 0)) == computeInstanceId:
                return Struct(gpuInstance=gpuInstance, id=computeInstanceId, mig=m)
        fail("NotFound")

    def nvmlComputeInstanceGetInfo(self, computeInstance: Struct) -> Struct:
        m = computeInstance.mig
        index = ci_profile_index(ci_slices(m))
        return Struct(device=Device(computeInstance.gpuInstance.parent, False),
                      gpuInstance=computeInstance.gpuInstance, id=computeInstance.id, profileId=index,
                      placement=Struct(start=0, size=ci_slices(m)))

    nvmlComputeInstanceGetInfo_v2 = nvmlComputeInstanceGetInfo

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, device: Struct, profile: int, engProfile: int, version: int = 2
    ) -> Struct:
        if version not in (1, 2):
            fail("FunctionNotFound")
        info = ci_profile_info(device.mig, profile, version)
        if info is None or engProfile != pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            fail("NotSupported")
        return info

    nvmlGpuInstanceGetComputeInstanceProfileInfoV = nvmlGpuInstanceGetComputeInstanceProfileInfo

    # ------------------------------------------------------------------ events

    def nvmlEventSetCreate(self) -> EventSet:
        xids = self._ready().get("xids", [])
        return EventSet(max((int(x.get("seq", 0)) for x in xids), default=0))

    def nvmlDeviceGetSupportedEventTypes(self, handle: Device) -> int:
        self._find(handle, "nvmlDeviceGetSupportedEventTypes", metric=False)
        return 0x1 | 0x2 | 0x4 | 0x8 | 0x10

    def nvmlDeviceRegisterEvents(self, handle: Device, eventTypes: int, eventSet: EventSet) -> None:
        self._find(handle, "nvmlDeviceRegisterEvents", metric=False)
        if eventTypes & pynvml.nvmlEventTypeXidCriticalError:
            eventSet.devices.add(handle.uuid)

    def nvmlEventSetWait(self, eventSet: EventSet, timeoutms: int) -> Struct:
        deadline = time.monotonic() + timeoutms / 1000.0
        while True:
            if eventSet.freed:
                fail("Uninitialized")
            for x in self._ready().get("xids", []):
                seq = int(x.get("seq", 0))
                fresh = seq > eventSet.baseline and seq not in eventSet.delivered
                if fresh and x.get("gpu") in eventSet.devices:
                    eventSet.delivered.add(seq)
                    return Struct(device=Device(str(x["gpu"]), False), eventData=int(x.get("code", 999)),
                                  eventType=pynvml.nvmlEventTypeXidCriticalError,
                                  gpuInstanceId=instance_id(x.get("gi")),
                                  computeInstanceId=instance_id(x.get("ci")))
            if time.monotonic() >= deadline:
                fail("Timeout")
            time.sleep(min(0.02, max(deadline - time.monotonic(), 0.0)))

    def nvmlEventSetFree(self, eventSet: EventSet) -> None:
        eventSet.freed = True


fake_pynvml = FakePynvml  # a fresh fake module bound to a state path (one per probe; the file may come later)
