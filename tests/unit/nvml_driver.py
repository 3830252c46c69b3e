"""A stand-in for libnvidia-ml.so under the real `pynvml` module, for conformance tests.

`real_pynvml(driver)` executes the installed nvidia-ml-py source as a fresh module and swaps only its
access to the shared library (`_nvmlGetFunctionPointer`, `_LoadNvmlLibrary`): every wrapper, struct,
constant and error class is the real one, so the probe meets exactly the objects a real driver's
answers turn into (friendly objects from `c_nvmlProcessInfo_v3_t`, `usedGpuMemory` None for
NVML_VALUE_NOT_AVAILABLE, `NVMLError_*` built from return codes, the INSUFFICIENT_SIZE protocol).

The C functions below follow the NVML C API: they write through the pointers pynvml passes and return
an nvmlReturn_t. A symbol the driver lacks answers FUNCTION_NOT_FOUND, as the real lookup does.
"""

from __future__ import annotations

import ctypes
import importlib.util
import itertools
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml

# nvmlReturn_t codes (nvml.h)
SUCCESS, NOT_SUPPORTED, NO_PERMISSION, NOT_FOUND, INSUFFICIENT_SIZE = 0, 3, 4, 6, 7
TIMEOUT, GPU_IS_LOST = 10, 15
XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
NOT_AVAILABLE = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE_ulonglong
_copies = itertools.count()


def _v(arg: Any) -> int:
    """An argument pynvml passes either as a plain int or as a ctypes value."""
    return int(getattr(arg, "value", arg))


@dataclass
class Proc:
    pid: int
    used_bytes: int | None  # None: the driver answers NVML_VALUE_NOT_AVAILABLE
    gi: int = 0xFFFFFFFF
    ci: int = 0xFFFFFFFF


@dataclass
class Dev:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    minor: int = 0
    total: int = 80 * 1024**3
    used: int = 1024**3
    util: tuple[int, int] = (50, 20)
    power_mw: int = 250_000
    temp_c: int = 55
    compute_mode: int = 0
    mig_mode: int | None = None  # None: MIG not supported
    gi: int = 0
    ci: int = 0
    profile_id: int = 0
    placement: tuple[int, int] = (0, 1)
    # MIG profile tables (GPU-instance profile of this MIG device): (index, name, slices); the compute
    # instance's (index, id, name, slices). None: the driver has no such profile table answer.
    gi_profile: tuple[int, str, int] | None = None
    ci_profile: tuple[int, int, str, int] | None = None
    compute: list[Proc] = field(default_factory=list)
    mps: list[Proc] = field(default_factory=list)
    graphics: list[Proc] = field(default_factory=list)
    samples: list[tuple[int, int, int]] = field(default_factory=list)  # (pid, smUtil, memUtil)
    migs: list[Dev] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)  # C function -> return code


class Driver:
    """The NVML shared library's behaviour over a list of `Dev`s."""

    def __init__(self, gpus: list[Dev], names: dict[int, str] | None = None, missing: tuple[str, ...] = ()):
        self.gpus = gpus
        self.names = names or {}  # PID -> what nvmlSystemGetProcessName answers
        self.missing = set(missing)  # symbols this driver does not export
        self.calls: list[str] = []
        self._structs: dict[int, tuple[Dev, Any]] = {}  # address of the opaque handle struct -> device
        self._handles: dict[int, Any] = {}
        self.module: Any = None
        self.xids: list[tuple[Dev, int, int, int]] = []  # (device, code, gi, ci) not yet delivered
        self._registered: set[int] = set()
        self._event_set: Any = None

    # ------------------------------------------------------------------ plumbing

    def function(self, module: types.ModuleType) -> Callable[[str], Callable[..., int]]:
        self.module = module

        def lookup(name: str) -> Callable[..., int]:
            fn = getattr(self, name, None)
            if fn is None or name in self.missing:
                raise module.NVMLError(module.NVML_ERROR_FUNCTION_NOT_FOUND)

            def call(*args: Any) -> int:
                self.calls.append(name)
                dev = self._dev(args[0]) if args and isinstance(args[0], ctypes._Pointer) else None
                if dev is not None and name in dev.errors:
                    return dev.errors[name]
                return int(fn(*args))

            return call

        return lookup

    def _dev(self, handle: Any) -> Dev | None:
        try:
            return self._structs[ctypes.addressof(handle.contents)][0]
        except (ValueError, KeyError):
            return None

    def _handle_for(self, dev: Dev, out: Any, struct_type: type) -> None:
        # Device handles by device (events name them); a GPU/compute instance handle is its own object.
        key: Any = id(dev) if struct_type is self.module.struct_c_nvmlDevice_t else (id(dev), struct_type)
        if key not in self._handles:
            self._handles[key] = struct_type()
            self._structs[ctypes.addressof(self._handles[key])] = (dev, self._handles[key])
        out._obj.contents = self._handles[key]

    def _mig_on(self, d: Dev) -> bool:
        return d.mig_mode == 1 or any(m is d for g in self.gpus for m in g.migs)

    @staticmethod
    def _set(ref: Any, value: Any) -> int:
        ref._obj.value = value
        return SUCCESS

    # ------------------------------------------------------------------ system

    def nvmlInitWithFlags(self, flags: int) -> int:
        return SUCCESS

    def nvmlShutdown(self) -> int:
        return SUCCESS

    def nvmlSystemGetDriverVersion(self, buf: Any, size: Any) -> int:
        buf.value = b"570.124.06"
        return SUCCESS

    def nvmlSystemGetCudaDriverVersion(self, ref: Any) -> int:
        return self._set(ref, 12080)

    def nvmlSystemGetProcessName(self, pid: Any, buf: Any, size: Any) -> int:
        name = self.names.get(int(pid.value))
        if name is None:
            return NOT_FOUND
        buf.value = name.encode()
        return SUCCESS

    # ------------------------------------------------------------------ devices

    def nvmlDeviceGetCount_v2(self, ref: Any) -> int:
        return self._set(ref, len(self.gpus))

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, out: Any) -> int:
        self._handle_for(self.gpus[index.value], out, self.module.struct_c_nvmlDevice_t)
        return SUCCESS

    def nvmlDeviceGetUUID(self, h: Any, buf: Any, size: Any) -> int:
        buf.value = self._dev(h).uuid.encode()  # type: ignore[union-attr]
        return SUCCESS

    def nvmlDeviceGetName(self, h: Any, buf: Any, size: Any) -> int:
        buf.value = self._dev(h).name.encode()  # type: ignore[union-attr]
        return SUCCESS

    def nvmlDeviceGetMinorNumber(self, h: Any, ref: Any) -> int:
        return self._set(ref, self._dev(h).minor)  # type: ignore[union-attr]

    def nvmlDeviceGetPciInfo_v3(self, h: Any, ref: Any) -> int:
        ref._obj.busId = f"00000000:{0x10 + self._dev(h).minor:02X}:00.0".encode()  # type: ignore[union-attr]
        return SUCCESS

    def nvmlDeviceGetMemoryInfo(self, h: Any, ref: Any) -> int:
        d = self._dev(h)
        assert d is not None
        ref._obj.total, ref._obj.used, ref._obj.free = d.total, d.used, d.total - d.used
        return SUCCESS

    def nvmlDeviceGetUtilizationRates(self, h: Any, ref: Any) -> int:
        d = self._dev(h)
        assert d is not None
        if self._mig_on(d):
            return NOT_SUPPORTED  # no utilization counters with MIG on
        ref._obj.gpu, ref._obj.memory = d.util
        return SUCCESS

    def nvmlDeviceGetPowerUsage(self, h: Any, ref: Any) -> int:
        return self._set(ref, self._dev(h).power_mw)  # type: ignore[union-attr]

    def nvmlDeviceGetTemperature(self, h: Any, sensor: Any, ref: Any) -> int:
        return self._set(ref, self._dev(h).temp_c)  # type: ignore[union-attr]

    def nvmlDeviceGetComputeMode(self, h: Any, ref: Any) -> int:
        return self._set(ref, self._dev(h).compute_mode)  # type: ignore[union-attr]

    # ------------------------------------------------------------------ processes

    def _list(self, procs: list[Proc], count: Any, array: Any) -> int:
        if array is None:  # the sizing call
            if not procs:
                count._obj.value = 0
                return SUCCESS
            count._obj.value = len(procs)
            return INSUFFICIENT_SIZE
        for i, p in enumerate(procs):
            array[i].pid = p.pid
            array[i].usedGpuMemory = NOT_AVAILABLE if p.used_bytes is None else p.used_bytes
            array[i].gpuInstanceId, array[i].computeInstanceId = p.gi, p.ci
        count._obj.value = len(procs)
        return SUCCESS

    def nvmlDeviceGetComputeRunningProcesses_v3(self, h: Any, count: Any, array: Any) -> int:
        return self._list(self._dev(h).compute, count, array)  # type: ignore[union-attr]

    def nvmlDeviceGetComputeRunningProcesses_v2(self, h: Any, count: Any, array: Any) -> int:
        return self._list(self._dev(h).compute, count, array)  # type: ignore[union-attr]

    def nvmlDeviceGetMPSComputeRunningProcesses_v3(self, h: Any, count: Any, array: Any) -> int:
        return self._list(self._dev(h).mps, count, array)  # type: ignore[union-attr]

    def nvmlDeviceGetMPSComputeRunningProcesses_v2(self, h: Any, count: Any, array: Any) -> int:
        return self._list(self._dev(h).mps, count, array)  # type: ignore[union-attr]

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, h: Any, count: Any, array: Any) -> int:
        return self._list(self._dev(h).graphics, count, array)  # type: ignore[union-attr]

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, h: Any, count: Any, array: Any) -> int:
        return self._list(self._dev(h).graphics, count, array)  # type: ignore[union-attr]

    def nvmlDeviceGetProcessUtilization(self, h: Any, array: Any, count: Any, since: Any) -> int:
        d = self._dev(h)
        assert d is not None
        if self._mig_on(d):
            return NOT_SUPPORTED
        if not d.samples:
            return NOT_FOUND  # no sample newer than `since`
        if array is None:
            count._obj.value = len(d.samples)
            return INSUFFICIENT_SIZE
        for i, (pid, sm, mem) in enumerate(d.samples):
            array[i].pid, array[i].smUtil, array[i].memUtil = pid, sm, mem
            array[i].timeStamp = since.value + 1000 * (i + 1)
        count._obj.value = len(d.samples)
        return SUCCESS

    # ------------------------------------------------------------------ MIG

    def nvmlDeviceGetMigMode(self, h: Any, current: Any, pending: Any) -> int:
        d = self._dev(h)
        assert d is not None
        if d.mig_mode is None:
            return NOT_SUPPORTED
        current._obj.value = pending._obj.value = d.mig_mode
        return SUCCESS

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Any, ref: Any) -> int:
        return self._set(ref, 7)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Any, index: Any, out: Any) -> int:
        d = self._dev(h)
        assert d is not None
        if index.value >= len(d.migs):
            return NOT_FOUND
        self._handle_for(d.migs[index.value], out, self.module.struct_c_nvmlDevice_t)
        return SUCCESS

    def nvmlDeviceGetGpuInstanceId(self, h: Any, ref: Any) -> int:
        return self._set(ref, self._dev(h).gi)  # type: ignore[union-attr]

    def nvmlDeviceGetComputeInstanceId(self, h: Any, ref: Any) -> int:
        return self._set(ref, self._dev(h).ci)  # type: ignore[union-attr]

    def nvmlDeviceGetGpuInstanceById(self, h: Any, gi: int, out: Any) -> int:
        d = self._dev(h)
        assert d is not None
        mig = next((m for m in d.migs if m.gi == gi), None)
        if mig is None:
            return NOT_FOUND
        self._handle_for(mig, out, self.module.struct_c_nvmlGpuInstance_t)
        return SUCCESS

    def nvmlGpuInstanceGetInfo(self, gi: Any, ref: Any) -> int:
        mig = self._dev(gi)
        assert mig is not None
        ref._obj.id, ref._obj.profileId = mig.gi, mig.profile_id
        ref._obj.placement.start, ref._obj.placement.size = mig.placement
        return SUCCESS

    def _gi_profile(self, ref: Any, mig: Dev) -> int:
        assert mig.gi_profile is not None and ref._obj.version == self.module.nvmlGpuInstanceProfileInfo_v2
        _, name, slices = mig.gi_profile
        ref._obj.id, ref._obj.sliceCount, ref._obj.name = mig.profile_id, slices, name.encode()
        ref._obj.memorySizeMB = mig.total // 1024**2
        return SUCCESS

    def nvmlDeviceGetGpuInstanceProfileInfoByIdV(self, h: Any, profile_id: Any, ref: Any) -> int:
        d = self._dev(h)
        assert d is not None
        mig = next((m for m in d.migs if m.gi_profile and m.profile_id == _v(profile_id)), None)
        return self._gi_profile(ref, mig) if mig is not None else 2  # INVALID_ARGUMENT

    def nvmlDeviceGetGpuInstanceProfileInfoV(self, h: Any, index: Any, ref: Any) -> int:
        d = self._dev(h)
        assert d is not None
        mig = next((m for m in d.migs if m.gi_profile and m.gi_profile[0] == _v(index)), None)
        return self._gi_profile(ref, mig) if mig is not None else NOT_SUPPORTED

    def nvmlGpuInstanceGetComputeInstanceById(self, gi: Any, ci: Any, out: Any) -> int:
        mig = self._dev(gi)
        assert mig is not None
        if mig.ci != _v(ci):
            return NOT_FOUND
        self._handle_for(mig, out, self.module.struct_c_nvmlComputeInstance_t)
        return SUCCESS

    def nvmlComputeInstanceGetInfo_v2(self, ci: Any, ref: Any) -> int:
        mig = self._dev(ci)
        assert mig is not None
        if mig.ci_profile is None:
            return NOT_SUPPORTED
        ref._obj.id, ref._obj.profileId = mig.ci, mig.ci_profile[1]
        return SUCCESS

    def nvmlGpuInstanceGetComputeInstanceProfileInfoV(self, gi: Any, index: Any, eng: Any, ref: Any) -> int:
        mig = self._dev(gi)
        assert mig is not None and ref._obj.version == self.module.nvmlComputeInstanceProfileInfo_v2
        if mig.ci_profile is None or mig.ci_profile[0] != _v(index):
            return NOT_SUPPORTED
        _, profile_id, name, slices = mig.ci_profile
        ref._obj.id, ref._obj.sliceCount, ref._obj.name = profile_id, slices, name.encode()
        return SUCCESS


    # ------------------------------------------------------------------ events

    def nvmlEventSetCreate(self, out: Any) -> int:
        self._event_set = self.module.struct_c_nvmlEventSet_t()
        out._obj.contents = self._event_set
        return SUCCESS

    def nvmlDeviceGetSupportedEventTypes(self, h: Any, ref: Any) -> int:
        return self._set(ref, 0x1 | 0x2 | 0x4 | XID_EVENT | 0x10)

    def nvmlDeviceRegisterEvents(self, h: Any, types_: Any, event_set: Any) -> int:
        d = self._dev(h)
        assert d is not None and ctypes.addressof(event_set.contents) == ctypes.addressof(self._event_set)
        if types_.value & XID_EVENT:
            self._registered.add(id(d))
        return SUCCESS

    def nvmlEventSetWait_v2(self, event_set: Any, ref: Any, timeout_ms: Any) -> int:
        for i, (d, code, gi, ci) in enumerate(self.xids):
            if id(d) in self._registered:
                del self.xids[i]
                ref._obj.device = ctypes.pointer(self._handles[id(d)])
                ref._obj.eventType, ref._obj.eventData = XID_EVENT, code
                ref._obj.gpuInstanceId, ref._obj.computeInstanceId = gi, ci
                return SUCCESS
        time.sleep(min(timeout_ms.value, 20) / 1000)
        return TIMEOUT

    def nvmlEventSetFree(self, event_set: Any) -> int:
        self._event_set = None
        return SUCCESS


def real_pynvml(driver: Driver) -> types.ModuleType:
    """A fresh copy of the installed pynvml whose library calls go to `driver`."""
    name = f"pynvml_over_test_driver_{next(_copies)}"
    spec = importlib.util.spec_from_file_location(name, pynvml.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pynvml attaches its NVMLError_* classes through sys.modules
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    module._LoadNvmlLibrary = lambda: None  # type: ignore[attr-defined]
    module.nvmlLib = driver  # type: ignore[attr-defined]
    module._nvmlGetFunctionPointer = driver.function(module)  # type: ignore[attr-defined]
    return module
