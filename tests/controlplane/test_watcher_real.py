"""The kube_watcher against Kubernetes' own apiserver, as its deploy/ ServiceAccount (RBAC applies).

Objects are written as a kubelet and the controllers would (periscope.sim.controlplane.writer):
created through validation and admission, status through the status subresource, pods deleted in two
steps. The watcher publishes into an in-memory sink; the assertions are on what it published and on
its watch statistics (pages, resumes, bookmarks, 410s).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from periscope.bus.topics import Topic
from periscope.core.model import NodeEvent, PodEvent, PolicyEvent
from periscope.settings.watcher import WatcherSettings
from periscope.sim.controlplane.process import ControlPlane
from periscope.sim.controlplane.writer import KubeObjects
from services.kube_watcher.service import KubeWatcher
from tests.controlplane.conftest import Identities

Obj = dict[str, Any]
OPERATOR_NS = "gpu-operator"


@dataclass
class Sink:
    sent: list[Any] = field(default_factory=list)

    async def send(self, topic: Topic, key: str, value: Any) -> None:
        self.sent.append(value)

    def pods(self, namespace: str) -> list[PodEvent]:
        return [e for e in self.sent if isinstance(e, PodEvent) and e.pod.namespace == namespace]

    def nodes(self, name: str) -> list[NodeEvent]:
        return [e for e in self.sent if isinstance(e, NodeEvent) and e.name == name]

    def policies(self) -> list[PolicyEvent]:
        return [e for e in self.sent if isinstance(e, PolicyEvent)]


async def until(cond: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def running(
    plane: ControlPlane, token: str, tmp: Path, **settings: Any
) -> AsyncIterator[tuple[KubeWatcher, Sink]]:
    kubeconfig = plane.write_kubeconfig(tmp / f"watcher-{uuid.uuid4().hex[:6]}.kubeconfig", token)
    sink = Sink()
    watcher = KubeWatcher(WatcherSettings(kubeconfig=str(kubeconfig), **settings), sink)
    stop = asyncio.Event()
    task = asyncio.create_task(watcher.run(stop))
    try:
        yield watcher, sink
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


def gpu_node(name: str) -> Obj:
    labels = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "nvidia.com/gpu.count": "2",
        "nvidia.com/mig.capable": "true",
        "kubernetes.io/hostname": name,
    }
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "2"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
        },
    }


def gpu_pod(ns: str, name: str, node: str, qos: str, *, claim: str = "") -> Obj:
    cpu = {"cpu": "1", "memory": "1Gi"}
    gpu = {} if claim else {"nvidia.com/gpu": "1"}
    resources = {
        "Guaranteed": {"requests": {**gpu, **cpu}, "limits": {**gpu, **cpu}},
        "Burstable": {"requests": {**gpu, **cpu}, "limits": dict(gpu)},
        "BestEffort": {"requests": dict(gpu), "limits": dict(gpu)},
    }[qos]
    container: Obj = {"name": "cuda", "image": "registry.example/train:1", "resources": resources}
    spec: Obj = {"nodeName": node, "containers": [container]}
    if claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
        container["resources"]["claims"] = [{"name": "gpu"}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
        "status": {
            "phase": "Running",
            "startTime": "2026-01-01T00:00:00Z",
            "containerStatuses": [
                {
                    "name": "cuda",
                    "ready": True,
                    "restartCount": 0,
                    "image": "train:1",
                    "imageID": "",
                    "containerID": f"containerd://{uuid.uuid4().hex * 2}",
                    "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
                }
            ],
        },
    }


def claim(ns: str, name: str, version: str, device: str) -> Obj:
    """A ResourceClaim in `version`'s own shape, allocated one GPU by the NVIDIA DRA driver."""
    request: Obj = {"name": "gpu"}
    wanted = {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}
    if version == "v1beta1":
        request.update(wanted)  # v1beta1 put the request's fields on the request itself
    else:
        request["exactly"] = wanted
    result = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "gpu-node-0", "device": device}
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": [request]}},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def write_claim(objects: KubeObjects, obj: Obj) -> None:
    """Create through the claim's own version (the writer's table knows v1 only)."""
    ns, name, api = obj["metadata"]["namespace"], obj["metadata"]["name"], obj["apiVersion"]
    base = f"/apis/{api}/namespaces/{ns}/resourceclaims"
    body = {k: v for k, v in obj.items() if k != "status"}
    r = objects.http.post(base, json=body)
    assert r.status_code == 201, r.text
    r = objects.http.patch(
        f"{base}/{name}/status",
        json={"status": obj["status"]},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert r.status_code == 200, r.text


@pytest.fixture
def objects(kube: ControlPlane) -> KubeObjects:
    return KubeObjects(kube.server, kube.ca_file, kube.admin.token)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


async def test_the_watcher_reads_a_real_cluster_as_its_service_account(
    kube: ControlPlane, identities: Identities, objects: KubeObjects, tmp_path: Path
) -> None:
    ns, node = unique("ml"), unique("gpu-node")
    objects.upsert("nodes", gpu_node(node))
    uids = {
        q: objects.upsert("pods", gpu_pod(ns, f"p-{q.lower()}", node, q))["metadata"]["uid"]
        for q in ("Guaranteed", "Burstable", "BestEffort")
    }
    async with running(kube, identities.watcher.token, tmp_path, list_page_size=2) as (watcher, sink):
        await until(lambda: {e.pod.uid for e in sink.pods(ns)} >= set(uids.values()))
        # Pods wait for nodes and claims only; readiness also waits for the policy sources' lists.
        await until(lambda: watcher.ready()[0])
        body = watcher.ready()[1]
        assert body["dra_version"] == "resource.k8s.io/v1" and body["crd"] in ("installed", "not-installed")
        qos = {e.pod.uid: e.pod.qos for e in sink.pods(ns)}
        assert {q: qos[u] for q, u in uids.items()} == {q: q for q in uids}  # the apiserver's own QoS class
        pod = next(e.pod for e in sink.pods(ns) if e.pod.uid == uids["Guaranteed"])
        assert pod.node == node and pod.phase == "Running" and pod.containers[0].container_id
        labels = dict(sink.nodes(node)[-1].labels)
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
        assert dict(sink.nodes(node)[-1].capacity)["nvidia.com/gpu"] == "2"
        pods = next(w for w in watcher.watches if w.kind == "pods")
        assert (
            pods.stats.lists == 1 and pods.stats.pages >= 2 and pods.stats.errors == 0
        )  # pages of 2; no 403

        # Deleted as the kubelet does: stamped (graceful delete), then removed.
        gone = {
            **gpu_pod(ns, "p-guaranteed", node, "Guaranteed"),
            "metadata": {
                "name": "p-guaranteed",
                "namespace": ns,
                "uid": uids["Guaranteed"],
                "deletionTimestamp": "2026-01-01T00:00:00Z",
            },
        }
        objects.upsert("pods", gone)
        objects.delete("pods", ns, "p-guaranteed")
        await until(lambda: any(e.deleted and e.pod.uid == uids["Guaranteed"] for e in sink.pods(ns)))
        stamped = [e for e in sink.pods(ns) if e.pod.uid == uids["Guaranteed"] and not e.deleted]
        assert stamped[-1].pod.deletion_ms > 0  # the terminating state was seen before the delete


async def test_policy_and_operand_status_through_the_crd(
    kube: ControlPlane, identities: Identities, objects: KubeObjects, tmp_path: Path
) -> None:
    objects.set_crd_installed(True)
    policy = {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "cluster-policy"},
        "spec": {
            "dcgm": {"enabled": False},
            "migManager": {"enabled": True},
            "operator": {"defaultRuntime": "containerd"},
        },
        "status": {
            "state": "notReady",
            "namespace": OPERATOR_NS,
            "conditions": [
                {
                    "type": "Error",
                    "status": "True",
                    "reason": "OperandNotReady",
                    "message": "ClusterPolicy is not ready, states not ready: [state-driver]",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
        },
    }
    objects.upsert("clusterpolicies", policy)
    labels = {"app": "nvidia-dcgm-exporter"}
    objects.upsert(
        "daemonsets",
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "nvidia-dcgm-exporter", "namespace": OPERATOR_NS, "labels": labels},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [{"name": "exporter", "image": "nvcr.io/nvidia/k8s/dcgm-exporter:4"}]
                    },
                },
            },
            "status": {
                "desiredNumberScheduled": 3,
                "currentNumberScheduled": 3,
                "numberReady": 2,
                "numberAvailable": 2,
                "numberMisscheduled": 0,
                "updatedNumberScheduled": 3,
            },
        },
    )
    # A value the CRD's schema refuses is refused by the apiserver, as on a real cluster.
    bad = objects.http.patch(
        "/apis/nvidia.com/v1/clusterpolicies/cluster-policy/status",
        json={"status": {"state": "sideways"}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert bad.status_code == 422 and "state" in bad.json()["message"]
    async with running(kube, identities.watcher.token, tmp_path, watch_timeout=2) as (watcher, sink):
        await until(lambda: any(p.crd == "installed" and p.name == "cluster-policy" for p in sink.policies()))
        event = [p for p in sink.policies() if p.name == "cluster-policy"][-1]
        assert event.state == "notReady" and "state-driver" in event.detail
        assert ("dcgm", False) in event.components and ("migManager", True) in event.components
        exporter = next(o for o in event.operands if o.name == "nvidia-dcgm-exporter")
        assert (exporter.present, exporter.desired, exporter.ready) == (True, 3, 2)

        await until(lambda: bool(watcher.watches))
        # 410 after a compaction: the DaemonSets (served from etcd in this control plane) are relisted
        # when their 2 s watch resumes from a version compacted away.
        daemonsets = next(w for w in watcher.watches if w.kind == "daemonsets")
        for _ in range(2):
            objects.upsert(
                "daemonsets",
                {
                    **_ds("periscope-bump"),
                    "metadata": {
                        "name": unique("bump"),
                        "namespace": "default",
                        "labels": {"app": "periscope-bump"},
                    },
                },
            )
        kube.compact()
        await until(lambda: daemonsets.stats.expired >= 1 and daemonsets.stats.lists >= 2)
        objects.delete("daemonsets", OPERATOR_NS, "nvidia-dcgm-exporter")
        await until(
            lambda: (
                not next(o for o in sink.policies()[-1].operands if o.name == "nvidia-dcgm-exporter").present
            )
        )


def _ds(app: str) -> Obj:
    labels = {"app": app}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": app, "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "c", "image": "registry.example/c:1"}]},
            },
        },
    }


async def test_watches_resume_and_bookmarks_carry_them_forward(
    kube: ControlPlane, identities: Identities, objects: KubeObjects, tmp_path: Path
) -> None:
    ns, elsewhere = unique("resume"), unique("elsewhere")
    node = unique("gpu-node")
    objects.upsert("nodes", gpu_node(node))
    async with running(kube, identities.watcher.token, tmp_path, watch_timeout=4) as (watcher, sink):
        await until(lambda: bool(watcher.watches))
        pods = next(w for w in watcher.watches if w.kind == "pods")
        await until(lambda: pods.synced.is_set())
        # Changes the watcher does not publish (unscheduled pods without GPUs) still move its version.
        for i in range(8):
            objects.upsert(
                "pods",
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": f"cpu-{i}", "namespace": elsewhere},
                    "spec": {"containers": [{"name": "c", "image": "registry.example/c:1"}]},
                },
            )
            await asyncio.sleep(0.5)
        await until(lambda: pods.stats.bookmarks >= 1 and pods.stats.watches >= 2, timeout_s=20)
        uid = objects.upsert("pods", gpu_pod(ns, "late", node, "Burstable"))["metadata"]["uid"]
        await until(lambda: any(e.pod.uid == uid for e in sink.pods(ns)))
        assert pods.stats.lists == 1 and pods.stats.expired == 0  # resumed every time, never relisted
