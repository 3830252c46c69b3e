"""Output views built from engine state: PodAttribution, GpuState and XID findings."""

from __future__ import annotations

from collections.abc import Sequence

from periscope.core.allocation import Holding
from periscope.core.holdings import HoldingIndex, owners_of
from periscope.core.model import (
    DeviceSample,
    Finding,
    GpuState,
    MigRef,
    MigState,
    NodeTelemetry,
    PodAttribution,
    XidEvent,
)
from periscope.core.pods import PodRegistry
from periscope.core.rows import RowState
from periscope.core.state import NodeState
from periscope.core.usage import device_util, sharing_of


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
    # As of t: a deletion learnt of early must not show before it happened (order independence).
    deleted_ms = rec.deleted_ms if rec and rec.deleted_ms <= t_ms else 0
    rows_out = tuple([r.to_row() for r in rows])
    if info is None:
        return PodAttribution(pod_uid=uid, namespace=rows[0].namespace, pod=rows[0].pod, node=state.node,
                              rows=rows_out, deleted_ms=deleted_ms, as_of_ms=t_ms)
    return PodAttribution(pod_uid=uid, namespace=info.namespace, pod=info.name, node=state.node,
                          rows=rows_out, owner_kind=info.owner_kind, owner_name=info.owner_name,
                          phase=info.phase, created_ms=info.created_ms, deleted_ms=deleted_ms, as_of_ms=t_ms)


def gpu_states(
    state: NodeState, tel: NodeTelemetry, ix: HoldingIndex, monitors: Sequence[Holding] = ()
) -> list[GpuState]:
    """One GpuState per physical GPU in the sample: its owners, and apart from them the pods with
    monitoring (admin-access) claims on it or its MIG instances."""
    t = tel.meta.time_ms
    strategy, _ = state.sharing()
    out: list[GpuState] = []
    by_gpu = ix.by_gpu
    children: dict[str, list[DeviceSample]] = {}
    for m in tel.devices:
        if m.parent_uuid and m.mig is not None:
            children.setdefault(m.parent_uuid, []).append(m)
    node, models, last_xid = state.node, state.devmap.models, state.last_xid
    watching: dict[str, list[Holding]] = {}
    for h in monitors:
        watching.setdefault(h.device.gpu_uuid, []).append(h)
    for d in tel.devices:
        if d.parent_uuid:
            continue
        on_gpu = by_gpu.get(d.uuid, ())
        watch = watching.get(d.uuid, ()) if watching else ()
        migs: list[MigState] = []
        for m in children.get(d.uuid, ()) if children else ():
            if m.mig is None:
                continue
            mine = [h for h in on_gpu if h.device.mig is not None and h.device.mig.uuid == m.uuid]
            seen = [h for h in watch if h.device.mig is not None and h.device.mig.uuid == m.uuid]
            migs.append(
                MigState(
                    uuid=m.uuid, profile=m.mig.profile, gi=m.mig.gi, ci=m.mig.ci,
                    fb_used_mib=m.fb_used_mib, fb_total_mib=m.fb_total_mib, owners=owners_of(mine),
                    util_pct=device_util(m)[0], monitors=owners_of(seen),
                )
            )
        if migs:
            migs.sort(key=lambda m: (m.gi, m.ci, m.uuid))
            sharing = "mig"
        else:
            sharing = sharing_of(on_gpu, strategy) if on_gpu else "exclusive"
        out.append(GpuState(
            node=node, gpu_uuid=d.uuid, model=models.get(d.uuid, ""), index=d.index, mig_devices=tuple(migs),
            sharing=sharing,
            util_pct=d.util_pct if d.util_pct is not None or d.dcgm is None else device_util(d)[0],
            fb_used_mib=d.fb_used_mib, fb_total_mib=d.fb_total_mib, power_w=d.power_w, temp_c=d.temp_c,
            owners=ix.owners(d.uuid), last_xid=last_xid.get(d.uuid),
            sample_ms=t, lost=d.lost, as_of_ms=t,
            monitors=owners_of([h for h in watch if h.device.mig is None]) if watch else (),
        ))
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
        gpu_uuid=ev.gpu_uuid, mig=ev.mig, xid_code=ev.code, owners=owners_of(hs),
        message=f"XID {ev.code} on {ev.gpu_uuid} with {len(hs)} owner(s) at the time",
    )
