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
    # Positional, in POD_FIELDS order (every pod of every sample; see rows.ROW_FIELDS for why).
    if info is None:
        return PodAttribution(uid, rows[0].namespace, rows[0].pod, state.node, rows_out, "", "", "", 0,
                              deleted_ms, t_ms)
    return PodAttribution(uid, info.namespace, info.name, state.node, rows_out, info.owner_kind,
                          info.owner_name, info.phase, info.created_ms, deleted_ms, t_ms)


POD_FIELDS = ("pod_uid", "namespace", "pod", "node", "rows", "owner_kind", "owner_name", "phase",
              "created_ms", "deleted_ms", "as_of_ms")


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
        # Positional, in GPU_FIELDS order (every device of every sample; see rows.ROW_FIELDS for why).
        out.append(GpuState(
            node, d.uuid, models.get(d.uuid, ""), d.index, tuple(migs), sharing,
            d.util_pct if d.util_pct is not None or d.dcgm is None else device_util(d)[0],
            d.fb_used_mib, d.fb_total_mib, d.power_w, d.temp_c, ix.owners(d.uuid), last_xid.get(d.uuid),
            t, d.lost, t, owners_of([h for h in watch if h.device.mig is None]) if watch else (),
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


GPU_FIELDS = ("node", "gpu_uuid", "model", "index", "mig_devices", "sharing", "util_pct", "fb_used_mib",
              "fb_total_mib", "power_w", "temp_c", "owners", "last_xid", "sample_ms", "lost", "as_of_ms",
              "monitors")
