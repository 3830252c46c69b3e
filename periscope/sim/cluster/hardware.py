"""The simulated hardware: GPU models and their traits, GPUs, MIG instances and the kubelet device IDs
they are advertised as. Generated identifiers are hashes of the scenario seed, so they are stable.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

# (idle watts, max watts, GPU family) by a substring of the product name; first match wins.
_MODELS = (
    ("H200", 75.0, 700.0, "hopper"),
    ("H100", 70.0, 700.0, "hopper"),
    ("A100", 50.0, 400.0, "ampere"),
    ("A30", 30.0, 165.0, "ampere"),
    ("A10", 20.0, 150.0, "ampere"),
    ("L40", 35.0, 300.0, "ada-lovelace"),
    ("L4", 15.0, 72.0, "ada-lovelace"),
    ("T4", 10.0, 70.0, "turing"),
    ("V100", 40.0, 300.0, "volta"),
)
_MIG_CAPABLE = ("A100", "A30", "H100", "H200", "B200", "GB200")
# GPU-instance profile IDs by compute slices (nvml GPU_INSTANCE_PROFILE_*); 1g with 20 GB is 15.
GI_PROFILE = {1: 19, 2: 14, 3: 9, 4: 5, 7: 0}


def digest(seed: int, *parts: object) -> bytes:
    return hashlib.sha256("\x1f".join([str(seed), *map(str, parts)]).encode()).digest()


def gen_uuid(seed: int, *parts: object) -> str:
    """A version-4-shaped UUID fixed by (seed, parts)."""
    b = bytearray(digest(seed, *parts)[:16])
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def model_profile(model: str) -> tuple[float, float, str]:
    for key, idle, peak, family in _MODELS:
        if key in model:
            return idle, peak, family
    return 30.0, 300.0, "unknown"


def mig_capable(model: str) -> bool:
    return any(key in model for key in _MIG_CAPABLE)


@dataclass(frozen=True, slots=True)
class MigInstance:
    uuid: str
    profile: str
    gi: int
    ci: int
    position: int  # index in the GPU's `mig:` list (the "0:<k>" pin)
    memory_mib: int
    profile_id: int
    placement_start: int
    slices: int


@dataclass(frozen=True, slots=True)
class Gpu:
    node: str
    index: int
    uuid: str
    model: str
    memory_mib: int
    pci_bus_id: str
    mig: tuple[MigInstance, ...] = ()
    sharing: str = "none"  # none | time-slicing | mps (MIG GPUs are never shared here)
    replicas: int = 1

    @property
    def minor(self) -> int:
        return self.index


@dataclass(frozen=True, slots=True)
class Device:
    """One kubelet device ID (what PodResources and the checkpoint list)."""

    id: str
    resource: str
    gpu: Gpu
    mig: MigInstance | None = None
    replica: int | None = None

    @property
    def sharing(self) -> str:
        if self.mig is not None:
            return "mig"
        return "exclusive" if self.gpu.sharing == "none" else self.gpu.sharing
