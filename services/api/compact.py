"""Compact copies of decoded records, for a view that holds 100,000 rows.

Decoding gives every record its own string objects, so the same pod UID, GPU UUID, node, namespace and
label are held many times over: in the pod, each row (device_id and gpu_uuid are usually equal), the GPU
state and its owners. The view keeps copies whose strings are interned (one object per distinct text,
freed again with the last record using it) and whose rows carry no windows (the view keeps those merged
and packed, services.api.windows).
"""

from __future__ import annotations

from dataclasses import replace
from sys import intern

from periscope.core.model import AttributionRow, GpuState, MigRef, MigState, Owner, PodAttribution

# A row's `sources` are one of a handful of combinations: rows share one tuple per combination (up to a
# bound, so odd input cannot grow this without limit).
_SHARED_MAX = 1024
_shared: dict[tuple[str, ...], tuple[str, ...]] = {}


def _strs(values: tuple[str, ...]) -> tuple[str, ...]:
    held = _shared.get(values)
    if held is not None:
        return held
    out = tuple(intern(v) for v in values)
    if len(_shared) < _SHARED_MAX:
        _shared[out] = out
    return out


def _mig(m: MigRef | None) -> MigRef | None:
    return None if m is None else replace(m, uuid=intern(m.uuid), profile=intern(m.profile))


def _owner(o: Owner) -> Owner:
    return Owner(intern(o.pod_uid), intern(o.namespace), intern(o.pod), intern(o.container),
                 intern(o.device_id))


def row(r: AttributionRow) -> AttributionRow:
    """The row without its windows, strings interned."""
    # Built field by field rather than with dataclasses.replace: this runs for every record applied.
    return AttributionRow(
        intern(r.container),
        intern(r.device_id),
        intern(r.gpu_uuid),
        intern(r.sharing),
        intern(r.share_basis),
        _mig(r.mig),
        r.util_pct,
        r.fb_used_mib,
        r.power_w,
        r.active,
        r.idle,
        r.first_seen_ms,
        r.last_seen_ms,
        _strs(r.sources),
        r.idle_since_ms,
        r.avg_util_pct,
        r.wasted_gpu_hours,
        r.gpu_fraction,
        (),
        r.sample_ms,
    )


def pod(p: PodAttribution) -> PodAttribution:
    """The pod with compact rows (no windows), strings interned."""
    return PodAttribution(
        intern(p.pod_uid),
        intern(p.namespace),
        intern(p.pod),
        intern(p.node),
        tuple(row(r) for r in p.rows),
        intern(p.owner_kind),
        intern(p.owner_name),
        intern(p.phase),
        p.created_ms,
        p.deleted_ms,
        p.as_of_ms,
    )


def _mig_state(m: MigState) -> MigState:
    owners = tuple(_owner(o) for o in m.owners)
    return replace(m, uuid=intern(m.uuid), profile=intern(m.profile), owners=owners)


def gpu(g: GpuState) -> GpuState:
    """The GPU state with strings interned."""
    return replace(
        g,
        node=intern(g.node),
        gpu_uuid=intern(g.gpu_uuid),
        model=intern(g.model),
        sharing=intern(g.sharing),
        mig_devices=tuple(_mig_state(m) for m in g.mig_devices),
        owners=tuple(_owner(o) for o in g.owners),
    )
