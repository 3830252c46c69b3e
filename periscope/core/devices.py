"""Device identity: resolve a kubelet device ID to the physical GPU (and MIG instance) it names.

Kubelet IDs come as GPU-<uuid>, GPU-<uuid>::N (time-slicing/MPS replica), MIG-<uuid>, the old
MIG-GPU-<uuid>/<gi>/<ci>, or GKE's nvidia<N>[/gi<M>]. MIG UUIDs differ from the parent's, so the node's
device inventory is needed to find the parent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from periscope.core.deviceid import parse_device_id
from periscope.core.model import DeviceInventory, MigRef


@dataclass(frozen=True, slots=True)
class Resolved:
    device_id: str
    gpu_uuid: str  # physical GPU; "" when it cannot be resolved
    mig: MigRef | None = None
    replica: int | None = None

    @property
    def instance(self) -> str:
        """The unit usage is measured on: the MIG instance, else the GPU."""
        return self.mig.uuid if self.mig else self.gpu_uuid


@dataclass(slots=True)
class DeviceMap:
    """Lookup tables built from the latest DeviceInventory."""

    by_index: dict[int, str] = field(default_factory=dict)
    mig_by_uuid: dict[str, tuple[str, MigRef]] = field(default_factory=dict)
    mig_by_pos: dict[tuple[str, int, int], MigRef] = field(default_factory=dict)
    mig_by_gi: dict[tuple[str, int], MigRef] = field(default_factory=dict)
    gpu_memory: dict[str, float] = field(default_factory=dict)
    mig_memory: dict[str, float] = field(default_factory=dict)
    models: dict[str, str] = field(default_factory=dict)
    indexes: dict[str, int] = field(default_factory=dict)
    minors: dict[int, str] = field(default_factory=dict)

    @classmethod
    def from_inventory(cls, inv: DeviceInventory | None) -> DeviceMap:
        m = cls()
        if inv is None:
            return m
        for g in inv.gpus:
            m.by_index[g.index] = g.uuid
            m.minors[g.minor] = g.uuid
            m.gpu_memory[g.uuid] = g.memory_mib
            m.models[g.uuid] = g.model
            m.indexes[g.uuid] = g.index
            for d in g.mig_devices:
                ref = MigRef(uuid=d.uuid, profile=d.profile, gi=d.gi, ci=d.ci)
                m.mig_by_uuid[d.uuid] = (g.uuid, ref)
                m.mig_by_pos[(g.uuid, d.gi, d.ci)] = ref
                m.mig_by_gi.setdefault((g.uuid, d.gi), ref)
                m.mig_memory[d.uuid] = d.memory_mib
        return m

    def resolve(self, device_id: str) -> Resolved:
        try:
            d = parse_device_id(device_id)
        except ValueError:
            return Resolved(device_id=device_id, gpu_uuid="")
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
            return Resolved(device_id, "", MigRef(uuid=d.uuid or device_id), d.replica)
        if d.index is not None and d.index in self.by_index:
            gpu = self.by_index[d.index]
            if d.kind == "gke-mig" and d.gi is not None:
                ref = self.mig_by_gi.get((gpu, d.gi)) or MigRef(uuid=f"{gpu}/gi{d.gi}", gi=d.gi)
                return Resolved(device_id, gpu, ref, d.replica)
            return Resolved(device_id, gpu, None, d.replica)
        return Resolved(device_id, "", None, d.replica)

    def gpu_for_minor(self, minor: int) -> str | None:
        return self.minors.get(minor)

    def fraction(self, r: Resolved) -> float:
        """Share of the physical GPU a MIG instance is (by memory); 1.0 for whole GPUs."""
        if r.mig is None:
            return 1.0
        total = self.gpu_memory.get(r.gpu_uuid, 0.0)
        part = self.mig_memory.get(r.mig.uuid, 0.0)
        return round(part / total, 4) if total > 0 and part > 0 else 1.0
