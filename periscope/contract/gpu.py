"""A physical GPU as users read it: its latest sample, its owners (and, apart, the pods that only
monitor it), its MIG slices with theirs, its last XID. /v1/gpus rows and `periscope replay` items."""

from __future__ import annotations

from pydantic import BaseModel, Field

from periscope.contract.values import Json, OwnerRef, num, owners_json, text, time_json
from periscope.core.model import GpuState, MigState

_MONITORS = ("pods whose DRA claim has admin (monitoring) access: they own nothing and take no share of "
             "the usage")
HIDDEN_OWNERS = "owners in namespaces the caller may not see, left out (0 where nothing is hidden)"


class MigDevice(BaseModel):
    uuid: str | None
    profile: str | None
    gi: int
    ci: int
    owners: list[OwnerRef]
    monitors: list[OwnerRef] = Field(default_factory=list, description=_MONITORS)
    util_pct: float | None
    fb_used_mib: float | None
    fb_total_mib: float | None


def mig_state_json(m: MigState) -> Json:
    return {
        "uuid": m.uuid or None, "profile": m.profile or None, "gi": m.gi, "ci": m.ci,
        "owners": owners_json(m.owners), "monitors": owners_json(m.monitors),
        "util_pct": num(m.util_pct), "fb_used_mib": num(m.fb_used_mib), "fb_total_mib": num(m.fb_total_mib),
    }


class LastXid(BaseModel):
    code: int
    at: str | None


class Gpu(BaseModel):
    node: str
    gpu_uuid: str
    model: str | None
    index: int
    mig_devices: list[MigDevice]
    sharing: str = Field(description="exclusive | time-slicing | mps | mig")
    util_pct: float | None
    fb_used_mib: float | None
    fb_total_mib: float | None
    power_w: float | None
    temp_c: float | None
    owners: list[OwnerRef]
    hidden_owners: int = Field(0, description=HIDDEN_OWNERS)
    monitors: list[OwnerRef] = Field(default_factory=list, description=_MONITORS)
    last_xid: LastXid | None
    sample_at: str | None
    lost: bool = Field(description="the GPU fell off the bus")
    as_of: str | None = Field(None, description="event time of this state")


def gpu_json(g: GpuState) -> Json:
    return {
        "node": g.node, "gpu_uuid": g.gpu_uuid, "model": text(g.model), "index": g.index,
        "mig_devices": [mig_state_json(m) for m in g.mig_devices], "sharing": g.sharing,
        "util_pct": num(g.util_pct), "fb_used_mib": num(g.fb_used_mib), "fb_total_mib": num(g.fb_total_mib),
        "power_w": num(g.power_w), "temp_c": num(g.temp_c), "owners": owners_json(g.owners),
        "hidden_owners": 0, "monitors": owners_json(g.monitors),
        "last_xid": {"code": g.last_xid.code, "at": time_json(g.last_xid.at_ms)} if g.last_xid else None,
        "sample_at": time_json(g.sample_ms), "lost": g.lost, "as_of": time_json(g.as_of_ms),
    }
