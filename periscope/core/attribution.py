"""Attribute one telemetry sample: holdings and device samples give per-row usage and findings."""

from __future__ import annotations

from collections.abc import Sequence

from periscope.core.accounting import charge, charge_end, mig_share, parent_power, unit_shares
from periscope.core.allocation import Holding
from periscope.core.holdings import HoldingIndex
from periscope.core.model import Finding, NodeTelemetry, Owner, ProcessSample
from periscope.core.mps import without_mps_daemons
from periscope.core.pods import PodRegistry
from periscope.core.rows import RowConfig, RowState
from periscope.core.state import NodeState, RowKey
from periscope.core.usage import Usage, sharing_of, single_usage, split_instance

_WHOLE = (1.0, "exclusive")  # a GPU's own share of itself, and its accounting basis


def attribute_sample(
    state: NodeState, tel: NodeTelemetry, ix: HoldingIndex, cfg: RowConfig, monitors: Sequence[Holding] = (),
    gap_ms: int = 0,
) -> tuple[set[str], list[Finding]]:
    """Update row state from one sample; return the pod UIDs whose attribution changed and the
    findings that hold at this instant. A monitoring pod's processes on a GPU it has admin access to
    (the operator's DRA validator runs CUDA there) are expected, not unattributed usage. Each row
    observed is charged for `gap_ms`, the time since the node's previous sample
    (periscope.core.accounting)."""
    t = tel.meta.time_ms
    watchers: dict[str, set[str]] = {}
    for m in monitors:
        watchers.setdefault(m.device.gpu_uuid, set()).add(m.pod_uid)
    strategy, replicas = state.sharing()
    devices = without_mps_daemons(tel.devices, state.pods)
    samples = {d.uuid: d for d in devices}
    by_instance = ix.by_instance
    findings: list[Finding] = []
    for h in ix.ambiguous:
        state.counters.ambiguous_joins += 1
        findings.append(_ambiguous(state.node, t, h))

    rows = state.rows
    pods, fraction, node, models = state.pods, state.devmap.fraction, state.node, state.devmap.models
    us: tuple[Usage, ...] | list[Usage]
    for inst, (hs, keys) in by_instance.items():
        sample = samples.get(inst)
        if len(hs) == 1 and hs[0].device.replica is None:  # one holder of a whole unit: most devices
            u, unattributed = single_usage(sample, hs[0], fraction(hs[0].device))
            us = (u,)
        else:
            usage, unattributed = split_instance(sample, hs, pods, strategy, fraction(hs[0].device),
                                                 replicas)
            us = [usage[key] for key in keys]
        d0 = hs[0].device
        whole = _WHOLE if d0.mig is None else mig_share(d0.mig, models.get(d0.gpu_uuid, ""), fraction(d0))
        # A pod's lifetime bounds the charges of a unit it holds alone (a whole GPU, or the only holder
        # of a shared one: nobody held it before): with other holders, their shares of the same gap
        # already assume it was there, or was not.
        alone = len(hs) == 1
        for h, key, u, sb in zip(hs, keys, us, unit_shares(us, replicas, whole), strict=True):
            share, basis = sb
            row = _row(rows, h, key, t)
            row.observe(t, u, _sources(h.sources, u.seen_processes, u.dcgm is not None), cfg)
            power = u.power_w
            if power is None and d0.mig is not None:
                pp = parent_power(samples, d0.gpu_uuid)
                power = None if pp is None else pp * share  # its allocated share of the parent's
            charge(row, t, _since_start(pods, key[0], t, gap_ms) if alone else gap_ms, share, basis, power,
                   whole[0], cfg)
            if alone:
                row.charged, row.charged_power, row.charged_scale = sb, power, whole[0]
            else:
                row.charged = None
            if row.idle:
                findings.append(_idle(node, t, row))
        if sample is not None and unattributed:
            findings.extend(_unattributed(state, t, sample.gpu_uuid, inst, unattributed, watchers))
    for h in ix.unresolved:  # held, but no known GPU: a row that says so, with no usage
        u = Usage(util_pct=None, fb_used_mib=None, power_w=None, sharing=sharing_of((h,), strategy),
                  share_basis="none", gpu_fraction=1.0, seen_processes=False)
        _row(rows, h, h.key, t).observe(t, u, h.sources, cfg)
    mig_parents: set[str] | None = None
    for d in devices:
        # Processes on a device nobody holds (the parent of MIG instances lists theirs again: skip it).
        if d.processes and d.uuid not in by_instance:
            if mig_parents is None:
                mig_parents = {d.parent_uuid for d in devices if d.parent_uuid}
            if d.uuid in mig_parents:
                continue
            findings.extend(_unattributed(state, t, d.gpu_uuid, d.uuid, list(d.processes), watchers))
    # Every held row was observed above: their pods changed, and rows no longer held deactivate.
    touched = set(ix.held_pods)
    if ix.held_rows < len(rows):
        current = ix.held_keys()
        for key, row in rows.items():
            if key not in current:
                _charge_to_deletion(pods, key[0], row, t, cfg)
                if row.deactivate():
                    touched.add(key[0])
    return touched, findings


def _since_start(pods: PodRegistry, uid: str, t: int, gap_ms: int) -> int:
    """The part of the gap before a sample that the pod existed for: a pod created within the gap is
    not charged for the time before it."""
    rec = pods.pods.get(uid)
    start = rec.start_ms if rec is not None else 0
    return min(gap_ms, t - start) if 0 < start <= t else gap_ms


def _charge_to_deletion(pods: PodRegistry, uid: str, row: RowState, t: int, cfg: RowConfig) -> None:
    """A row that is no longer held because its pod was deleted since its last sample is charged, as
    last observed, up to the deletion (the samples that follow no longer see it): its lifetime is
    billed to the instant the watcher recorded, not to the last sample before it."""
    rec = pods.pods.get(uid)
    end = rec.deleted_ms if rec is not None else 0
    if row.active and row.charged is not None and row.sample_ms < end <= t:
        charge_end(row, end, cfg)
    row.charged = None


def _row(rows: dict[RowKey, RowState], h: Holding, key: RowKey, t: int) -> RowState:
    """The row of holding `h`, created at its first sample; it follows the holding's device resolution
    (an ID unresolved before the node's inventory arrived resolves later, under the same key)."""
    row = rows.get(key)
    d = h.device
    if row is None:
        row = RowState(pod_uid=h.pod_uid, namespace=h.namespace, pod=h.pod, container=h.container,
                       device_id=d.device_id, gpu_uuid=d.gpu_uuid, mig=d.mig, first_seen_ms=t,
                       unresolved=d.unresolved)
        rows[key] = row
    elif row.gpu_uuid != d.gpu_uuid or row.unresolved != d.unresolved:
        row.gpu_uuid, row.mig, row.unresolved = d.gpu_uuid, d.mig, d.unresolved
    if h.namespace:
        row.namespace = h.namespace
    if h.pod:
        row.pod = h.pod
    return row


_SOURCES: dict[tuple[tuple[str, ...], bool, bool], tuple[str, ...]] = {}


def _sources(allocation: tuple[str, ...], seen_processes: bool, dcgm: bool = False) -> tuple[str, ...]:
    """A row's sources, sorted: memoized, as a few combinations recur on every sample. `dcgm`: some
    of the row's numbers came from the node's dcgm-exporter."""
    key = (allocation, seen_processes, dcgm)
    srcs = _SOURCES.get(key)
    if srcs is None:
        extra = ({"process"} if seen_processes else set()) | ({"dcgm"} if dcgm else set())
        srcs = tuple(sorted(set(allocation) | extra))
        if len(_SOURCES) < 1024:
            _SOURCES[key] = srcs
    return srcs


def _idle(node: str, t: int, row: RowState) -> Finding:
    return Finding(
        kind="idle", key=row.pod_uid, node=node, at_ms=t,
        id=f"idle/{row.pod_uid}/{row.container}/{row.device_id}",
        gpu_uuid=row.gpu_uuid, mig=row.mig, pod_uid=row.pod_uid, namespace=row.namespace, pod=row.pod,
        container=row.container, device_id=row.device_id, wasted_gpu_hours=row.wasted_gpu_hours(),
        since_ms=row.idle_since_ms, avg_util_pct=row.avg_util_pct,
        message=f"allocated but idle since {row.idle_since_ms}",
    )


def _ambiguous(node: str, t: int, h: Holding) -> Finding:
    owners = tuple(Owner(u, h.namespace, h.pod, h.container, h.device.device_id) for u in h.candidates)
    return Finding(
        kind="ambiguous-join", key=h.device.gpu_uuid or h.device.device_id, node=node, at_ms=t,
        id=f"ambiguous/{h.device.device_id}/{h.namespace}/{h.pod}/{h.container}",
        gpu_uuid=h.device.gpu_uuid, mig=h.device.mig, namespace=h.namespace, pod=h.pod,
        container=h.container, device_id=h.device.device_id, owners=owners,
        message=f"{h.namespace}/{h.pod} matches {len(h.candidates)} pod UIDs; not guessed",
    )


def _unattributed(
    state: NodeState, t: int, gpu_uuid: str, instance: str, procs: list[ProcessSample],
    watchers: dict[str, set[str]],
) -> list[Finding]:
    by_pod: dict[str, list[int]] = {}
    watching = watchers.get(gpu_uuid, ()) if watchers else ()
    for p in procs:
        if p.pod_uid and p.pod_uid in watching:
            continue
        by_pod.setdefault(p.pod_uid, []).append(p.pid)
    out = []
    for uid in sorted(by_pod):
        state.counters.unattributed_samples += 1
        rec = state.pods.get(uid) if uid else None
        if rec is not None and rec.start_ms > t:
            rec = None  # not yet known as of this sample
        out.append(
            Finding(
                kind="unattributed-usage", key=gpu_uuid, node=state.node, at_ms=t,
                id=f"unattributed/{instance}/{uid or 'host'}", gpu_uuid=gpu_uuid, pod_uid=uid,
                namespace=rec.info.namespace if rec else "", pod=rec.info.name if rec else "",
                pids=tuple(sorted(by_pod[uid])),
                message="process on a device its pod does not hold" if uid else "non-pod process on GPU",
            )
        )
    return out
