"""Domain objects -> the JSON shapes of the HTTP contract (CONTRACTS.md, "HTTP API").

Pure functions: no view state, no I/O. Times are Unix ms in the domain and RFC 3339 UTC strings with
milliseconds on the wire; 0 means "unknown" and renders as null.
"""

from __future__ import annotations

from typing import Any

from periscope import wirejson
from periscope.core.model import (
    AttributionRow,
    Finding,
    GpuState,
    MigState,
    Owner,
    PodAttribution,
    WindowStat,
)
from periscope.wirejson import mig_json, num

Json = dict[str, Any]


def rfc3339(ms: int) -> str | None:
    """Unix ms -> RFC 3339; 0 (unknown) and times past year 9999 -> null."""
    if not ms:
        return None
    try:
        return wirejson.rfc3339(ms)
    except OverflowError:
        return None


def pod_row(pod: PodAttribution, row: AttributionRow) -> Json:
    """One /v1/pods row: pod x container x device."""
    return {
        "pod_uid": pod.pod_uid,
        "namespace": pod.namespace,
        "pod": pod.pod,
        "container": row.container,
        "node": pod.node,
        "device_id": row.device_id,
        "gpu_uuid": row.gpu_uuid,
        "mig": mig_json(row.mig),
        "sharing": row.sharing,
        "share_basis": row.share_basis,
        "util_pct": num(row.util_pct),
        "fb_used_mib": num(row.fb_used_mib),
        "power_w": num(row.power_w),
        "active": row.active,
        "idle": row.idle,
        "first_seen": rfc3339(row.first_seen_ms),
        "last_seen": rfc3339(row.last_seen_ms),
        "sources": list(row.sources),
        "gpu_fraction": num(row.gpu_fraction),
        "sample_at": rfc3339(row.sample_ms),
        "unresolved": row.unresolved or None,
        "sm_active_pct": num(row.sm_active_pct),
        "sm_occupancy_pct": num(row.sm_occupancy_pct),
        "tensor_active_pct": num(row.tensor_active_pct),
        "dram_active_pct": num(row.dram_active_pct),
    }


def window_json(w: WindowStat) -> Json:
    return {
        "start": rfc3339(w.start_ms),
        "samples": w.samples,
        "avg_util_pct": num(w.util_sum / w.util_samples) if w.util_samples else None,
        "fb_max_mib": num(w.fb_max_mib),
        "avg_power_w": num(w.power_sum_w / w.samples) if w.samples else None,
    }


def pod_detail(pod: PodAttribution, rows: list[Json]) -> Json:
    owner = {"kind": pod.owner_kind, "name": pod.owner_name} if (pod.owner_kind or pod.owner_name) else None
    return {
        "pod_uid": pod.pod_uid,
        "namespace": pod.namespace,
        "pod": pod.pod,
        "node": pod.node,
        "owner": owner,
        "phase": pod.phase,
        "created": rfc3339(pod.created_ms),
        "deleted": rfc3339(pod.deleted_ms),
        "as_of": rfc3339(pod.as_of_ms),
        "rows": rows,
    }


def owner_json(o: Owner) -> Json:
    return {
        "pod_uid": o.pod_uid,
        "namespace": o.namespace,
        "pod": o.pod,
        "container": o.container,
        "device_id": o.device_id,
    }


def mig_state_json(m: MigState) -> Json:
    return {
        "uuid": m.uuid,
        "profile": m.profile,
        "gi": m.gi,
        "ci": m.ci,
        "owners": [owner_json(o) for o in m.owners],
        "monitors": [owner_json(o) for o in m.monitors],
        "util_pct": num(m.util_pct),
        "fb_used_mib": num(m.fb_used_mib),
        "fb_total_mib": num(m.fb_total_mib),
    }


def gpu_row(g: GpuState) -> Json:
    return {
        "node": g.node,
        "gpu_uuid": g.gpu_uuid,
        "model": g.model,
        "index": g.index,
        "mig_devices": [mig_state_json(m) for m in g.mig_devices],
        "sharing": g.sharing,
        "util_pct": num(g.util_pct),
        "fb_used_mib": num(g.fb_used_mib),
        "fb_total_mib": num(g.fb_total_mib),
        "power_w": num(g.power_w),
        "temp_c": num(g.temp_c),
        "owners": [owner_json(o) for o in g.owners],
        "hidden_owners": 0,  # set by services.api.access for a namespace-scoped caller
        # admin-access (monitoring) DRA claims: they neither own the GPU nor take a share of it
        "monitors": [owner_json(o) for o in g.monitors],
        "last_xid": {"code": g.last_xid.code, "at": rfc3339(g.last_xid.at_ms)} if g.last_xid else None,
        "sample_at": rfc3339(g.sample_ms),
        "lost": g.lost,
    }


def xid_row(f: Finding) -> Json:
    """An xid-owner finding: the owners recorded when the error happened, not the current ones."""
    mig = (
        None
        if f.mig is None
        else {"gi": f.mig.gi, "ci": f.mig.ci, "uuid": f.mig.uuid, "profile": f.mig.profile}
    )
    return {
        "at": rfc3339(f.at_ms),
        "node": f.node,
        "gpu_uuid": f.gpu_uuid,
        "mig": mig,
        "code": f.xid_code,
        "owners": [
            {
                "pod_uid": o.pod_uid,
                "namespace": o.namespace,
                "pod": o.pod,
                "container": o.container,
                "device_id": o.device_id,
            }
            for o in f.owners
        ],
        "hidden_owners": 0,
        "message": f.message,
    }


def finding_json(f: Finding) -> Json:
    return {
        "id": f.id,
        "kind": f.kind,
        "key": f.key,
        "node": f.node,
        "at": rfc3339(f.at_ms),
        "active": f.active,
        "gpu_uuid": f.gpu_uuid,
        "mig": mig_json(f.mig),
        "pod_uid": f.pod_uid,
        "namespace": f.namespace,
        "pod": f.pod,
        "container": f.container,
        "device_id": f.device_id,
        "xid_code": f.xid_code or None,
        "owners": [owner_json(o) for o in f.owners],
        "hidden_owners": 0,
        "message": f.message,
        "since": rfc3339(f.since_ms),
        "avg_util_pct": num(f.avg_util_pct),
        "wasted_gpu_hours": num(f.wasted_gpu_hours),
        "pids": list(f.pids),
    }
