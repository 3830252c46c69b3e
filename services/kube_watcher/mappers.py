"""Pure mappers from apiserver objects (plain JSON dicts, as served) to Periscope cluster events.

No client, no clock: callers pass the event metadata and the current time. Objects come straight
from the API (raw JSON, or the client's ApiClient.sanitize_for_serialization), so keys are camelCase.
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterable, Mapping
from datetime import datetime
from fractions import Fraction
from typing import Any

from periscope.core.model import (
    ClaimDevice,
    ContainerInfo,
    Meta,
    NodeEvent,
    OperandStatus,
    PodClaimStatus,
    PodEvent,
    PodInfo,
    PolicyEvent,
)
from periscope.core.policy import (
    CLUSTER_POLICY,
    DAEMONSET_COMPONENT,
    GPU_PRESENT_LABEL,
    GPUCLUSTER,
    OPERANDS,
    Operand,
    operands_of,
)

Obj = Mapping[str, Any]
ClaimIndex = Mapping[tuple[str, str], Obj]  # (namespace, name) -> ResourceClaim
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
COMPONENT_LABEL = "app.kubernetes.io/component"
DRIVER_COMPONENT = "nvidia-driver"
DRIVER_DAEMONSET = "nvidia-driver-daemonset"
GPU_RESOURCE_PREFIX = "nvidia.com/"
_QOS_RESOURCES = ("cpu", "memory")
_SUFFIXES: dict[str, Fraction] = {
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+))(?:[eE]([+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?")


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: Any) -> str:
    return "" if value is None else str(value)


def parse_time_ms(value: Any) -> int:
    """RFC 3339 (metav1.Time / MicroTime) to Unix ms; 0 when absent or malformed."""
    if not isinstance(value, str) or not value:
        return 0
    try:
        return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return 0


def parse_quantity(value: Any) -> Fraction:
    """A resource.Quantity string ("500m", "1Gi", "2", "1e3") as an exact number."""
    match = _QUANTITY.fullmatch(_str(value).strip())
    if match is None:
        raise ValueError(f"not a quantity: {value!r}")
    number = Fraction(match.group(1))
    if match.group(2) is not None:
        return number * Fraction(10) ** int(match.group(2))
    return number * _SUFFIXES[match.group(3) or ""]


def strip_container_id(raw: Any) -> str:
    """`containerd://abc`, `cri-o://abc`, `docker://abc` -> `abc` (the ID cgroups carry)."""
    text = _str(raw)
    return text.split("://", 1)[1] if "://" in text else text


# containerID schemes (ContainerStatus.containerID "<type>://<container_id>", the CRI runtime's name).
_RUNTIMES = {"containerd": "containerd", "cri-o": "crio", "docker": "docker"}


def container_runtime(raw: Any) -> str:
    """The runtime a containerID names: containerd, crio, docker (cri-dockerd), another scheme as is,
    or "" before the container started."""
    text = _str(raw)
    if "://" not in text:
        return ""
    scheme = text.split("://", 1)[0]
    return _RUNTIMES.get(scheme, scheme)


def _resources(container: Obj, field: str) -> dict[str, str]:
    return {str(k): _str(v) for k, v in _dict(_dict(container.get("resources")).get(field)).items()}


def _sum_supported(lists: Iterable[Mapping[str, str]]) -> dict[str, Fraction]:
    total: dict[str, Fraction] = {}
    for resources in lists:
        for name, raw in resources.items():
            try:
                qty = parse_quantity(raw)
            except ValueError:
                continue
            if name in _QOS_RESOURCES and qty > 0:
                total[name] = total.get(name, Fraction(0)) + qty
    return total


def compute_qos(pod: Obj) -> str:
    """Kubernetes' QoS rules (pkg/apis/core/helper/qos), for pods whose status has no qosClass yet."""
    spec = _dict(pod.get("spec"))
    pod_level = _dict(spec.get("resources"))
    if any(k in _QOS_RESOURCES for f in ("requests", "limits") for k in _dict(pod_level.get(f))):
        requests = _sum_supported([_resources(spec, "requests")])
        limits = _sum_supported([_resources(spec, "limits")])
        guaranteed = all(r in limits for r in _QOS_RESOURCES)
    else:
        requests, limits, guaranteed = {}, {}, True
        for c in [*_list(spec.get("containers")), *_list(spec.get("initContainers"))]:
            lim = _resources(_dict(c), "limits")
            # The apiserver defaults a missing request to the limit; raw objects may predate defaulting.
            req = {**lim, **_resources(_dict(c), "requests")}
            for name, qty in _sum_supported([req]).items():
                requests[name] = requests.get(name, Fraction(0)) + qty
            found = _sum_supported([lim])
            for name, qty in found.items():
                limits[name] = limits.get(name, Fraction(0)) + qty
            guaranteed = guaranteed and all(r in found for r in _QOS_RESOURCES)
    if not requests and not limits:
        return "BestEffort"
    if guaranteed and all(limits.get(n) == q for n, q in requests.items()) and len(requests) == len(limits):
        return "Guaranteed"
    return "Burstable"


def controller_owner(meta: Obj) -> tuple[str, str]:
    """(kind, name) of the controller owner reference, else of the first owner reference."""
    refs = [_dict(r) for r in _list(meta.get("ownerReferences"))]
    ref = next((r for r in refs if r.get("controller") is True), refs[0] if refs else {})
    return _str(ref.get("kind")), _str(ref.get("name"))


def _extended(resources: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    # Extended resources are domain-prefixed (nvidia.com/gpu); cpu/memory/hugepages-* are not.
    return tuple(sorted((k, v) for k, v in resources.items() if "/" in k))


def _container(c: Obj, statuses: Mapping[str, Obj], init: bool) -> ContainerInfo:
    name = _str(c.get("name"))
    claims = tuple(_str(_dict(x).get("name")) for x in _list(_dict(c.get("resources")).get("claims")))
    raw_id = _dict(statuses.get(name)).get("containerID")
    return ContainerInfo(
        name=name,
        container_id=strip_container_id(raw_id),
        runtime=container_runtime(raw_id),
        requests=_extended(_resources(c, "requests")),
        limits=_extended(_resources(c, "limits")),
        claims=claims,
        init=init,
    )


def _containers(pod: Obj) -> tuple[ContainerInfo, ...]:
    """Restartable init containers (sidecars) first, then regular ones, as PodResources lists them."""
    spec, status = _dict(pod.get("spec")), _dict(pod.get("status"))

    def by_name(field: str) -> dict[str, Obj]:
        return {_str(_dict(s).get("name")): _dict(s) for s in _list(status.get(field))}

    init_status, main_status = by_name("initContainerStatuses"), by_name("containerStatuses")
    sidecars = [
        _container(_dict(c), init_status, True)
        for c in _list(spec.get("initContainers"))
        if _dict(c).get("restartPolicy") == "Always"
    ]
    return (*sidecars, *(_container(_dict(c), main_status, False) for c in _list(spec.get("containers"))))


def pod_claim_names(pod: Obj) -> tuple[str, ...]:
    """Names of the ResourceClaim objects a pod uses: direct references, generated claims (from
    status.resourceClaimStatuses) and the claim backing DRA extended resources."""
    spec, status = _dict(pod.get("spec")), _dict(pod.get("status"))
    generated = {
        _str(_dict(s).get("name")): _str(_dict(s).get("resourceClaimName"))
        for s in _list(status.get("resourceClaimStatuses"))
    }
    names: list[str] = []
    for ref in (_dict(r) for r in _list(spec.get("resourceClaims"))):
        # Kubernetes 1.26-1.30 nested the claim name under `source`; 1.31 flattened it.
        direct = ref.get("resourceClaimName") or _dict(ref.get("source")).get("resourceClaimName")
        names.append(_str(direct) or generated.get(_str(ref.get("name")), ""))
    names.append(_str(_dict(status.get("extendedResourceClaimStatus")).get("resourceClaimName")))
    return tuple(dict.fromkeys(n for n in names if n))


def _admin_requests(claim: Obj) -> set[str]:
    """Names of the requests asking for admin access: `exactly.adminAccess` in v1/v1beta2, the request's
    own `adminAccess` in v1beta1 (firstAvailable subrequests have none)."""
    requests = _list(_dict(_dict(claim.get("spec")).get("devices")).get("requests"))
    return {
        _str(r.get("name"))
        for r in (_dict(x) for x in requests)
        if r.get("adminAccess") is True or _dict(r.get("exactly")).get("adminAccess") is True
    }


def claim_devices(claim: Obj) -> tuple[ClaimDevice, ...]:
    """The devices allocated to a ResourceClaim (status.allocation.devices.results), each with its
    adminAccess: the result's echo, else (an apiserver that does not echo it) the request's."""
    name = _str(_dict(claim.get("metadata")).get("name"))
    results = _dict(_dict(_dict(claim.get("status")).get("allocation")).get("devices")).get("results")
    admin = _admin_requests(claim)
    return tuple(
        ClaimDevice(
            claim_name=name,
            request=_str(r.get("request")),
            driver=_str(r.get("driver")),
            pool=_str(r.get("pool")),
            device=_str(r.get("device")),
            share_id=_str(r.get("shareID")),
            admin_access=(
                r["adminAccess"] if isinstance(r.get("adminAccess"), bool)
                else _str(r.get("request")).split("/", 1)[0] in admin
            ),
        )
        for r in (_dict(x) for x in _list(results))
    )


def wants_gpu(pod: Obj) -> bool:
    """The pod requests an nvidia.com/* resource (any container) or uses a DRA claim."""
    spec = _dict(pod.get("spec"))
    for c in [*_list(spec.get("containers")), *_list(spec.get("initContainers"))]:
        for field in ("requests", "limits"):
            if any(k.startswith(GPU_RESOURCE_PREFIX) for k in _resources(_dict(c), field)):
                return True
    return bool(_list(spec.get("resourceClaims"))) or bool(pod_claim_names(pod))


def is_gpu_pod(pod: Obj, gpu_nodes: Container[str] = ()) -> bool:
    return wants_gpu(pod) or pod_node(pod) in gpu_nodes


def pod_node(pod: Obj) -> str:
    return _str(_dict(pod.get("spec")).get("nodeName"))


def pod_info(pod: Obj, claims: ClaimIndex | None = None) -> PodInfo:
    meta, status = _dict(pod.get("metadata")), _dict(pod.get("status"))
    namespace = _str(meta.get("namespace"))
    owner_kind, owner_name = controller_owner(meta)
    index = claims or {}
    devices = tuple(d for n in pod_claim_names(pod) for d in claim_devices(index.get((namespace, n), {})))
    return PodInfo(
        uid=_str(meta.get("uid")),
        namespace=namespace,
        name=_str(meta.get("name")),
        node=pod_node(pod),
        phase=_str(status.get("phase")),
        qos=_str(status.get("qosClass")) or compute_qos(pod),
        owner_kind=owner_kind,
        owner_name=owner_name,
        labels=tuple(sorted((str(k), _str(v)) for k, v in _dict(meta.get("labels")).items())),
        created_ms=parse_time_ms(meta.get("creationTimestamp")),
        deletion_ms=parse_time_ms(meta.get("deletionTimestamp")),
        resource_version=_str(meta.get("resourceVersion")),
        containers=_containers(pod),
        claim_statuses=tuple(
            PodClaimStatus(_str(_dict(s).get("name")), _str(_dict(s).get("resourceClaimName")))
            for s in _list(status.get("resourceClaimStatuses"))
        ),
        mirror_of=_str(_dict(meta.get("annotations")).get(MIRROR_ANNOTATION)),
        claim_devices=devices,
        started_ms=parse_time_ms(status.get("startTime")),
    )


def pod_event_time(pod: Obj, now_ms: int) -> int:
    """When the pod last changed, from its own timestamps (never later than now): creation, start,
    condition transitions, container starts/finishes, and the moment deletion was requested."""
    meta, status = _dict(pod.get("metadata")), _dict(pod.get("status"))
    stamps = [parse_time_ms(meta.get("creationTimestamp")), parse_time_ms(status.get("startTime"))]
    stamps += [parse_time_ms(_dict(c).get("lastTransitionTime")) for c in _list(status.get("conditions"))]
    for field in ("containerStatuses", "initContainerStatuses"):
        for cs in (_dict(s) for s in _list(status.get(field))):
            for state in _dict(cs.get("state")).values():
                stamps += [
                    parse_time_ms(_dict(state).get("startedAt")),
                    parse_time_ms(_dict(state).get("finishedAt")),
                ]
    deletion = parse_time_ms(meta.get("deletionTimestamp"))
    if deletion:
        grace = meta.get("deletionGracePeriodSeconds")
        stamps.append(deletion - int(grace) * 1000 if isinstance(grace, int) else deletion)
    latest = max(stamps)
    return min(latest, now_ms) if latest > 0 else now_ms


def pod_event(
    pod: Obj, meta: Meta, claims: ClaimIndex | None = None, *, deleted: bool = False, relist: bool = False
) -> PodEvent:
    return PodEvent(meta=meta, pod=pod_info(pod, claims), deleted=deleted, relist=relist)


def is_gpu_node(node: Obj) -> bool:
    return _dict(_dict(node.get("metadata")).get("labels")).get(GPU_PRESENT_LABEL) == "true"


def node_event(node: Obj, meta: Meta, *, deleted: bool = False) -> NodeEvent:
    md, spec, status = _dict(node.get("metadata")), _dict(node.get("spec")), _dict(node.get("status"))

    def pairs(value: Any) -> tuple[tuple[str, str], ...]:
        return tuple(sorted((str(k), _str(v)) for k, v in _dict(value).items()))

    ready = next(
        (
            _dict(c).get("status") == "True"
            for c in _list(status.get("conditions"))
            if _dict(c).get("type") == "Ready"
        ),
        True,
    )
    return NodeEvent(
        meta=meta,
        name=_str(md.get("name")),
        labels=pairs(md.get("labels")),
        capacity=pairs(status.get("capacity")),
        allocatable=pairs(status.get("allocatable")),
        deleted=deleted,
        unschedulable=spec.get("unschedulable") is True,
        ready=ready,
    )


def pick_policy(policies: Iterable[Obj]) -> Obj | None:
    """The ClusterPolicy in force: the operator reconciles one and marks the others `ignored`."""

    def rank(p: Obj) -> tuple[bool, str, str]:
        md = _dict(p.get("metadata"))
        ignored = _dict(p.get("status")).get("state") == "ignored"
        return ignored, _str(md.get("creationTimestamp")), _str(md.get("name"))

    return min(policies, key=rank, default=None)


def operand_name(ds: Obj) -> str:
    """The operand a DaemonSet runs. The driver's DaemonSets carry the node pool in their name
    (`nvidia-driver-daemonset-<kernel>-<os>` with precompiled drivers, `nvidia-gpu-driver-<os>-<hash>`
    from an NVIDIADriver CR) and all are labelled app.kubernetes.io/component=nvidia-driver."""
    md = _dict(ds.get("metadata"))
    name = _str(md.get("name"))
    component = _str(_dict(md.get("labels")).get(COMPONENT_LABEL))
    if name.startswith(DRIVER_DAEMONSET + "-") or component == DRIVER_COMPONENT:
        return DRIVER_DAEMONSET
    return name


def operand_statuses(
    daemonsets: Iterable[Obj], table: tuple[Operand, ...] = OPERANDS
) -> tuple[OperandStatus, ...]:
    """Every operand of `table` (present or not), then any other DaemonSet in the operator namespace.
    An operand run as several DaemonSets (the driver, one per node pool) is reported as their sum."""
    by_name: dict[str, list[Obj]] = {}
    for d in daemonsets:
        by_name.setdefault(operand_name(d), []).append(d)
    names = [
        *(o.daemonset for o in table),
        *sorted(n for n in by_name if n not in {o.daemonset for o in table}),
    ]
    out: list[OperandStatus] = []
    for name in names:
        found = by_name.get(name, [])
        sts = [_dict(d.get("status")) for d in found]
        out.append(
            OperandStatus(
                name=name,
                component=DAEMONSET_COMPONENT.get(name, ""),
                present=bool(found),
                desired=sum(int(st.get("desiredNumberScheduled") or 0) for st in sts),
                ready=sum(int(st.get("numberReady") or 0) for st in sts),
                available=sum(int(st.get("numberAvailable") or 0) for st in sts),
            )
        )
    return tuple(out)


def _error_condition(status: Obj) -> str:
    """The operator's Error condition ("OperandNotReady: ... states not ready: [state-driver]")."""
    for c in (_dict(x) for x in _list(status.get("conditions"))):
        if c.get("type") == "Error" and c.get("status") == "True":
            return ": ".join(t for t in (_str(c.get("reason")), _str(c.get("message"))) if t)
    return ""


def pick_gpucluster(crs: Iterable[Obj]) -> Obj | None:
    """The GPUCluster in force: a singleton, which the CRD's validation names gpu-cluster."""
    return min(crs, key=lambda c: (_str(_dict(c.get("metadata")).get("name")) != "gpu-cluster",
                                   _str(_dict(c.get("metadata")).get("name"))), default=None)  # fmt: skip


def policy_event(
    meta: Meta,
    *,
    crd: str,
    policies: Iterable[Obj],
    daemonsets: Iterable[Obj],
    namespace: str,
    dra_available: bool,
    detail: str = "",
    gpuclusters: Iterable[Obj] = (),
    gpucluster_crd: str = "",
) -> PolicyEvent:
    """One full PolicyEvent: the ClusterPolicy or GPUCluster in force (if any), its component switches
    (None = unset: the operator's own default, periscope.core.policy) and the status of the operand
    DaemonSets. A cluster runs one or the other; the GPUCluster controller refuses to reconcile while a
    ClusterPolicy exists, so with both the ClusterPolicy is in force."""
    all_policies, all_clusters = list(policies), list(gpuclusters)
    chosen = pick_policy(all_policies) if crd == "installed" else None
    kind = CLUSTER_POLICY
    if chosen is None and gpucluster_crd == "installed":
        chosen, kind = pick_gpucluster(all_clusters), GPUCLUSTER
    elif chosen is not None and all_clusters and gpucluster_crd == "installed" and not detail:
        other = _str(_dict(_dict(pick_gpucluster(all_clusters)).get("metadata")).get("name"))
        detail = (f"GPUCluster {other} exists beside the ClusterPolicy; "
                  "the operator reconciles only the latter")
    if chosen is None:
        return PolicyEvent(
            meta=meta,
            crd=crd,
            namespace=namespace,
            operands=operand_statuses(daemonsets),
            detail=detail,
            dra_available=dra_available,
            gpu_cluster_crd=gpucluster_crd,
        )
    md, spec, status = _dict(chosen.get("metadata")), _dict(chosen.get("spec")), _dict(chosen.get("status"))
    components = tuple(
        sorted(
            (str(k), v.get("enabled") if isinstance(v.get("enabled"), bool) else None)
            for k, v in spec.items()
            if isinstance(v, Mapping)
        )
    )
    if kind == CLUSTER_POLICY and len(all_policies) > 1 and not detail:
        detail = f"{len(all_policies)} ClusterPolicies; {md.get('name')} is in force"
    if not detail:
        detail = _error_condition(status)
    return PolicyEvent(
        meta=meta,
        crd=crd,
        name=_str(md.get("name")),
        state=_str(status.get("state")),
        namespace=_str(status.get("namespace")) or namespace,
        components=components,
        operands=operand_statuses(daemonsets, operands_of(kind)),
        detail=detail,
        dra_available=dra_available,
        kind=kind,
        gpu_cluster_crd=gpucluster_crd,
    )
