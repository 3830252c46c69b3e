"""The Kubernetes objects the simulated cluster's apiserver serves, built from the cluster model.

Pods (owner references, QoS resources, container statuses with the node's CRI scheme, deletion
timestamps), among them the device plugin's MPS control daemon on MPS nodes; GPU nodes with the labels
GPU Feature Discovery and the GPU operator set (product, sharing, MIG counts, deploy labels) and their
device capacity; the operator's ClusterPolicy and the operand DaemonSets it reconciled, with their
scheduling status and what `/v1/policy` should say about each. Every object is a plain dict shaped as
the real apiserver returns it, so the watcher's mappers read them unchanged.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from periscope.core.policy import OPERANDS
from periscope.sim.cluster.hardware import DRIVER_VERSION, gen_uuid, mig_capable, model_profile
from periscope.sim.cluster.model import MPS_DAEMONSET, ClusterModel, MpsDaemon, PodModel
from periscope.sim.scenario import ComponentSpec, Scenario
from periscope.wirejson import rfc3339

OPERATOR_NAMESPACE = "gpu-operator"
_CRI_SCHEME = {"containerd": "containerd", "crio": "cri-o", "docker": "docker"}


def pod_object(
    p: PodModel, created_ms: int, deleted_ms: int | None = None, runtime: str = "containerd"
) -> dict[str, Any]:
    # QoS from the resources: guaranteed limits what it requests, burstable only requests, best-effort neither
    qos = p.spec.qos
    cpu = {"cpu": "2", "memory": "8Gi"} if qos != "besteffort" else {}
    containers = []
    for c in p.containers:
        gpu = {c.spec.resource: str(c.spec.count)}
        res = {"limits": gpu | (cpu if qos == "guaranteed" else {}), "requests": gpu | cpu}
        containers.append((c.name, f"registry.example/{p.namespace}/{c.name}:1", res, c.container_id))
    owner = None if p.spec.owner is None else (p.spec.owner.kind, p.spec.owner.name)
    return pod_document(
        p.namespace, p.name, p.uid, p.node, dict(p.spec.labels or {}), owner,
        containers, qos, runtime, created_ms, deleted_ms,
    )


def pod_document(
    namespace: str, name: str, uid: str, node: str, labels: dict[str, str], owner: tuple[str, str] | None,
    containers: list[tuple[str, str, dict[str, Any], str]],  # (name, image, resources, container ID)
    qos: str, runtime: str, created_ms: int, deleted_ms: int | None = None,
) -> dict[str, Any]:
    """A running pod as the apiserver returns it (with its deletion stamped once it is going away)."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid, "labels": labels}
    meta["creationTimestamp"] = rfc3339(created_ms)
    if owner is not None:
        kind, owner_name = owner
        meta["ownerReferences"] = [
            {
                "apiVersion": "batch/v1" if kind in ("Job", "CronJob") else "apps/v1",
                "kind": kind,
                "name": owner_name,
                "controller": True,
                "blockOwnerDeletion": True,
                "uid": gen_uuid(0, "owner", namespace, kind, owner_name),
            }
        ]
    if deleted_ms is not None:
        meta["deletionTimestamp"] = rfc3339(deleted_ms)
        meta["deletionGracePeriodSeconds"] = 0
    statuses = [
        {
            "name": c,
            "containerID": f"{_CRI_SCHEME[runtime]}://{cid}",
            "ready": deleted_ms is None,
            "restartCount": 0,
            "image": image,
            "state": {"running": {"startedAt": rfc3339(created_ms)}},
        }
        for c, image, _, cid in containers
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeName": node,
            "containers": [{"name": c, "image": image, "resources": res} for c, image, res, _ in containers],
            "restartPolicy": "Always",
        },
        "status": {
            "phase": "Running",
            "qosClass": qos.capitalize().replace("Besteffort", "BestEffort"),
            "startTime": rfc3339(created_ms),
            "containerStatuses": statuses,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "False" if deleted_ms else "True",
                    "lastTransitionTime": rfc3339(deleted_ms or created_ms),
                }
            ],
        },
    }


def mps_daemon_pod_object(d: MpsDaemon, created_ms: int, runtime: str) -> dict[str, Any]:
    image = "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"
    labels = {"app.kubernetes.io/name": MPS_DAEMONSET}
    return pod_document(
        OPERATOR_NAMESPACE, d.name, d.uid, d.node, labels, ("DaemonSet", MPS_DAEMONSET),
        [("mps-control-daemon-ctr", image, {}, d.container_id)], "besteffort", runtime, created_ms,
    )


def node_object(model: ClusterModel, node: str) -> dict[str, Any]:
    spec = model.scenario.node(node)
    gpus = model.gpus[node]
    first = gpus[0]
    _, _, family = model_profile(first.model)
    shared = spec.sharing.strategy != "none"
    product = first.model.replace(" ", "-") + ("-SHARED" if shared and not spec.sharing.rename else "")
    labels = {
        "kubernetes.io/hostname": node,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.memory": str(first.memory_mib),
        "nvidia.com/gpu.count": str(len(gpus)),
        "nvidia.com/gpu.family": family,
        "nvidia.com/gpu.replicas": str(spec.sharing.replicas if shared else 1),
        "nvidia.com/gpu.sharing-strategy": spec.sharing.strategy,
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig.capable": str(any(mig_capable(g.model) for g in gpus)).lower(),
        "nvidia.com/mps.capable": str(spec.sharing.strategy == "mps").lower(),
        "nvidia.com/cuda.driver-version.full": DRIVER_VERSION,
        "nvidia.com/gpu.deploy.operands": "true",
        "nvidia.com/gpu.workload.config": "container",
    }
    for profile, count in Counter(m.profile for g in gpus for m in g.mig).items():
        labels[f"nvidia.com/mig-{profile}.count"] = str(count)
    for op in operands(model.scenario):  # none without a ClusterPolicy
        if node in deploy_nodes(model.scenario, op.component):
            labels[f"nvidia.com/gpu.deploy.{op.deploy_label}"] = "true"
    capacity = {"cpu": "64", "memory": "515920Mi", "pods": "110"}
    capacity.update((resource, str(len(ids))) for resource, ids in model.registered(node).items())
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node, "labels": labels},
        "spec": {},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


@dataclass(frozen=True, slots=True)
class Operand:
    component: str  # ClusterPolicy spec key
    daemonset: str
    deploy_label: str  # nvidia.com/gpu.deploy.<this>=true selects its nodes
    present: bool  # whether the DaemonSet exists
    desired: int
    ready: int
    # what /v1/policy should say: ok | degraded | disabled-as-intended | missing | unexpected
    expected_status: str


def deploy_nodes(s: Scenario, component: str) -> list[str]:
    """GPU nodes the operator labels for an operand (mig-manager only where MIG is possible)."""
    if component == "migManager":
        return [n.name for n in s.nodes if any(mig_capable(g.model) for g in n.gpus)]
    return [n.name for n in s.nodes]


def operands(s: Scenario) -> list[Operand]:
    """The operand DaemonSets the simulated operator reconciled, each with the /v1/policy status it
    deserves (an independent statement of the rules: wanted+ready = ok, wanted+short = degraded,
    wanted+absent = missing, unwanted+absent = disabled-as-intended, unwanted+running = unexpected)."""
    if s.policy is None:
        return []
    spec: dict[str, ComponentSpec] = {str(k): v for k, v in s.policy.components.items()}
    out: list[Operand] = []
    for op in OPERANDS:
        c = spec.get(op.component) or ComponentSpec()  # every field None: the spec is silent
        wanted = op.wanted(c.enabled)
        present = wanted if c.present is None else c.present
        nodes = len(deploy_nodes(s, op.component))
        desired = (nodes if present else 0) if c.desired is None else c.desired
        ready = desired if c.ready is None else c.ready
        if not present:
            desired = ready = 0
            status = "missing" if wanted else "disabled-as-intended"
        elif not wanted:
            status = "unexpected"
        else:
            status = "ok" if ready >= desired >= nodes else "degraded"
        out.append(Operand(op.component, op.daemonset, op.deploy_label, present, desired, ready, status))
    return out


def cluster_policy_object(model: ClusterModel) -> dict[str, Any] | None:
    policy = model.scenario.policy
    if policy is None:
        return None
    spec: dict[str, Any] = {"operator": {"defaultRuntime": "containerd"}, "mig": {"strategy": "mixed"}}
    for comp, c in policy.components.items():
        if c.enabled is not None:
            spec[comp] = {"enabled": c.enabled}
    return {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": policy.name},
        "spec": spec,
        "status": {"state": policy.state, "namespace": OPERATOR_NAMESPACE},
    }


def daemonset_objects(model: ClusterModel) -> list[dict[str, Any]]:
    return [_daemonset(op) for op in operands(model.scenario) if op.present]


def _daemonset(op: Operand) -> dict[str, Any]:
    labels = {"app": op.daemonset}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": op.daemonset, "namespace": OPERATOR_NAMESPACE, "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {f"nvidia.com/gpu.deploy.{op.deploy_label}": "true"},
                    "containers": [{"name": op.component.lower(), "image": f"nvcr.io/nvidia/{op.daemonset}"}],
                },
            },
        },
        "status": {
            "desiredNumberScheduled": op.desired,
            "currentNumberScheduled": op.desired,
            "updatedNumberScheduled": op.desired,
            "numberReady": op.ready,
            "numberAvailable": op.ready,
            "numberMisscheduled": 0,
            "observedGeneration": 1,
        },
    }
