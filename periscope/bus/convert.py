"""Domain dataclasses <-> periscope.v1 protobuf messages, one explicit function pair per message.

Explicit code instead of descriptor-driven reflection because the joiner decodes thousands of
messages per second. Conventions: an absent `optional` field is None; an unset MigRef (or one with
an empty uuid) is None; protobuf maps become tuples of (key, value) pairs sorted by key, so a decoded
object is deterministic whatever order the producer wrote; repeated fields keep their order.
Validation of required fields lives in `periscope.bus.codec`; these functions only map.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import fields
from typing import TYPE_CHECKING, TypeVar

from periscope.core import model as m
from periscope.v1 import attribution_pb2 as apb
from periscope.v1 import cluster_pb2 as cpb
from periscope.v1 import common_pb2 as pb
from periscope.v1 import node_pb2 as npb

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_T = TypeVar("_T", bound="DataclassInstance")

# Names that every telemetry record repeats (node, source, GPU and pod IDs, container IDs) are interned:
# a worker holds the buffered and the last samples of every node, and a fresh copy of each name per
# decoded record costs about 300 bytes per pod-device row. Interned strings are freed with their
# last reference, so names from hostile records do not accumulate.
_intern = sys.intern
# Likewise the numbers a GPU repeats in every sample: its total memory (fixed per GPU or MIG profile), its
# temperature (whole degrees) and its utilization (whole percent, as NVML reports it; the core keeps
# it as it came where rounding would not change it). A few hundred values at most; the cache starts
# over past that (checked per record). Zeros are not shared: -0.0 equals 0.0, and would come back as
# whichever was seen first.
_SAME: dict[float, float] = {}
_same = _SAME.setdefault
_SAME_MAX = 4096

_SOURCE_TO_PB = {
    m.AllocSource.PODRESOURCES: npb.ALLOCATION_SOURCE_PODRESOURCES,
    m.AllocSource.CHECKPOINT: npb.ALLOCATION_SOURCE_CHECKPOINT,
    m.AllocSource.DRA: npb.ALLOCATION_SOURCE_DRA,
}
_SOURCE_FROM_PB = {v: k for k, v in _SOURCE_TO_PB.items()}


def _check_order(cls: type[_T], names: str) -> type[_T]:
    """`cls`, once its fields are known to start with `names` (the converters that pass positional
    arguments rely on that order; a reordered model fails here, at import, not silently)."""
    got = tuple(f.name for f in fields(cls))[: len(names.split())]
    if got != tuple(names.split()):
        raise TypeError(f"{cls.__name__} fields are {got}, the decoder expects {names.split()}")
    return cls


_Meta = _check_order(m.Meta, "node source epoch seq time_ms")
_DcgmProfile = _check_order(m.DcgmProfile, "gr_engine_active_pct sm_active_pct sm_occupancy_pct "
                                           "tensor_active_pct dram_active_pct")
_ProcessSample = _check_order(m.ProcessSample,
                              "pid pod_uid container_id qos sm_util_pct mem_util_pct used_mib")
_DeviceSample = _check_order(m.DeviceSample, "uuid parent_uuid index mig util_pct mem_util_pct fb_used_mib "
                                             "fb_total_mib power_w temp_c lost processes error dcgm")


def _pairs(mapping: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(mapping.items()))


# ---------------------------------------------------------------- common


def meta_to_pb(x: m.Meta) -> pb.EventMeta:
    return pb.EventMeta(node=x.node, source=x.source, epoch=x.epoch, seq=x.seq, event_time_ms=x.time_ms)


def meta_from_pb(p: pb.EventMeta) -> m.Meta:
    return _Meta(_intern(p.node), _intern(p.source), p.epoch, p.seq, p.event_time_ms)


def health_to_pb(x: m.SourceHealth) -> pb.SourceHealth:
    return pb.SourceHealth(source=x.source, state=x.state, detail=x.detail)


def health_from_pb(p: pb.SourceHealth) -> m.SourceHealth:
    return m.SourceHealth(source=p.source, state=p.state, detail=p.detail)


def mig_to_pb(x: m.MigRef | None) -> pb.MigRef | None:
    if x is None or not x.uuid:
        return None
    return pb.MigRef(uuid=x.uuid, profile=x.profile, gi=x.gi, ci=x.ci)


def mig_from_pb(p: pb.MigRef) -> m.MigRef | None:
    # An unset sub-message reads as the default instance, whose uuid is empty.
    if not p.uuid:
        return None
    return m.MigRef(uuid=p.uuid, profile=p.profile, gi=p.gi, ci=p.ci)


def owner_to_pb(x: m.Owner) -> pb.Owner:
    return pb.Owner(pod_uid=x.pod_uid, namespace=x.namespace, pod=x.pod, container=x.container,
                    device_id=x.device_id)


def owner_from_pb(p: pb.Owner) -> m.Owner:
    return m.Owner(pod_uid=p.pod_uid, namespace=p.namespace, pod=p.pod, container=p.container,
                   device_id=p.device_id)


# ---------------------------------------------------------------- node events


def entry_to_pb(x: m.AllocationEntry) -> npb.AllocationEntry:
    return npb.AllocationEntry(
        source=_SOURCE_TO_PB[x.source], pod_uid=x.pod_uid, namespace=x.namespace, pod=x.pod,
        container=x.container, resource=x.resource, device_ids=x.device_ids, claim_name=x.claim_name,
        claim_namespace=x.claim_namespace, driver=x.driver, pool=x.pool, device=x.device,
        visible_devices=x.visible_devices)


def entry_from_pb(p: npb.AllocationEntry) -> m.AllocationEntry:
    source = _SOURCE_FROM_PB.get(p.source)
    if source is None:
        raise ValueError(f"allocation entry has unknown source {p.source}")
    return m.AllocationEntry(
        source=source, container=p.container, resource=p.resource, device_ids=tuple(p.device_ids),
        pod_uid=p.pod_uid, namespace=p.namespace, pod=p.pod, claim_name=p.claim_name,
        claim_namespace=p.claim_namespace, driver=p.driver, pool=p.pool, device=p.device,
        visible_devices=tuple(p.visible_devices))


def allocation_snapshot_to_pb(x: m.AllocationSnapshot) -> npb.AllocationSnapshot:
    return npb.AllocationSnapshot(
        meta=meta_to_pb(x.meta),
        entries=[entry_to_pb(e) for e in x.entries],
        allocatable=[npb.AllocatableDevice(resource=r, device_id=d) for r, d in x.allocatable],
        health=[health_to_pb(h) for h in x.health])


def allocation_snapshot_from_pb(p: npb.AllocationSnapshot) -> m.AllocationSnapshot:
    return m.AllocationSnapshot(
        meta=meta_from_pb(p.meta),
        entries=tuple(entry_from_pb(e) for e in p.entries),
        allocatable=tuple((a.resource, a.device_id) for a in p.allocatable),
        health=tuple(health_from_pb(h) for h in p.health))


def process_to_pb(x: m.ProcessSample) -> npb.ProcessSample:
    return npb.ProcessSample(pid=x.pid, pod_uid=x.pod_uid, container_id=x.container_id, qos=x.qos,
                             sm_util_pct=x.sm_util_pct, mem_util_pct=x.mem_util_pct, used_mib=x.used_mib)


def process_from_pb(p: npb.ProcessSample) -> m.ProcessSample:
    # The hot path of decoding telemetry: positional arguments (in the order _check_order verifies),
    # and presence asked only of optional numbers that read as zero (an unset one reads as 0.0, so a
    # non-zero one is set): about three times as fast as keywords and HasField on every field.
    # `x - x == 0.0` is false for NaN and the infinities only: a non-finite reading is no reading (as
    # in the outputs), never a number that poisons every sum it enters and fails the state's persist.
    has = p.HasField
    sm, mem, used = p.sm_util_pct, p.mem_util_pct, p.used_mib
    return _ProcessSample(
        p.pid, _intern(p.pod_uid), _intern(p.container_id), _intern(p.qos),
        sm if (sm or has("sm_util_pct")) and sm - sm == 0.0 else None,
        mem if (mem or has("mem_util_pct")) and mem - mem == 0.0 else None,
        used if (used or has("used_mib")) and used - used == 0.0 else None)


def device_to_pb(x: m.DeviceSample) -> npb.DeviceSample:
    return npb.DeviceSample(
        uuid=x.uuid, parent_uuid=x.parent_uuid, index=x.index, mig=mig_to_pb(x.mig), util_pct=x.util_pct,
        mem_util_pct=x.mem_util_pct, fb_used_mib=x.fb_used_mib, fb_total_mib=x.fb_total_mib,
        power_w=x.power_w, temp_c=x.temp_c, lost=x.lost,
        processes=[process_to_pb(s) for s in x.processes], error=x.error, dcgm=dcgm_to_pb(x.dcgm))


def dcgm_to_pb(x: m.DcgmProfile | None) -> npb.DcgmProfile | None:
    if x is None:
        return None
    return npb.DcgmProfile(
        gr_engine_active_pct=x.gr_engine_active_pct, sm_active_pct=x.sm_active_pct,
        sm_occupancy_pct=x.sm_occupancy_pct, tensor_active_pct=x.tensor_active_pct,
        dram_active_pct=x.dram_active_pct)


def dcgm_from_pb(p: npb.DcgmProfile) -> m.DcgmProfile:
    has = p.HasField
    return _DcgmProfile(
        _finite(p.gr_engine_active_pct) if has("gr_engine_active_pct") else None,
        _finite(p.sm_active_pct) if has("sm_active_pct") else None,
        _finite(p.sm_occupancy_pct) if has("sm_occupancy_pct") else None,
        _finite(p.tensor_active_pct) if has("tensor_active_pct") else None,
        _finite(p.dram_active_pct) if has("dram_active_pct") else None)


def _finite(x: float) -> float | None:
    return x if x - x == 0.0 else None


def _finite_or_unknown(x: float) -> float:
    return x if x - x == 0.0 else 0.0  # (not `_finite(x) or 0.0`: -0.0 must stay itself)


def device_from_pb(p: npb.DeviceSample) -> m.DeviceSample:
    has = p.HasField  # asked only of numbers that read as zero; non-finite ones dropped, as there
    util, mem, fb, total = p.util_pct, p.mem_util_pct, p.fb_used_mib, p.fb_total_mib
    power, temp = p.power_w, p.temp_c
    return _DeviceSample(
        _intern(p.uuid), p.parent_uuid and _intern(p.parent_uuid), p.index,
        mig_from_pb(p.mig) if has("mig") else None,
        (_same(util, util) if util else util) if (util or has("util_pct")) and util - util == 0.0 else None,
        (_same(mem, mem) if mem else mem) if (mem or has("mem_util_pct")) and mem - mem == 0.0 else None,
        fb if (fb or has("fb_used_mib")) and fb - fb == 0.0 else None,
        (_same(total, total) if total else total) if (total or has("fb_total_mib")) and total - total == 0.0
        else None,
        power if (power or has("power_w")) and power - power == 0.0 else None,
        (_same(temp, temp) if temp else temp) if (temp or has("temp_c")) and temp - temp == 0.0 else None,
        p.lost, tuple(map(process_from_pb, p.processes)), p.error,
        dcgm_from_pb(p.dcgm) if has("dcgm") else None)


def node_telemetry_to_pb(x: m.NodeTelemetry) -> npb.NodeTelemetry:
    return npb.NodeTelemetry(meta=meta_to_pb(x.meta), devices=[device_to_pb(d) for d in x.devices])


def node_telemetry_from_pb(p: npb.NodeTelemetry) -> m.NodeTelemetry:
    if len(_SAME) > _SAME_MAX:
        _SAME.clear()
    return m.NodeTelemetry(meta=meta_from_pb(p.meta), devices=tuple(map(device_from_pb, p.devices)))


def xid_event_to_pb(x: m.XidEvent) -> npb.XidEvent:
    return npb.XidEvent(meta=meta_to_pb(x.meta), gpu_uuid=x.gpu_uuid, code=x.code, mig=mig_to_pb(x.mig))


def xid_event_from_pb(p: npb.XidEvent) -> m.XidEvent:
    return m.XidEvent(meta=meta_from_pb(p.meta), gpu_uuid=p.gpu_uuid, code=p.code, mig=mig_from_pb(p.mig))


def gpu_info_to_pb(x: m.GpuInfo) -> npb.GpuInfo:
    return npb.GpuInfo(
        uuid=x.uuid, index=x.index, minor=x.minor or 0, minor_unknown=x.minor is None, model=x.model,
        memory_mib=x.memory_mib, mig_enabled=x.mig_enabled, lost=x.lost, pci_bus_id=x.pci_bus_id,
        mig_devices=[npb.MigDeviceInfo(uuid=d.uuid, profile=d.profile, gi=d.gi, ci=d.ci,
                                       memory_mib=d.memory_mib) for d in x.mig_devices])


def gpu_info_from_pb(p: npb.GpuInfo) -> m.GpuInfo:
    return m.GpuInfo(
        uuid=p.uuid, index=p.index, model=p.model, memory_mib=_finite_or_unknown(p.memory_mib),
        minor=None if p.minor_unknown else p.minor, mig_enabled=p.mig_enabled, lost=p.lost,
        pci_bus_id=p.pci_bus_id,
        mig_devices=tuple(m.MigDeviceInfo(uuid=d.uuid, profile=d.profile, gi=d.gi, ci=d.ci,
                                          memory_mib=_finite_or_unknown(d.memory_mib))
                          for d in p.mig_devices))


def device_inventory_to_pb(x: m.DeviceInventory) -> npb.DeviceInventory:
    return npb.DeviceInventory(
        meta=meta_to_pb(x.meta), driver_version=x.driver_version, cuda_driver_version=x.cuda_driver_version,
        gpus=[gpu_info_to_pb(g) for g in x.gpus], health=[health_to_pb(h) for h in x.health])


def device_inventory_from_pb(p: npb.DeviceInventory) -> m.DeviceInventory:
    return m.DeviceInventory(
        meta=meta_from_pb(p.meta), gpus=tuple(gpu_info_from_pb(g) for g in p.gpus),
        health=tuple(health_from_pb(h) for h in p.health), driver_version=p.driver_version,
        cuda_driver_version=p.cuda_driver_version)


# ---------------------------------------------------------------- cluster events


def container_to_pb(x: m.ContainerInfo) -> cpb.ContainerInfo:
    return cpb.ContainerInfo(name=x.name, container_id=x.container_id, requests=dict(x.requests),
                             limits=dict(x.limits), claims=x.claims, init=x.init, runtime=x.runtime)


def container_from_pb(p: cpb.ContainerInfo) -> m.ContainerInfo:
    return m.ContainerInfo(name=p.name, container_id=p.container_id, requests=_pairs(p.requests),
                           limits=_pairs(p.limits), claims=tuple(p.claims), init=p.init, runtime=p.runtime)


def pod_info_to_pb(x: m.PodInfo) -> cpb.PodInfo:
    return cpb.PodInfo(
        uid=x.uid, namespace=x.namespace, name=x.name, node=x.node, phase=x.phase, qos=x.qos,
        owner_kind=x.owner_kind, owner_name=x.owner_name, labels=dict(x.labels), created_ms=x.created_ms,
        deletion_ms=x.deletion_ms, resource_version=x.resource_version,
        containers=[container_to_pb(c) for c in x.containers],
        claim_statuses=[cpb.PodClaimStatus(name=s.name, resource_claim_name=s.resource_claim_name)
                        for s in x.claim_statuses],
        mirror_of=x.mirror_of,
        claim_devices=[cpb.ClaimDevice(claim_name=d.claim_name, request=d.request, driver=d.driver,
                                       pool=d.pool, device=d.device, share_id=d.share_id,
                                       admin_access=d.admin_access)
                       for d in x.claim_devices],
        started_ms=x.started_ms)


def pod_info_from_pb(p: cpb.PodInfo) -> m.PodInfo:
    return m.PodInfo(
        uid=p.uid, namespace=p.namespace, name=p.name, node=p.node, phase=p.phase, qos=p.qos,
        owner_kind=p.owner_kind, owner_name=p.owner_name, labels=_pairs(p.labels), created_ms=p.created_ms,
        deletion_ms=p.deletion_ms, resource_version=p.resource_version,
        containers=tuple(container_from_pb(c) for c in p.containers),
        claim_statuses=tuple(m.PodClaimStatus(name=s.name, resource_claim_name=s.resource_claim_name)
                             for s in p.claim_statuses),
        mirror_of=p.mirror_of,
        claim_devices=tuple(m.ClaimDevice(claim_name=d.claim_name, request=d.request, driver=d.driver,
                                          pool=d.pool, device=d.device, share_id=d.share_id,
                                          admin_access=d.admin_access)
                            for d in p.claim_devices),
        started_ms=p.started_ms)


def pod_event_to_pb(x: m.PodEvent) -> cpb.PodEvent:
    return cpb.PodEvent(meta=meta_to_pb(x.meta), pod=pod_info_to_pb(x.pod), deleted=x.deleted,
                        relist=x.relist)


def pod_event_from_pb(p: cpb.PodEvent) -> m.PodEvent:
    return m.PodEvent(meta=meta_from_pb(p.meta), pod=pod_info_from_pb(p.pod), deleted=p.deleted,
                      relist=p.relist)


def node_event_to_pb(x: m.NodeEvent) -> cpb.NodeEvent:
    return cpb.NodeEvent(
        meta=meta_to_pb(x.meta), name=x.name, labels=dict(x.labels), capacity=dict(x.capacity),
        allocatable=dict(x.allocatable), deleted=x.deleted, unschedulable=x.unschedulable, ready=x.ready)


def node_event_from_pb(p: cpb.NodeEvent) -> m.NodeEvent:
    return m.NodeEvent(
        meta=meta_from_pb(p.meta), name=p.name, labels=_pairs(p.labels), capacity=_pairs(p.capacity),
        allocatable=_pairs(p.allocatable), deleted=p.deleted, unschedulable=p.unschedulable, ready=p.ready)


def policy_event_to_pb(x: m.PolicyEvent) -> cpb.PolicyEvent:
    return cpb.PolicyEvent(
        meta=meta_to_pb(x.meta), crd=x.crd, name=x.name, state=x.state, namespace=x.namespace,
        components=[cpb.ComponentSpec(name=k, enabled=v) for k, v in x.components],
        operands=[cpb.OperandStatus(name=o.name, component=o.component, present=o.present,
                                    desired=o.desired, ready=o.ready, available=o.available)
                  for o in x.operands],
        detail=x.detail, dra_available=x.dra_available, kind=x.kind, gpu_cluster_crd=x.gpu_cluster_crd)


def policy_event_from_pb(p: cpb.PolicyEvent) -> m.PolicyEvent:
    return m.PolicyEvent(
        meta=meta_from_pb(p.meta), crd=p.crd, name=p.name, state=p.state, namespace=p.namespace,
        components=tuple((c.name, c.enabled if c.HasField("enabled") else None) for c in p.components),
        operands=tuple(m.OperandStatus(name=o.name, component=o.component, present=o.present,
                                       desired=o.desired, ready=o.ready, available=o.available)
                       for o in p.operands),
        detail=p.detail, dra_available=p.dra_available, kind=p.kind, gpu_cluster_crd=p.gpu_cluster_crd)


# ---------------------------------------------------------------- outputs


def window_to_pb(x: m.WindowStat) -> apb.WindowStat:
    return apb.WindowStat(start_ms=x.start_ms, samples=x.samples, util_sum=x.util_sum,
                          util_samples=x.util_samples, fb_max_mib=x.fb_max_mib, power_sum_w=x.power_sum_w,
                          gpu_ms=x.gpu_ms, used_gpu_ms=x.used_gpu_ms, idle_gpu_ms=x.idle_gpu_ms,
                          unmeasured_gpu_ms=x.unmeasured_gpu_ms, fb_mib_ms=x.fb_mib_ms, energy_j=x.energy_j,
                          request_gpu_ms=x.request_gpu_ms, alloc_basis=x.alloc_basis)


def window_from_pb(p: apb.WindowStat) -> m.WindowStat:
    return m.WindowStat(p.start_ms, p.samples, p.util_sum, p.util_samples, p.fb_max_mib, p.power_sum_w,
                        p.gpu_ms, p.used_gpu_ms, p.idle_gpu_ms, p.unmeasured_gpu_ms, p.fb_mib_ms, p.energy_j,
                        p.request_gpu_ms, p.alloc_basis)


def row_to_pb(x: m.AttributionRow) -> apb.AttributionRow:
    return apb.AttributionRow(
        container=x.container, device_id=x.device_id, gpu_uuid=x.gpu_uuid, mig=mig_to_pb(x.mig),
        sharing=x.sharing, share_basis=x.share_basis, util_pct=x.util_pct, fb_used_mib=x.fb_used_mib,
        power_w=x.power_w, active=x.active, idle=x.idle, first_seen_ms=x.first_seen_ms,
        last_seen_ms=x.last_seen_ms, sources=x.sources, idle_since_ms=x.idle_since_ms,
        avg_util_pct=x.avg_util_pct, wasted_gpu_hours=x.wasted_gpu_hours, gpu_fraction=x.gpu_fraction,
        windows=[window_to_pb(w) for w in x.windows], sample_ms=x.sample_ms, unresolved=x.unresolved,
        sm_active_pct=x.sm_active_pct, sm_occupancy_pct=x.sm_occupancy_pct,
        tensor_active_pct=x.tensor_active_pct, dram_active_pct=x.dram_active_pct)


def row_from_pb(p: apb.AttributionRow) -> m.AttributionRow:
    has = p.HasField
    return m.AttributionRow(
        container=p.container, device_id=p.device_id, gpu_uuid=p.gpu_uuid, sharing=p.sharing,
        share_basis=p.share_basis, mig=mig_from_pb(p.mig),
        util_pct=p.util_pct if has("util_pct") else None,
        fb_used_mib=p.fb_used_mib if has("fb_used_mib") else None,
        power_w=p.power_w if has("power_w") else None,
        active=p.active, idle=p.idle, first_seen_ms=p.first_seen_ms, last_seen_ms=p.last_seen_ms,
        sources=tuple(p.sources), idle_since_ms=p.idle_since_ms,
        avg_util_pct=p.avg_util_pct if has("avg_util_pct") else None,
        wasted_gpu_hours=p.wasted_gpu_hours, gpu_fraction=p.gpu_fraction,
        windows=tuple(window_from_pb(w) for w in p.windows), sample_ms=p.sample_ms,
        unresolved=p.unresolved,
        sm_active_pct=p.sm_active_pct if has("sm_active_pct") else None,
        sm_occupancy_pct=p.sm_occupancy_pct if has("sm_occupancy_pct") else None,
        tensor_active_pct=p.tensor_active_pct if has("tensor_active_pct") else None,
        dram_active_pct=p.dram_active_pct if has("dram_active_pct") else None)


def pod_attribution_to_pb(x: m.PodAttribution) -> apb.PodAttribution:
    return apb.PodAttribution(
        pod_uid=x.pod_uid, namespace=x.namespace, pod=x.pod, node=x.node, owner_kind=x.owner_kind,
        owner_name=x.owner_name, phase=x.phase, created_ms=x.created_ms, deleted_ms=x.deleted_ms,
        as_of_ms=x.as_of_ms, rows=[row_to_pb(r) for r in x.rows])


def pod_attribution_from_pb(p: apb.PodAttribution) -> m.PodAttribution:
    return m.PodAttribution(
        pod_uid=p.pod_uid, namespace=p.namespace, pod=p.pod, node=p.node,
        rows=tuple(row_from_pb(r) for r in p.rows), owner_kind=p.owner_kind, owner_name=p.owner_name,
        phase=p.phase, created_ms=p.created_ms, deleted_ms=p.deleted_ms, as_of_ms=p.as_of_ms)


def mig_state_to_pb(x: m.MigState) -> apb.MigState:
    return apb.MigState(uuid=x.uuid, profile=x.profile, gi=x.gi, ci=x.ci, fb_used_mib=x.fb_used_mib,
                        fb_total_mib=x.fb_total_mib, owners=[owner_to_pb(o) for o in x.owners],
                        util_pct=x.util_pct, monitors=[owner_to_pb(o) for o in x.monitors])


def mig_state_from_pb(p: apb.MigState) -> m.MigState:
    has = p.HasField
    return m.MigState(
        uuid=p.uuid, profile=p.profile, gi=p.gi, ci=p.ci,
        fb_used_mib=p.fb_used_mib if has("fb_used_mib") else None,
        fb_total_mib=p.fb_total_mib if has("fb_total_mib") else None,
        owners=tuple(owner_from_pb(o) for o in p.owners),
        util_pct=p.util_pct if has("util_pct") else None,
        monitors=tuple(owner_from_pb(o) for o in p.monitors))


def gpu_state_to_pb(x: m.GpuState) -> apb.GpuState:
    xid = None if x.last_xid is None else apb.XidRef(code=x.last_xid.code, at_ms=x.last_xid.at_ms)
    return apb.GpuState(
        node=x.node, gpu_uuid=x.gpu_uuid, model=x.model, index=x.index,
        mig_devices=[mig_state_to_pb(d) for d in x.mig_devices], sharing=x.sharing, util_pct=x.util_pct,
        fb_used_mib=x.fb_used_mib, fb_total_mib=x.fb_total_mib, power_w=x.power_w, temp_c=x.temp_c,
        owners=[owner_to_pb(o) for o in x.owners], last_xid=xid, sample_ms=x.sample_ms, lost=x.lost,
        as_of_ms=x.as_of_ms, monitors=[owner_to_pb(o) for o in x.monitors])


def gpu_state_from_pb(p: apb.GpuState) -> m.GpuState:
    has = p.HasField
    xid = m.XidRef(code=p.last_xid.code, at_ms=p.last_xid.at_ms) if has("last_xid") else None
    return m.GpuState(
        node=p.node, gpu_uuid=p.gpu_uuid, model=p.model, index=p.index,
        mig_devices=tuple(mig_state_from_pb(d) for d in p.mig_devices), sharing=p.sharing,
        util_pct=p.util_pct if has("util_pct") else None,
        fb_used_mib=p.fb_used_mib if has("fb_used_mib") else None,
        fb_total_mib=p.fb_total_mib if has("fb_total_mib") else None,
        power_w=p.power_w if has("power_w") else None,
        temp_c=p.temp_c if has("temp_c") else None,
        owners=tuple(owner_from_pb(o) for o in p.owners), last_xid=xid, sample_ms=p.sample_ms,
        lost=p.lost, as_of_ms=p.as_of_ms, monitors=tuple(owner_from_pb(o) for o in p.monitors))


def finding_to_pb(x: m.Finding) -> apb.Finding:
    return apb.Finding(
        kind=x.kind, key=x.key, node=x.node, at_ms=x.at_ms, id=x.id, gpu_uuid=x.gpu_uuid,
        mig=mig_to_pb(x.mig), pod_uid=x.pod_uid, namespace=x.namespace, pod=x.pod, container=x.container,
        device_id=x.device_id, xid_code=x.xid_code, owners=[owner_to_pb(o) for o in x.owners],
        message=x.message, active=x.active, wasted_gpu_hours=x.wasted_gpu_hours, since_ms=x.since_ms,
        avg_util_pct=x.avg_util_pct, pids=x.pids)


def finding_from_pb(p: apb.Finding) -> m.Finding:
    return m.Finding(
        kind=p.kind, key=p.key, node=p.node, at_ms=p.at_ms, id=p.id, gpu_uuid=p.gpu_uuid,
        mig=mig_from_pb(p.mig), pod_uid=p.pod_uid, namespace=p.namespace, pod=p.pod,
        container=p.container, device_id=p.device_id, xid_code=p.xid_code,
        owners=tuple(owner_from_pb(o) for o in p.owners), message=p.message, active=p.active,
        wasted_gpu_hours=p.wasted_gpu_hours, since_ms=p.since_ms,
        avg_util_pct=p.avg_util_pct if p.HasField("avg_util_pct") else None, pids=tuple(p.pids))
