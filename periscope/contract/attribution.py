"""Pod attribution as users read it: a row per pod x container x device, a pod with its rows, the rows'
tumbling-window stats.

One rendering per domain type, composed into the shapes the readers need:
- `row_json(row)`: every field of an `AttributionRow` (its closed windows under `windows`): the rows of
  a `periscope replay` attribution item;
- `pod_row_json(pod, row)`: the flat /v1/pods and /v1/idle row, the pod's identity and the row's fields
  without its windows (the API merges windows per row and lists them under /v1/pods/{pod_uid});
- `pod_json(pod, rows)`: the pod's own fields and its rows (/v1/pods/{pod_uid}, replay items).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from periscope.contract.values import Json, Mig, mig_json, num, text, time_json
from periscope.core.model import AttributionRow, PodAttribution, WindowStat

# What a window's rendering leaves to the usage outputs: its GPU-hours accounting (WindowStat's gpu_ms ..
# alloc_basis), which periscope.core.gpuhours sums per group for /v1/usage and `periscope usage`.
WINDOW_LEAVES = frozenset({"gpu_ms", "used_gpu_ms", "idle_gpu_ms", "unmeasured_gpu_ms", "fb_mib_ms",
                           "energy_j", "request_gpu_ms", "alloc_basis"})
ROW_LEAVES = frozenset(f"windows.{f}" for f in WINDOW_LEAVES)  # the same, under a row
POD_LEAVES = frozenset(f"rows.{f}" for f in ROW_LEAVES)  # and under a pod's rows


class Window(BaseModel):
    start: str | None
    samples: int
    avg_util_pct: float | None
    fb_max_mib: float | None
    avg_power_w: float | None


def window_json(w: WindowStat) -> Json:
    return {
        "start": time_json(w.start_ms),
        "samples": w.samples,
        "avg_util_pct": num(w.util_sum / w.util_samples) if w.util_samples else None,
        "fb_max_mib": num(w.fb_max_mib),
        "avg_power_w": num(w.power_sum_w / w.samples) if w.samples else None,
    }


class RowFields(BaseModel):
    container: str
    device_id: str
    gpu_uuid: str | None = Field(description="the physical GPU (the parent of a MIG slice); null when the "
                                             "device ID names no known GPU (see `unresolved`)")
    mig: Mig | None
    sharing: str = Field(description="exclusive | time-slicing | mps | mig")
    share_basis: str = Field(description="exclusive | process | memory-weighted | equal-split | none")
    util_pct: float | None = Field(
        description="attributed share of the latest sample; on a MIG slice the instance's DCGM "
        "graphics-engine activity (sources then include dcgm); null when unknown")
    fb_used_mib: float | None
    power_w: float | None
    active: bool
    idle: bool
    idle_since: str | None
    avg_util_pct: float | None = Field(description="average utilization over the idle window")
    wasted_gpu_hours: float | None
    first_seen: str | None
    last_seen: str | None
    sample_at: str | None
    sources: list[str]
    gpu_fraction: float | None
    unresolved: str | None = Field(
        None, description="why the device ID names no known GPU (gpu_uuid is then null); null when it does")
    sm_active_pct: float | None = Field(
        None, description="DCGM_FI_PROF_SM_ACTIVE of the held unit in percent; null when not available or "
        "the unit is shared (DCGM measures the unit, not a pod)")
    sm_occupancy_pct: float | None = Field(None, description="DCGM_FI_PROF_SM_OCCUPANCY in percent, as above")
    tensor_active_pct: float | None = Field(
        None, description="DCGM_FI_PROF_PIPE_TENSOR_ACTIVE in percent, as above")
    dram_active_pct: float | None = Field(None, description="DCGM_FI_PROF_DRAM_ACTIVE in percent, as above")


def _row_fields(r: AttributionRow) -> Json:
    return {
        "container": r.container, "device_id": r.device_id, "gpu_uuid": r.gpu_uuid or None,
        "mig": mig_json(r.mig), "sharing": r.sharing, "share_basis": r.share_basis,
        "util_pct": num(r.util_pct), "fb_used_mib": num(r.fb_used_mib), "power_w": num(r.power_w),
        "active": r.active, "idle": r.idle, "idle_since": time_json(r.idle_since_ms),
        "avg_util_pct": num(r.avg_util_pct), "wasted_gpu_hours": num(r.wasted_gpu_hours),
        "first_seen": time_json(r.first_seen_ms), "last_seen": time_json(r.last_seen_ms),
        "sample_at": time_json(r.sample_ms), "sources": list(r.sources), "gpu_fraction": num(r.gpu_fraction),
        "unresolved": r.unresolved or None,
        "sm_active_pct": num(r.sm_active_pct), "sm_occupancy_pct": num(r.sm_occupancy_pct),
        "tensor_active_pct": num(r.tensor_active_pct), "dram_active_pct": num(r.dram_active_pct),
    }


class Row(RowFields):
    windows: list[Window] = Field(description="tumbling window stats, oldest first")


def row_json(r: AttributionRow) -> Json:
    out = _row_fields(r)
    out["windows"] = [window_json(w) for w in r.windows]
    return out


class PodRow(RowFields):
    """One pod x container x device: who holds the device, and the row."""

    pod_uid: str
    namespace: str | None
    pod: str | None
    node: str


def pod_row_json(pod: PodAttribution, row: AttributionRow) -> Json:
    return {"pod_uid": pod.pod_uid, "namespace": text(pod.namespace), "pod": text(pod.pod), "node": pod.node,
            **_row_fields(row)}


# What the flat row leaves to /v1/pods/{pod_uid} (`pod_json`): the pod's lifecycle, and the row's windows.
FLAT_ROW_LEAVES = frozenset({"owner_kind", "owner_name", "phase", "created_ms", "deleted_ms", "as_of_ms",
                             "rows.windows"})


class IdleRow(PodRow):
    """A /v1/pods row as /v1/idle judges it: `idle`, `idle_since`, `avg_util_pct` and `wasted_gpu_hours`
    are the verdict for the threshold and window asked for."""


class PodDetailRow(PodRow):
    windows: list[Window] = Field(description="tumbling window stats, oldest first")


class PodOwnerRef(BaseModel):
    kind: str | None
    name: str | None


class PodFields(BaseModel):
    pod_uid: str
    namespace: str | None
    pod: str | None
    node: str
    owner: PodOwnerRef | None = Field(description="the pod's controller; null when it has none")
    phase: str | None
    created: str | None
    deleted: str | None
    as_of: str | None


class Pod(PodFields):
    rows: list[Row]


class PodDetail(PodFields):
    rows: list[PodDetailRow]


def pod_json(pod: PodAttribution, rows: list[Json] | None = None) -> Json:
    """The pod and its rows: `row_json` of each, unless `rows` are given (the API's, with merged windows)."""
    owner = ({"kind": pod.owner_kind or None, "name": pod.owner_name or None}
             if pod.owner_kind or pod.owner_name else None)
    return {
        "pod_uid": pod.pod_uid, "namespace": text(pod.namespace), "pod": text(pod.pod), "node": pod.node,
        "owner": owner, "phase": text(pod.phase), "created": time_json(pod.created_ms),
        "deleted": time_json(pod.deleted_ms), "as_of": time_json(pod.as_of_ms),
        "rows": [row_json(r) for r in pod.rows] if rows is None else rows,
    }
