"""The fake NVML's state file, and the plumbing every fake pynvml call stands on: pynvml's own errors
and constants, handle and struct stand-ins, and the state re-read whenever the simulator replaced it.

State (one file per simulated node; every key but `gpus[].uuid` optional):

    {"driver_version": "550.54.15", "cuda_driver_version": 12040,
     "gpus": [{"uuid": "GPU-...", "name": "NVIDIA A100-SXM4-80GB", "minor": 0,
               "pci_bus_id": "00000000:07:00.0", "memory_total_mib": 81920, "memory_used_mib": 512,
               "util_pct": 40, "mem_util_pct": 10, "power_w": 210.5, "temp_c": 51,
               "lost": false,                      # true: metric calls raise NVMLError_GpuIsLost
               "fail": {"nvmlDeviceGetPowerUsage": "NotSupported"},   # injected errors by call
               "processes": [{"pid": 4242, "used_mib": 500, "sm_util": 35, "mem_util": 8,
                              "name": "python3"}],     # name: what nvmlSystemGetProcessName answers
               "graphics_processes": [],           # listed by nvmlDeviceGetGraphicsRunningProcesses
               "mps": {"server_pid": 77, "server_used_mib": 30, "utilization": "clients"},
                       # MPS on: `processes` are the clients, listed only by the MPS call; the compute
                       # list holds the server alone; compute mode EXCLUSIVE_PROCESS. `utilization`:
                       # clients (samples per client) | server (one sample, the server's PID) | none
                       # (NotSupported)
               "mig_capable": true,                # MIG mode [0, 0]; without it: NotSupported
               "mig": [{"uuid": "MIG-...", "profile": "1g.10gb", "gi": 9, "ci": 0,
                        "profile_id": 19, "placement_start": 0, "placement_size": 1,
                        "memory_total_mib": 9856, "memory_used_mib": 100,
                        "processes": [{"pid": 4343, "used_mib": 100}]}],    # "mig" set: enabled
               "mig_list_needs_privilege": false}],  # true: the whole-GPU list on MIG: NoPermission
     "xids": [{"seq": 1, "gpu": "GPU-...", "code": 79, "gi": null, "ci": null}]}

XIDs: an event set delivers, once, each XID of a registered GPU whose `seq` is above the highest
`seq` present when the set was created, as NVML delivers only events that happen after registration.
`add_xid(state, gpu_uuid, code)` appends one with the next `seq`. Per-process utilization is sampled
at call time: every process with `sm_util` yields one sample stamped with the current time in µs.
"""

from __future__ import annotations

import json
import os
import threading
import time
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pynvml

from periscope.sim.procfs import atomic_write

Gpu = dict[str, Any]  # one entry of `gpus` (or of a GPU's `mig`) in the state

# pynvml's own error classes (NVMLError_NotSupported, ...), codes and constants: importing pynvml loads no
# library, and the probe's `except` clauses then meet exactly the classes a real node raises.
_PYNVML = {
    k: v
    for k, v in vars(pynvml).items()
    if k.startswith(("NVML", "nvmlEventType", "nvmlMemory_")) and (not callable(v) or isinstance(v, type))
}


def write_nvml_state(path: str | Path, state: Mapping[str, Any]) -> None:
    """Write the state so that readers never see a partial file (temp file + rename), with an mtime
    later than its last write's: readers tell versions apart by (inode, mtime, size), a rename
    alternates two inodes, and a coarse kernel clock gives writes within one tick the same mtime (a
    simulator that fell behind writes several ticks at once), so a reader would keep a stale state."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        last = os.stat(target).st_mtime_ns
    except FileNotFoundError:
        last = 0
    atomic_write(target, json.dumps(state), mtime_ns=max(time.time_ns(), last + 1))


MAX_STATE_BYTES = 64 * 1024 * 1024  # a simulated node's state is kilobytes


def read_nvml_state(path: str | Path) -> dict[str, Any]:
    """The state file's content; OSError when it cannot be read, ValueError when it is not a state (not
    JSON, not a mapping whose `gpus` are mappings with a string `uuid`, or over MAX_STATE_BYTES)."""
    with open(path, "rb") as f:
        data = f.read(MAX_STATE_BYTES + 1)
    if len(data) > MAX_STATE_BYTES:
        raise ValueError(f"larger than {MAX_STATE_BYTES // (1024 * 1024)} MiB")
    try:
        state = json.loads(data)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    gpus = state.get("gpus", []) if isinstance(state, dict) else None
    if not isinstance(gpus, list) or not all(
        isinstance(g, dict) and isinstance(g.get("uuid"), str)
        and all(isinstance(m, dict) and isinstance(m.get("uuid"), str) for m in g.get("mig") or [])
        for g in gpus
    ):
        raise ValueError("not an NVML state (a mapping whose gpus each have a uuid)")
    return state


def add_xid(
    state: dict[str, Any], gpu_uuid: str, code: int, gi: int | None = None, ci: int | None = None
) -> dict[str, Any]:
    xids = state.setdefault("xids", [])
    seq = max((int(x.get("seq", 0)) for x in xids), default=0) + 1
    xids.append({"seq": seq, "gpu": gpu_uuid, "code": code, "gi": gi, "ci": ci})
    return state


NO_INSTANCE = 0xFFFFFFFF  # the GPU/compute instance id NVML reports outside MIG
Struct = types.SimpleNamespace  # stands in for the ctypes structs pynvml returns


def percent(value: Any) -> int | float:
    """Percentages as the state gives them: NVML reports whole numbers, but a simulator may keep
    fractions so that its ground truth and the attributed shares can be compared exactly."""
    number = float(value)
    return int(number) if number.is_integer() else number


def mib_bytes(mib: Any) -> int:
    return int(float(mib) * 1024 * 1024)


def instance_id(value: Any) -> int:
    return NO_INSTANCE if value is None else int(value)


def fail(name: str) -> NoReturn:
    """Raise the pynvml error named `name` (`NotSupported`, ...)."""
    raise getattr(pynvml, f"NVMLError_{name}")()


@dataclass(frozen=True, slots=True)
class Device:
    """A device handle: equal (and hashed) by UUID alone."""

    uuid: str
    mig: bool = field(compare=False)


@dataclass(slots=True, eq=False)
class EventSet:
    baseline: int  # the highest XID seq when the set was created; only later ones are delivered
    devices: set[str] = field(default_factory=set)
    delivered: set[int] = field(default_factory=set)
    freed: bool = False


class NvmlBase(types.ModuleType):
    """What every pynvml call stands on: the module's constants and error classes, and the state file
    re-read when it changes."""

    NVMLError = pynvml.NVMLError

    def __init__(self, state_path: str | Path) -> None:
        super().__init__("pynvml")
        self.state_path = Path(state_path)
        self.__dict__.update(_PYNVML)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._state: dict[str, Any] = {}
        self._initialized = 0

    def _load(self) -> dict[str, Any]:
        with self._lock:
            try:
                st = os.stat(self.state_path)
            except OSError:
                fail("DriverNotLoaded")
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if stamp != self._stamp:
                try:
                    self._state = read_nvml_state(self.state_path)
                except (OSError, ValueError):  # a driver that answers nonsense: NVML's catch-all error
                    fail("Unknown")
                self._stamp = stamp
            return self._state

    def _ready(self) -> dict[str, Any]:
        if not self._initialized:
            fail("Uninitialized")
        return self._load()

    def _gpus(self) -> list[Gpu]:
        gpus: list[Gpu] = self._ready().get("gpus", [])
        return gpus

    def _lookup(self, uuid: str) -> tuple[Gpu, Gpu | None] | None:
        """(gpu, mig-or-None) for a GPU or MIG device UUID, None when no such device."""
        for gpu in self._gpus():
            if gpu["uuid"] == uuid:
                return gpu, None
            mig = next((m for m in gpu.get("mig") or [] if m["uuid"] == uuid), None)
            if mig is not None:
                return gpu, mig
        return None

    def _find(
        self, dev: Device, call: str, metric: bool = True, whole: bool = False
    ) -> tuple[Gpu, Gpu | None]:
        """(gpu, mig-or-None) for a handle; applies `lost` and injected failures. `whole`: a call a MIG
        device handle answers with NotSupported, as on real MIG devices."""
        if not isinstance(dev, Device):
            fail("InvalidArgument")
        found = self._lookup(dev.uuid)
        if found is None:
            fail("GpuIsLost")  # the device vanished from the bus
        gpu, mig = found
        if metric and gpu.get("lost"):
            fail("GpuIsLost")
        failure = gpu.get("fail", {}).get(call)
        if failure:
            fail(failure)
        if whole and mig is not None:
            fail("NotSupported")
        return found
