"""The plumbing under the fake pynvml module: pynvml's own errors and constants, handle and struct
stand-ins, and the state file, re-read whenever the simulator has replaced it.
"""

from __future__ import annotations

import os
import threading
import types
from pathlib import Path
from typing import Any, NoReturn

import pynvml

from periscope.sim.nvml.state import read_nvml_state

# pynvml's own error classes (NVMLError_NotSupported, ...), codes and constants: importing pynvml loads no
# library, and the probe's `except` clauses then meet exactly the classes a real node raises.
_PYNVML = {
    k: v
    for k, v in vars(pynvml).items()
    if k.startswith(("NVML", "nvmlEventType", "nvmlMemory_")) and (not callable(v) or isinstance(v, type))
}


def fail(name: str) -> NoReturn:
    """Raise the pynvml error named `name` (`NotSupported`, ...)."""
    raise getattr(pynvml, f"NVMLError_{name}")()


_MIB = 1024 * 1024
MPS_SERVER_PATH = "nvidia-cuda-mps-server"  # what nvmlSystemGetProcessName names the MPS server


class _Obj(types.SimpleNamespace):
    """Attribute bag standing in for the ctypes structs pynvml returns."""


class _Device:
    __slots__ = ("mig", "uuid")

    def __init__(self, uuid: str, mig: bool) -> None:
        self.uuid, self.mig = uuid, mig

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Device) and other.uuid == self.uuid

    def __hash__(self) -> int:
        return hash(self.uuid)


class _EventSet:
    def __init__(self, baseline: int) -> None:
        self.baseline = baseline
        self.devices: set[str] = set()
        self.delivered: set[int] = set()
        self.freed = False


def _num(value: Any) -> int | float:
    """Percentages as the state gives them: NVML reports whole numbers, but a simulator may keep
    fractions so that its ground truth and the attributed shares can be compared exactly."""
    number = float(value)
    return int(number) if number.is_integer() else number


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

    # ------------------------------------------------------------------ state access

    def _load(self) -> dict[str, Any]:
        with self._lock:
            try:
                st = os.stat(self.state_path)
            except OSError:
                fail("DriverNotLoaded")
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if stamp != self._stamp:
                self._state = read_nvml_state(self.state_path)
                self._stamp = stamp
            return self._state

    def _ready(self) -> dict[str, Any]:
        if not self._initialized:
            fail("Uninitialized")
        return self._load()

    def _find(
        self, dev: _Device, call: str, metric: bool = True
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """(gpu, mig-or-None) for a handle; applies `lost` and injected failures."""
        if not isinstance(dev, _Device):
            fail("InvalidArgument")
        for gpu in self._ready().get("gpus", []):
            if gpu["uuid"] == dev.uuid:
                found: tuple[dict[str, Any], dict[str, Any] | None] = (gpu, None)
                break
            mig = next((m for m in gpu.get("mig") or [] if m["uuid"] == dev.uuid), None)
            if mig is not None:
                found = (gpu, mig)
                break
        else:
            fail("GpuIsLost")  # the device vanished from the bus
        gpu = found[0]
        if metric and gpu.get("lost"):
            fail("GpuIsLost")
        failure = gpu.get("fail", {}).get(call)
        if failure:
            fail(failure)
        return found
