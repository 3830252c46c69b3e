"""The plumbing under the fake pynvml module: NVML's errors as pynvml raises them, handle and struct
stand-ins, pynvml's constants, and the state file, re-read whenever the simulator has replaced it.

`NVMLError(code)` builds the subclass named after the code (`NVMLError_NotSupported`, ...), so the
probe's `except` clauses meet the classes they would meet on a real node.
"""

from __future__ import annotations

import ctypes
import os
import threading
import types
from pathlib import Path
from typing import Any, NoReturn

from periscope.sim.nvml.state import read_nvml_state

# NVML return codes 1..30 in order (nvml.h), plus Unknown = 999; pynvml names its classes after them.
_CODES = (
    "Uninitialized InvalidArgument NotSupported NoPermission AlreadyInitialized NotFound InsufficientSize "
    "InsufficientPower DriverNotLoaded Timeout IrqIssue LibraryNotFound FunctionNotFound CorruptedInforom "
    "GpuIsLost ResetRequired OperatingSystem LibRmVersionMismatch InUse Memory NoData VgpuEccNotSupported "
    "InsufficientResources FreqNotSupported ArgumentVersionMismatch Deprecated NotReady GpuNotFound "
    "InvalidState ResetTypeNotSupported"
)
ERRORS = {name: code for code, name in enumerate(_CODES.split(), start=1)} | {"Unknown": 999}
class NVMLError(Exception):
    """Base error; `NVMLError(code)` builds the matching subclass, as pynvml does."""

    value: int
    _by_code: dict[int, type[NVMLError]] = {}

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._by_code.get(value, NVMLError)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int | None = None) -> None:
        super().__init__(self.value)

    def __str__(self) -> str:
        for name, code in ERRORS.items():
            if code == self.value:
                return name
        return f"NVML Error with code {self.value}"


def _error_class(name: str, code: int) -> type[NVMLError]:
    def new(cls: type[NVMLError], *args: object) -> NVMLError:
        return NVMLError.__new__(cls, code)

    cls = type(f"NVMLError_{name}", (NVMLError,), {"__new__": new})
    NVMLError._by_code[code] = cls
    return cls


class NVMLLibraryMismatchError(Exception):
    """Raised by pynvml's unversioned calls when the driver lacks the versioned symbol."""


ERROR_CLASSES: dict[str, type[NVMLError]] = {n: _error_class(n, c) for n, c in ERRORS.items()}


def fail(name: str) -> NoReturn:
    """Raise the pynvml error named `name` (`NotSupported`, ...)."""
    raise ERROR_CLASSES[name](ERRORS[name])


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

    NVMLError = NVMLError
    NVML_SUCCESS = 0
    NVML_TEMPERATURE_GPU = 0
    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1
    nvmlEventTypeNone = 0
    nvmlEventTypeXidCriticalError = 0x8
    nvmlMemory_v2 = 0x02000028
    NVML_COMPUTEMODE_DEFAULT = 0
    NVML_COMPUTEMODE_PROHIBITED = 2
    NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3
    NVMLLibraryMismatchError = NVMLLibraryMismatchError
    NVML_VALUE_NOT_AVAILABLE_ulonglong = ctypes.c_ulonglong(-1)

    def __init__(self, state_path: str | Path) -> None:
        super().__init__("pynvml")
        self.state_path = Path(state_path)
        for name, cls in ERROR_CLASSES.items():
            setattr(self, f"NVMLError_{name}", cls)
            setattr(
                self,
                "NVML_ERROR_" + "".join("_" + ch if ch.isupper() else ch for ch in name)[1:].upper(),
                ERRORS[name],
            )
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
