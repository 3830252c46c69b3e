"""NVML's errors as pynvml raises them: `NVMLError(code)` builds the subclass named after the code
(`NVMLError_NotSupported`, ...), so the probe's `except` clauses meet the classes they would meet on
a real node.
"""

from __future__ import annotations

from typing import NoReturn

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
