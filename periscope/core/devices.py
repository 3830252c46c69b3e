"""Device identity: resolve a kubelet device ID to the physical GPU (and MIG instance) it names.

Kubelet IDs come as GPU-<uuid>, GPU-<uuid>::N (time-slicing/MPS replica), GPU-<uuid>-N (HAMi),
MIG-<uuid>, the old MIG-GPU-<uuid>/<gi>/<ci>, or GKE's nvidia<minor>[/gi<G>][/vgpu<N>]. MIG UUIDs differ
from the parent's, and GKE names GPUs by device minor, so the node's device inventory is needed. An ID
that cannot be resolved is never guessed at: it resolves to gpu_uuid "" with the reason in `unresolved`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from periscope.core.deviceid import parse_device_id
from periscope.core.model import DeviceInventory, MigRef


@dataclass(frozen=True, slots=True)
class Resolved:
    device_id: str
    gpu_uuid: str  # physical GPU; "" when it cannot be resolved
    mig: MigRef | None = None
    replica: int | None = None
    unresolved: str = ""  # why gpu_uuid is "" ("" when resolved)

    @property
    def instance(self) -> str:
        """The unit usage is measured on: the MIG instance, else the GPU."""
        return self.mig.uuid if self.mig else self.gpu_uuid


# What a node without MIG has in each MIG table: one empty mapping for every node (a worker keeps a
# DeviceMap per node; four empty dicts of its own cost each node 256 bytes). Typed read-only, so mypy
# refuses a store into it; a plain dict, so states still pickle (replay hands them back so).
_NONE: Mapping[Any, Any] = {}


@dataclass(slots=True)
class DeviceMap:
    """Lookup tables built from the latest DeviceInventory (read-only once built)."""

    mig_by_uuid: Mapping[str, tuple[str, MigRef]] = field(default_factory=lambda: _NONE)
    mig_by_pos: Mapping[tuple[str, int, int], MigRef] = field(default_factory=lambda: _NONE)
    mig_by_gi: Mapping[tuple[str, int], MigRef] = field(default_factory=lambda: _NONE)
    mig_memory: Mapping[str, float] = field(default_factory=lambda: _NONE)
    gpu_memory: dict[str, float] = field(default_factory=dict)
    models: dict[str, str] = field(default_factory=dict)
    minors: dict[int, str] = field(default_factory=dict)
    known: bool = False  # an inventory was seen
    minors_unknown: int = 0  # GPUs whose minor NVML did not report

    @classmethod
    def from_inventory(cls, inv: DeviceInventory | None) -> DeviceMap:
        m = cls()
        if inv is None:
            return m
        m.known = True
        by_uuid: dict[str, tuple[str, MigRef]] = {}
        by_pos: dict[tuple[str, int, int], MigRef] = {}
        by_gi: dict[tuple[str, int], MigRef] = {}
        memory: dict[str, float] = {}
        for g in inv.gpus:
            if g.minor is None:
                m.minors_unknown += 1
            else:
                m.minors[g.minor] = g.uuid
            m.gpu_memory[g.uuid] = g.memory_mib
            m.models[g.uuid] = g.model
            for d in g.mig_devices:
                ref = MigRef(uuid=d.uuid, profile=d.profile, gi=d.gi, ci=d.ci)
                by_uuid[d.uuid] = (g.uuid, ref)
                by_pos[(g.uuid, d.gi, d.ci)] = ref
                by_gi.setdefault((g.uuid, d.gi), ref)
                memory[d.uuid] = d.memory_mib
        if by_uuid:
            m.mig_by_uuid, m.mig_by_pos, m.mig_by_gi, m.mig_memory = by_uuid, by_pos, by_gi, memory
        return m

    def resolve(self, device_id: str) -> Resolved:
        try:
            d = parse_device_id(device_id)
        except ValueError as e:
            return Resolved(device_id=device_id, gpu_uuid="", unresolved=str(e))
        if d.kind == "gpu":
            return Resolved(device_id, d.uuid or "", None, d.replica)
        if d.kind == "mig":
            if d.uuid and d.uuid in self.mig_by_uuid:
                parent, ref = self.mig_by_uuid[d.uuid]
                return Resolved(device_id, parent, ref, d.replica)
            if d.parent_uuid is not None and d.gi is not None and d.ci is not None:
                ref = self.mig_by_pos.get((d.parent_uuid, d.gi, d.ci)) or MigRef(
                    uuid=d.uuid or device_id, gi=d.gi, ci=d.ci
                )
                return Resolved(device_id, d.parent_uuid, ref, d.replica)
            # A MIG device the inventory does not (yet) know: keep its own UUID, parent unknown.
            why = "MIG device not in the node's NVML inventory" if self.known else _NO_INVENTORY
            return Resolved(device_id, "", MigRef(uuid=d.uuid or device_id), d.replica, why)
        gpu = self.minors.get(d.minor) if d.minor is not None else None
        if gpu is None:
            return Resolved(device_id, "", None, d.replica, self._no_minor(d.minor))
        if d.kind == "gke-mig" and d.gi is not None:
            ref = self.mig_by_gi.get((gpu, d.gi)) or MigRef(uuid=f"{gpu}/gi{d.gi}", gi=d.gi)
            return Resolved(device_id, gpu, ref, d.replica)
        return Resolved(device_id, gpu, None, d.replica)

    def _no_minor(self, minor: int | None) -> str:
        if not self.known:
            return _NO_INVENTORY
        why = f"no GPU with device minor {minor} in the node's NVML inventory"
        if self.minors_unknown:
            why += f" ({self.minors_unknown} GPUs did not report their minor)"
        return why

    def gpu_for_minor(self, minor: int) -> str | None:
        return self.minors.get(minor)

    def fraction(self, r: Resolved) -> float:
        """Share of the physical GPU a MIG instance is (by memory); 1.0 for whole GPUs."""
        if r.mig is None:
            return 1.0
        total = self.gpu_memory.get(r.gpu_uuid, 0.0)
        part = self.mig_memory.get(r.mig.uuid, 0.0)
        return round(part / total, 4) if total > 0 and part > 0 else 1.0


_NO_INVENTORY = "no NVML inventory from the node's probe yet"
