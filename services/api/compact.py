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


def _strs(values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(intern(v) for v in values)


def _mig(m: MigRef | None) -> MigRef | None:
    return None if m is None else replace(m, uuid=intern(m.uuid), profile=intern(m.profile))


def _owner(o: Owner) -> Owner:
    return Owner(intern(o.pod_uid), intern(o.namespace), intern(o.pod), intern(o.container),
                 intern(o.device_id))


def row(r: AttributionRow) -> AttributionRow:
    """The row without its windows, strings interned."""
    return replace(
        r,
        container=intern(r.container),
        device_id=intern(r.device_id),
        gpu_uuid=intern(r.gpu_uuid),
        sharing=intern(r.sharing),
        share_basis=intern(r.share_basis),
        mig=_mig(r.mig),
        sources=_strs(r.sources),
        windows=(),
    )


def pod(p: PodAttribution) -> PodAttribution:
    """The pod with compact rows (no windows), strings interned."""
    return replace(
        p,
        pod_uid=intern(p.pod_uid),
        namespace=intern(p.namespace),
        pod=intern(p.pod),
        node=intern(p.node),
        rows=tuple(row(r) for r in p.rows),
        owner_kind=intern(p.owner_kind),
        owner_name=intern(p.owner_name),
        phase=intern(p.phase),
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
