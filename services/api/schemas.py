"""Response shapes, for /openapi.json and /docs only.

The endpoints build plain dicts (services.api.render) and skip response validation, which would cost
more than the query itself at 100,000 rows; a schema test checks these models against real responses.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from periscope.core.model import FINDING_KINDS


class Error(BaseModel):
    error: str


class Mig(BaseModel):
    uuid: str
    profile: str
    gi: int
    ci: int


class PodRow(BaseModel):
    pod_uid: str
    namespace: str
    pod: str
    container: str
    node: str
    device_id: str
    gpu_uuid: str
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
    first_seen: str | None
    last_seen: str | None
    sources: list[str]
    gpu_fraction: float | None
    sample_at: str | None
    unresolved: str | None = Field(
        None, description="why the device ID names no known GPU (gpu_uuid is then empty); null when it does"
    )
    sm_active_pct: float | None = Field(
        None, description="DCGM_FI_PROF_SM_ACTIVE of the held unit in percent; null when not available or "
        "the unit is shared (DCGM measures the unit, not a pod)")
    sm_occupancy_pct: float | None = Field(None, description="DCGM_FI_PROF_SM_OCCUPANCY in percent, as above")
    tensor_active_pct: float | None = Field(
        None, description="DCGM_FI_PROF_PIPE_TENSOR_ACTIVE in percent, as above")
    dram_active_pct: float | None = Field(None, description="DCGM_FI_PROF_DRAM_ACTIVE in percent, as above")


class IdleRow(PodRow):
    idle_since: str | None
    avg_util_pct: float | None
    wasted_gpu_hours: float | None


class Owner(BaseModel):
    pod_uid: str
    namespace: str
    pod: str
    container: str
    device_id: str


class Window(BaseModel):
    start: str | None
    samples: int
    avg_util_pct: float | None
    fb_max_mib: float | None
    avg_power_w: float | None


class PodDetailRow(PodRow):
    windows: list[Window] = Field(description="tumbling window stats, oldest first")


class PodOwnerRef(BaseModel):
    kind: str
    name: str


class PodDetail(BaseModel):
    pod_uid: str
    namespace: str
    pod: str
    node: str
    owner: PodOwnerRef | None
    phase: str
    created: str | None
    deleted: str | None
    as_of: str | None
    rows: list[PodDetailRow]


class MigDevice(Mig):
    owners: list[Owner]
    monitors: list[Owner] = Field(
        default_factory=list, description="pods with admin-access (monitoring) claims: not owners"
    )
    util_pct: float | None
    fb_used_mib: float | None
    fb_total_mib: float | None


class LastXid(BaseModel):
    code: int
    at: str | None


class GpuRow(BaseModel):
    node: str
    gpu_uuid: str
    model: str
    index: int
    mig_devices: list[MigDevice]
    sharing: str
    util_pct: float | None
    fb_used_mib: float | None
    fb_total_mib: float | None
    power_w: float | None
    temp_c: float | None
    owners: list[Owner]
    hidden_owners: int = Field(0, description="owners in namespaces the caller may not see, left out")
    monitors: list[Owner] = Field(
        default_factory=list,
        description="pods whose DRA claim has admin (monitoring) access to the GPU: they own nothing and "
        "take no share of its usage",
    )
    last_xid: LastXid | None
    sample_at: str | None
    lost: bool


class XidRow(BaseModel):
    at: str | None
    node: str
    gpu_uuid: str
    mig: Mig | None
    code: int
    owners: list[Owner] = Field(description="owners at the moment of the error, not at query time")
    hidden_owners: int = Field(0, description="owners in namespaces the caller may not see, left out")
    message: str


class FindingRow(BaseModel):
    id: str
    kind: str = Field(description=" | ".join(FINDING_KINDS))
    key: str
    node: str
    at: str | None
    active: bool
    gpu_uuid: str
    mig: Mig | None
    pod_uid: str
    namespace: str
    pod: str
    container: str
    device_id: str
    xid_code: int | None
    owners: list[Owner]
    hidden_owners: int = Field(0, description="owners in namespaces the caller may not see, left out")
    message: str
    since: str | None
    avg_util_pct: float | None
    wasted_gpu_hours: float | None
    pids: list[int]


class _Listing(BaseModel):
    as_of: str | None = Field(description="newest event time in the view (RFC 3339 UTC)")
    continue_: str | None = Field(
        alias="continue", description="pass as ?continue= for the next page; null on the last page"
    )


class PodList(_Listing):
    items: list[PodRow]


class IdleList(_Listing):
    items: list[IdleRow]
    threshold_pct: float | None = Field(description="null when the joiner's own idle flags were used")
    window: str | None


class GpuList(_Listing):
    items: list[GpuRow]


class XidList(_Listing):
    items: list[XidRow]


class FindingList(_Listing):
    items: list[FindingRow]


class ClusterPolicy(BaseModel):
    name: str
    state: str


class Component(BaseModel):
    name: str
    intended: str = Field(description="enabled | disabled | default")
    desired: int | None
    ready: int | None
    status: str = Field(description="ok | degraded | disabled-as-intended | missing | unexpected")
    daemonset: str | None = None
    nodes_on: int | None = Field(None, description="GPU nodes labelled to run the operand")
    nodes_off: int | None = Field(None, description="GPU nodes where the operand is labelled off")


class Policy(BaseModel):
    cluster_policy: ClusterPolicy | None
    gpu_cluster: ClusterPolicy | None = Field(
        None, description="the GPUCluster in force (GPU Operator v26.7's DRA stack), not a ClusterPolicy"
    )
    components: list[Component]
    crd: str | None = Field(None, description="ClusterPolicy CRD: installed | not-installed | error; "
                                              "null before the watcher reported")
    gpu_cluster_crd: str | None = Field(
        None, description="GPUCluster CRD: installed | not-installed | error; null before any report"
    )
    namespace: str = Field("", description="namespace of the GPU Operator's operands")
    dra_available: bool = Field(False, description="the cluster serves DRA ResourceClaims")
    detail: str = Field("", description="why the policy could not be read, when it could not")
    as_of: str | None = Field(None, description="event time of the policy state shown")


class Health(BaseModel):
    status: str


class Ready(BaseModel):
    ready: bool
    group_id: str | None
    lag: int | None
    error: str | None
    pending_partitions: int | None = Field(None, description="partitions not yet read up to their "
                                                             "end offset seen at start")
    data_age_s: float | None = Field(None, description="seconds since the view last took a new attribution")
    stale: bool | None = Field(None, description="no new attribution within API_STALE_AFTER, or the broker "
                                                 "unreachable")
    refused: dict[str, int] | None = Field(None, description="records not believed, by reason: `future` "
                                           "(event time too far ahead of the clock), `unknown-gpu` (a GPU "
                                           "no probe's inventory reported)")
    held_for_inventory: int | None = Field(None, description="records waiting for an inventory that "
                                           "names their GPU")
    last_refusal: str | None = Field(None, description="why the last refused record was refused")


class UsageNumbers(BaseModel):
    allocated_gpu_hours: float = Field(description="held device-equivalents x time (docs/accounting.md)")
    used_gpu_hours: float = Field(description="allocated time weighted by utilization")
    idle_gpu_hours: float = Field(description="allocated time of runs the idle verdict confirmed")
    unmeasured_gpu_hours: float = Field(description="allocated time without a utilization reading")
    memory_gib_hours: float
    energy_wh: float
    efficiency: float | None = Field(description="used over measured allocated; null when nothing measured")
    request_gpu_hours: float = Field(description="the request x hours baseline: one per device held")
    cost: float | None = Field(description="always null here: prices are a `periscope usage` option")
    pods: int


class UsageGroup(UsageNumbers):
    key: str
    namespace: str | None = Field(None, description="with by=pod")
    pod: str | None = Field(None, description="with by=pod")


class Usage(BaseModel):
    from_: str = Field(alias="from")
    to: str
    by: str = Field(description="namespace | workload | pod | node | gpu-model")
    groups: list[UsageGroup]
    total: UsageNumbers
    as_of: str
