"""Where the probe's `pynvml` module comes from: the NVIDIA driver's (`pynvml`), or an NVML stand-in
registered under the `periscope.nvml` entry points, named by the part before `:` in the probe's
NVML_BACKEND (`fake:<state-file>`: the development kit's simulated GPUs register `fake`).

The probe names no stand-in itself, so a production install without the development kit carries no
path into it: an unregistered name is refused when the backend is opened.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

ENTRY_POINTS = "periscope.nvml"


class UnknownBackend(ImportError):
    """NVML_BACKEND names a stand-in that no installed package registers (an ImportError: the probe
    and the doctor report it as they report a missing nvidia-ml-py)."""


def load_nvml(backend: str) -> Any:
    """The pynvml module for `backend`: `pynvml`, or `<name>:<argument>` given to the factory the
    `periscope.nvml` entry point `<name>` registers (it returns a module-like object with pynvml's API)."""
    if backend == "pynvml":
        import pynvml

        return pynvml
    name, _, argument = backend.partition(":")
    found = entry_points(group=ENTRY_POINTS, name=name)
    if not found:
        known = sorted(ep.name for ep in entry_points(group=ENTRY_POINTS))
        raise UnknownBackend(f"no NVML backend {name!r} is installed "
                             f"(registered: {', '.join(known) or 'none'})")
    factory = next(iter(found)).load()
    return factory(argument)
