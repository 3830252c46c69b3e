"""Response envelopes and the service's own shapes, for /openapi.json and /docs only.

The items are the output contract's (periscope.contract: one module per output kind, its JSON shape and
its model). The endpoints build plain dicts and skip response validation, which would cost more than
the query itself at 100,000 rows; a schema test checks these models against real responses.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from periscope.contract.attribution import IdleRow, PodDetail, PodRow
from periscope.contract.finding import FindingRow
from periscope.contract.gpu import Gpu
from periscope.contract.xid import XidRow


class Error(BaseModel):
    error: str


class _Listing(BaseModel):
    as_of: str | None = Field(description="newest event time in the view (RFC 3339 UTC)")
    continue_: str | None = Field(
        alias="continue", description="pass as ?continue= for the next page; null on the last page"
    )


class PodList(_Listing):
    items: list[PodRow]


class IdleList(_Listing):
    items: list[IdleRow]
    threshold_pct: float = Field(description="the threshold the rows were judged by")
    window: str = Field(description="the averaging window the rows were judged over")


class GpuList(_Listing):
    items: list[Gpu]


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
    key: str | None = Field(description="the group's namespace, workload, pod UID, node, GPU model or label "
                            "value; null when unknown (no such label, model not known)")
    namespace: str | None = Field(None, description="with by=pod")
    pod: str | None = Field(None, description="with by=pod")


class Usage(BaseModel):
    from_: str = Field(alias="from")
    to: str
    by: str = Field(description="namespace | workload | pod | node | gpu-model")
    groups: list[UsageGroup]
    total: UsageNumbers
    as_of: str


__all__ = ["FindingRow", "Gpu", "IdleRow", "PodDetail", "PodRow", "XidRow"]  # the items, for the routes
