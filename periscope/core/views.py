"""Output views built from engine state: PodAttribution, GpuState and XID findings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from periscope.core.allocation import Holding
from periscope.core.model import (
    DeviceSample,
    Finding,
    GpuState,
    MigRef,
    MigState,
    NodeTelemetry,
    Owner,
    PodAttribution,
    XidEvent,
)
from periscope.core.pods import PodRegistry
from periscope.core.rows import RowState
from periscope.core.usage import sharing_of

if TYPE_CHECKING:
    from periscope.core.engine import NodeState


def _owner(h: Holding) -> Owner:
    return Owner(h.pod_uid, h.namespace, h.pod, h.container, h.device.device_id)


def _owners(hs: list[Holding]) -> tuple[Owner, ...]:
    return tuple(sorted((_owner(h) for h in hs), key=lambda o: (o.device_id, o.pod_uid, o.container)))


def rows_by_pod(state: NodeState) -> dict[str, list[RowState]]:
    """Rows grouped by pod UID, each group in (container, device_id) order."""
    out: dict[str, list[RowState]] = {}
    for key in sorted(state.rows):
        out.setdefault(key[0], []).append(state.rows[key])
    return out


def pod_attribution(state: NodeState, uid: str, t_ms: int, rows: list[RowState]) -> PodAttribution | None:
    if not rows:
        return None
    rec = state.pods.get(uid)
    info = rec.info if rec and rec.start_ms <= t_ms else None
    return PodAttribution(
        pod_uid=uid,
        namespace=info.namespace if info else rows[0].namespace,
        pod=info.name if info else rows[0].pod,
        node=state.node,
        rows=tuple(r.to_row() for r in rows),
        owner_kind=info.owner_kind if info else "",
        owner_name=info.owner_name if info else "",
        phase=info.phase if info else "",
        created_ms=info.created_ms if info else 0,
        # As of t: a deletion learnt of early must not show before it happened (order independence).
        deleted_ms=rec.deleted_ms if rec and rec.deleted_ms <= t_ms else 0,
        as_of_ms=t_ms,
    )


def gpu_states(state: NodeState, tel: NodeTelemetry, holdings: list[Holding]) -> list[GpuState]:
    t = tel.meta.time_ms
    strategy = "time-slicing"
    if state.node_event is not None:
        strategy = state.node_event.label("nvidia.com/gpu.sharing-strategy", "time-slicing")
    out: list[GpuState] = []
    by_gpu: dict[str, list[Holding]] = {}
    for h in holdings:
        by_gpu.setdefault(h.device.gpu_uuid, []).append(h)
    children: dict[str, list[DeviceSample]] = {}
    for m in tel.devices:
        if m.parent_uuid and m.mig is not None:
            children.setdefault(m.parent_uuid, []).append(m)
    for d in tel.devices:
        if d.parent_uuid:
            continue
        on_gpu = by_gpu.get(d.uuid, [])
        migs = []
        for m in children.get(d.uuid, ()):
            if m.mig is None:
                continue
            mine = [h for h in on_gpu if h.device.mig is not None and h.device.mig.uuid == m.uuid]
            migs.append(
                MigState(
                    uuid=m.uuid, profile=m.mig.profile, gi=m.mig.gi, ci=m.mig.ci,
                    fb_used_mib=m.fb_used_mib, fb_total_mib=m.fb_total_mib, owners=_owners(mine),
                    util_pct=m.util_pct,
                )
            )
        migs.sort(key=lambda m: (m.gi, m.ci, m.uuid))
        sharing = "mig" if migs else sharing_of(on_gpu, strategy) if on_gpu else "exclusive"
        out.append(
            GpuState(
                node=state.node, gpu_uuid=d.uuid, model=state.devmap.models.get(d.uuid, ""),
                index=d.index, mig_devices=tuple(migs), sharing=sharing, util_pct=d.util_pct,
                fb_used_mib=d.fb_used_mib, fb_total_mib=d.fb_total_mib, power_w=d.power_w,
                temp_c=d.temp_c, owners=_owners(on_gpu), last_xid=state.last_xid.get(d.uuid),
                sample_ms=t, lost=d.lost, as_of_ms=t,
            )
        )
    return out


def _same_instance(a: MigRef, b: MigRef) -> bool:
    return (bool(b.uuid) and a.uuid == b.uuid) or (a.gi, a.ci) == (b.gi, b.ci)


def xid_finding(node: str, ev: XidEvent, holdings: list[Holding], pods: PodRegistry) -> Finding:
    """Owners of the device at the moment of the error (not at query time)."""
    hs = [h for h in holdings if h.device.gpu_uuid == ev.gpu_uuid]
    if ev.mig is not None:
        m = ev.mig
        hs = [h for h in hs if h.device.mig is not None and _same_instance(h.device.mig, m)]
    t = ev.meta.time_ms
    return Finding(
        kind="xid-owner", key=ev.gpu_uuid, node=node, at_ms=t, id=f"xid/{ev.gpu_uuid}/{t}/{ev.code}",
        gpu_uuid=ev.gpu_uuid, mig=ev.mig, xid_code=ev.code, owners=_owners(hs),
        message=f"XID {ev.code} on {ev.gpu_uuid} with {len(hs)} owner(s) at the time",
    )
