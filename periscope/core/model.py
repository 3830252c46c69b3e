"""Domain types of the attribution core: what the bus events mean, free of protobuf.

Everything is an immutable dataclass; times are Unix milliseconds of event time. The bus codec
(`periscope.bus.convert`) maps these to and from the protobuf messages in protos/periscope/v1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from periscope.core.frozen import fast_init_all


class AllocSource(StrEnum):
    PODRESOURCES = "podresources"
    CHECKPOINT = "checkpoint"
    DRA = "dra"


@dataclass(frozen=True, slots=True)
class Meta:
    node: str
    source: str
    epoch: int
    seq: int
    time_ms: int


@dataclass(frozen=True, slots=True)
class SourceHealth:
    source: str  # podresources | checkpoint | nvml | mig | procfs | dra | device-ids (the joiner's)
    state: str  # ok | absent | corrupt | unavailable | error | disabled
    detail: str = ""


@dataclass(frozen=True, slots=True)
class MigRef:
    uuid: str
    profile: str = ""
    gi: int = 0
    ci: int = 0


# ---------------------------------------------------------------- node events (probe)


@dataclass(frozen=True, slots=True)
class AllocationEntry:
    source: AllocSource
    container: str
    resource: str
    device_ids: tuple[str, ...]
    pod_uid: str = ""  # checkpoint
    namespace: str = ""  # podresources / dra
    pod: str = ""  # podresources / dra
    claim_name: str = ""
    claim_namespace: str = ""
    driver: str = ""
    pool: str = ""
    device: str = ""
    # checkpoint only: NVIDIA_VISIBLE_DEVICES of the entry's AllocResp, split at commas (what the
    # container was given; for HAMi it can differ from the card its device IDs name)
    visible_devices: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AllocationSnapshot:
    meta: Meta
    entries: tuple[AllocationEntry, ...]
    allocatable: tuple[tuple[str, str], ...] = ()  # (resource, device_id)
    health: tuple[SourceHealth, ...] = ()


@dataclass(frozen=True, slots=True)
class ProcessSample:
    pid: int
    pod_uid: str = ""
    container_id: str = ""
    qos: str = ""
    sm_util_pct: float | None = None
    mem_util_pct: float | None = None
    used_mib: float | None = None


@dataclass(frozen=True, slots=True)
class DcgmProfile:
    """DCGM profiling fields of one device from the node's dcgm-exporter, in percent (DCGM's ratios
    x 100); None where the exporter gave no (fresh) value."""

    gr_engine_active_pct: float | None = None  # MIG-safe utilization: graphics/compute engine activity
    sm_active_pct: float | None = None
    sm_occupancy_pct: float | None = None
    tensor_active_pct: float | None = None
    dram_active_pct: float | None = None


@dataclass(frozen=True, slots=True)
class DeviceSample:
    uuid: str
    parent_uuid: str = ""  # set for MIG instances
    index: int = 0
    mig: MigRef | None = None
    util_pct: float | None = None
    mem_util_pct: float | None = None
    fb_used_mib: float | None = None
    fb_total_mib: float | None = None
    power_w: float | None = None
    temp_c: float | None = None
    lost: bool = False
    processes: tuple[ProcessSample, ...] = ()
    error: str = ""
    dcgm: DcgmProfile | None = None  # from the node's dcgm-exporter, when the probe scrapes one

    @property
    def gpu_uuid(self) -> str:
        return self.parent_uuid or self.uuid


@dataclass(frozen=True, slots=True)
class NodeTelemetry:
    meta: Meta
    devices: tuple[DeviceSample, ...]

    def without_processes(self) -> NodeTelemetry:
        """The sample without its per-process detail: what a node keeps of its last sample (duplicate
        detection and the GPU view read none of it), some 240 bytes less per device."""
        for d in self.devices:
            if d.processes:
                break
        else:
            return self
        # Positional, in DeviceSample's field order (a test compares with dataclasses.replace).
        return NodeTelemetry(self.meta, tuple(
            DeviceSample(d.uuid, d.parent_uuid, d.index, d.mig, d.util_pct, d.mem_util_pct, d.fb_used_mib,
                         d.fb_total_mib, d.power_w, d.temp_c, d.lost, (), d.error, d.dcgm)
            if d.processes else d for d in self.devices))


@dataclass(frozen=True, slots=True)
class XidEvent:
    meta: Meta
    gpu_uuid: str
    code: int
    mig: MigRef | None = None


@dataclass(frozen=True, slots=True)
class MigDeviceInfo:
    uuid: str
    profile: str
    gi: int
    ci: int
    memory_mib: float = 0.0


@dataclass(frozen=True, slots=True)
class GpuInfo:
    uuid: str
    index: int
    model: str = ""
    memory_mib: float = 0.0
    minor: int | None = 0  # N in /dev/nvidiaN; None when NVML could not tell it (never guessed)
    mig_enabled: bool = False
    mig_devices: tuple[MigDeviceInfo, ...] = ()
    lost: bool = False
    pci_bus_id: str = ""


@dataclass(frozen=True, slots=True)
class DeviceInventory:
    meta: Meta
    gpus: tuple[GpuInfo, ...]
    health: tuple[SourceHealth, ...] = ()
    driver_version: str = ""
    cuda_driver_version: str = ""


# ---------------------------------------------------------------- cluster events (kube_watcher)


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    name: str
    container_id: str = ""
    requests: tuple[tuple[str, str], ...] = ()
    limits: tuple[tuple[str, str], ...] = ()
    claims: tuple[str, ...] = ()
    init: bool = False
    runtime: str = ""  # from the containerID scheme: containerd | crio | docker | other scheme | ""


@dataclass(frozen=True, slots=True)
class PodClaimStatus:
    name: str
    resource_claim_name: str


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    claim_name: str
    request: str
    driver: str
    pool: str
    device: str
    share_id: str = ""
    admin_access: bool = False  # allocated for administrative access (monitoring): never a holder


@dataclass(frozen=True, slots=True)
class PodInfo:
    uid: str
    namespace: str
    name: str
    node: str = ""
    phase: str = ""
    qos: str = ""
    owner_kind: str = ""
    owner_name: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    created_ms: int = 0
    deletion_ms: int = 0
    resource_version: str = ""
    containers: tuple[ContainerInfo, ...] = ()
    claim_statuses: tuple[PodClaimStatus, ...] = ()
    mirror_of: str = ""
    claim_devices: tuple[ClaimDevice, ...] = ()
    started_ms: int = 0


@dataclass(frozen=True, slots=True)
class PodEvent:
    meta: Meta
    pod: PodInfo
    deleted: bool = False
    relist: bool = False


@dataclass(frozen=True, slots=True)
class NodeEvent:
    meta: Meta
    name: str
    labels: tuple[tuple[str, str], ...] = ()
    capacity: tuple[tuple[str, str], ...] = ()
    allocatable: tuple[tuple[str, str], ...] = ()
    deleted: bool = False
    unschedulable: bool = False
    ready: bool = True

    def label(self, key: str, default: str = "") -> str:
        for k, v in self.labels:
            if k == key:
                return v
        return default


@dataclass(frozen=True, slots=True)
class OperandStatus:
    name: str
    component: str
    present: bool
    desired: int = 0
    ready: int = 0
    available: int = 0


@dataclass(frozen=True, slots=True)
class PolicyEvent:
    meta: Meta
    crd: str  # installed | not-installed | error
    name: str = ""
    state: str = ""
    namespace: str = ""
    components: tuple[tuple[str, bool | None], ...] = ()  # (spec key, enabled or None=default)
    operands: tuple[OperandStatus, ...] = ()
    detail: str = ""
    dra_available: bool = False
    kind: str = ""  # the CR in force: ClusterPolicy | GPUCluster | "" (none)
    gpu_cluster_crd: str = ""  # gpuclusters.nvidia.com: installed | not-installed | error | "" (not asked)


NodeInput = AllocationSnapshot | NodeTelemetry | XidEvent | DeviceInventory | PodEvent | NodeEvent

# ---------------------------------------------------------------- outputs (joiner)


@dataclass(frozen=True, slots=True)
class Owner:
    pod_uid: str
    namespace: str
    pod: str
    container: str
    device_id: str


@dataclass(frozen=True, slots=True)
class WindowStat:
    start_ms: int
    samples: int = 0
    util_sum: float = 0.0
    util_samples: int = 0
    fb_max_mib: float = 0.0
    power_sum_w: float = 0.0
    # GPU-hours accounting (periscope.core.accounting), device-equivalent ms: allocated, used, idle,
    # unmeasured (no utilization reported), framebuffer MiB x ms, energy (J), one per device x ms
    gpu_ms: float = 0.0
    used_gpu_ms: float = 0.0
    idle_gpu_ms: float = 0.0
    unmeasured_gpu_ms: float = 0.0
    fb_mib_ms: float = 0.0
    energy_j: float = 0.0
    request_gpu_ms: float = 0.0
    alloc_basis: str = ""


@dataclass(frozen=True, slots=True)
class AttributionRow:
    container: str
    device_id: str
    gpu_uuid: str
    sharing: str  # exclusive | time-slicing | mps | mig
    share_basis: str  # exclusive | process | memory-weighted | equal-split | none
    mig: MigRef | None = None
    util_pct: float | None = None
    fb_used_mib: float | None = None
    power_w: float | None = None
    active: bool = True
    idle: bool = False
    first_seen_ms: int = 0
    last_seen_ms: int = 0
    sources: tuple[str, ...] = ()
    idle_since_ms: int = 0
    avg_util_pct: float | None = None
    wasted_gpu_hours: float = 0.0
    gpu_fraction: float = 1.0
    windows: tuple[WindowStat, ...] = ()
    sample_ms: int = 0
    unresolved: str = ""  # why the device ID names no known GPU ("" when it does; gpu_uuid is then "")
    # DCGM profiling fields of the held unit, where the unit is this row's alone (percent; else None).
    sm_active_pct: float | None = None
    sm_occupancy_pct: float | None = None
    tensor_active_pct: float | None = None
    dram_active_pct: float | None = None


@dataclass(frozen=True, slots=True)
class PodAttribution:
    pod_uid: str
    namespace: str
    pod: str
    node: str
    rows: tuple[AttributionRow, ...]
    owner_kind: str = ""
    owner_name: str = ""
    phase: str = ""
    created_ms: int = 0
    deleted_ms: int = 0
    as_of_ms: int = 0


@dataclass(frozen=True, slots=True)
class MigState:
    uuid: str
    profile: str
    gi: int
    ci: int
    fb_used_mib: float | None = None
    fb_total_mib: float | None = None
    owners: tuple[Owner, ...] = ()
    util_pct: float | None = None
    monitors: tuple[Owner, ...] = ()  # pods with admin (monitoring) access: not owners


@dataclass(frozen=True, slots=True)
class XidRef:
    code: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class GpuState:
    node: str
    gpu_uuid: str
    model: str = ""
    index: int = 0
    mig_devices: tuple[MigState, ...] = ()
    sharing: str = "exclusive"
    util_pct: float | None = None
    fb_used_mib: float | None = None
    fb_total_mib: float | None = None
    power_w: float | None = None
    temp_c: float | None = None
    owners: tuple[Owner, ...] = ()
    last_xid: XidRef | None = None
    sample_ms: int = 0
    lost: bool = False
    as_of_ms: int = 0
    monitors: tuple[Owner, ...] = ()  # pods with admin (monitoring) access to the GPU: not owners


FINDING_KINDS = ("idle", "xid-owner", "unattributed-usage", "ambiguous-join", "source-health")


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str  # one of FINDING_KINDS
    key: str  # pod UID or GPU UUID
    node: str
    at_ms: int
    id: str  # stable identity (kind + subject), so consumers can upsert
    gpu_uuid: str = ""
    mig: MigRef | None = None
    pod_uid: str = ""
    namespace: str = ""
    pod: str = ""
    container: str = ""
    device_id: str = ""
    xid_code: int = 0
    owners: tuple[Owner, ...] = ()
    message: str = ""
    active: bool = True
    wasted_gpu_hours: float = 0.0
    since_ms: int = 0
    avg_util_pct: float | None = None
    pids: tuple[int, ...] = field(default=())


Output = PodAttribution | GpuState | Finding

# Every sample builds several of these (decoding, attribution, outputs): a cheaper __init__, same API.
fast_init_all(globals())
