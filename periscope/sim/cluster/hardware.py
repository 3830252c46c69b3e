"""The simulated hardware: GPU models and their traits, GPUs, MIG instances and the kubelet device IDs
they are advertised as. Generated identifiers are hashes of the scenario seed, so they are stable.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from itertools import accumulate

from periscope.sim.scenario import Scenario, mig_memory_mib, mig_slices

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
DRIVER_VERSION = "550.54.15"  # what NVML reports and GPU Feature Discovery labels
# GPU-instance profile IDs by compute slices (nvml GPU_INSTANCE_PROFILE_*); 1g with 20 GB is 15.
GI_PROFILE = {1: 19, 2: 14, 3: 9, 4: 5, 7: 0}


def digest(seed: int, *parts: object) -> bytes:
    return hashlib.sha256("\x1f".join([str(seed), *map(str, parts)]).encode()).digest()


def gen_uuid(seed: int, *parts: object) -> str:
    """A version-4-shaped UUID fixed by (seed, parts)."""
    return str(uuid.UUID(bytes=digest(seed, *parts)[:16], version=4))


def model_profile(model: str) -> tuple[float, float, str]:
    for key, idle, peak, family in _MODELS:
        if key in model:
            return idle, peak, family
    return 30.0, 300.0, "unknown"


def power_temp(model: str, util: float) -> tuple[float, float]:
    """Board power (W) and temperature (°C) of a GPU of `model` that is `util` % busy."""
    idle_w, peak_w, _ = model_profile(model)
    return round(idle_w + (peak_w - idle_w) * util / 100.0, 1), round(32.0 + 0.45 * util, 1)


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
    index: int  # also the device minor number
    uuid: str
    model: str
    memory_mib: int
    pci_bus_id: str
    mig: tuple[MigInstance, ...] = ()
    sharing: str = "none"  # none | time-slicing | mps (MIG GPUs are never shared here)
    replicas: int = 1


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


def build_gpus(scenario: Scenario, node: str) -> tuple[Gpu, ...]:
    """The node's GPUs as the scenario lists them, MIG instances placed one after the other."""
    spec, seed = scenario.node(node), scenario.seed
    out: list[Gpu] = []
    for i, g in enumerate(spec.gpus):
        slices = [mig_slices(p) for p in g.mig]
        starts = list(accumulate(slices, initial=0))
        mig = tuple(
            MigInstance(
                uuid="MIG-" + gen_uuid(seed, "mig", node, i, k),
                profile=profile,
                gi=k + 1,
                ci=0,
                position=k,
                memory_mib=(mem := mig_memory_mib(profile)),
                profile_id=15 if n == 1 and mem >= 20 * 1024 else GI_PROFILE.get(n, 19),
                placement_start=starts[k],
                slices=n,
            )
            for k, (profile, n) in enumerate(zip(g.mig, slices, strict=True))
        )
        shared = spec.sharing.strategy if not g.mig else "none"
        replicas = spec.sharing.replicas or 1 if shared != "none" else 1
        pci = f"00000000:{0x07 + 0x10 * i:02X}:00.0"
        gpu_uuid = g.uuid or "GPU-" + gen_uuid(seed, "gpu", node, i)
        out.append(Gpu(node, i, gpu_uuid, g.model, g.memory_mib, pci, mig, shared, replicas))
    return tuple(out)


def gpu_devices(g: Gpu, shared_resource: str) -> list[Device]:
    """The kubelet devices a GPU is advertised as: its MIG instances, its replicas, or itself."""
    if g.mig:
        return [Device(m.uuid, f"nvidia.com/mig-{m.profile}", g, mig=m) for m in g.mig]
    if g.sharing != "none":
        return [Device(f"{g.uuid}::{r}", shared_resource, g, replica=r) for r in range(g.replicas)]
    return [Device(g.uuid, "nvidia.com/gpu", g)]
