"""Golden tables for the kube_watcher mappers: an apiserver object in, the exact event out."""

from __future__ import annotations

from fractions import Fraction
from typing import Any, TypeVar

import pytest

from periscope.bus import topics
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
from services.kube_watcher import mappers
from services.kube_watcher.state import ClusterState, Outgoing
from services.kube_watcher.watch import Changed, Listed, Unavailable

T0 = "2026-03-01T10:00:00Z"
T0_MS = 1772359200000
META = Meta(node="gpu-a", source="kube_watcher", epoch=1, seq=7, time_ms=T0_MS)


def ms(seconds_after_t0: float) -> int:
    return T0_MS + int(seconds_after_t0 * 1000)


STS_POD_V1: dict[str, Any] = {
    "metadata": {
        "name": "trainer-0",
        "namespace": "ml",
        "uid": "0b5c-old",
        "resourceVersion": "101",
        "creationTimestamp": T0,
        "labels": {"app": "trainer", "statefulset.kubernetes.io/pod-name": "trainer-0"},
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "name": "trainer",
                "uid": "s1",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    },
    "spec": {
        "nodeName": "gpu-a",
        "containers": [
            {
                "name": "cuda",
                "image": "nvcr.io/nvidia/pytorch:25.01-py3",
                "resources": {
                    "requests": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"},
                    "limits": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"},
                },
            }
        ],
    },
    "status": {
        "phase": "Running",
        "qosClass": "Guaranteed",
        "startTime": "2026-03-01T10:00:02Z",
        "containerStatuses": [
            {
                "name": "cuda",
                "containerID": "containerd://a1b2c3",
                "ready": True,
                "state": {"running": {"startedAt": "2026-03-01T10:00:05Z"}},
            }
        ],
    },
}
# The StatefulSet controller recreated trainer-0 after a delete: same name, new UID, new container.
STS_POD_V2: dict[str, Any] = {
    **STS_POD_V1,
    "metadata": {
        **STS_POD_V1["metadata"],
        "uid": "7f3e-new",
        "resourceVersion": "140",
        "creationTimestamp": "2026-03-01T10:05:00Z",
    },
    "status": {
        **STS_POD_V1["status"],
        "startTime": "2026-03-01T10:05:01Z",
        "containerStatuses": [
            {
                "name": "cuda",
                "containerID": "cri-o://d4e5f6",
                "state": {"running": {"startedAt": "2026-03-01T10:05:03Z"}},
            }
        ],
    },
}

DRA_POD: dict[str, Any] = {
    "metadata": {
        "name": "infer-7d9c",
        "namespace": "serve",
        "uid": "dra-uid-1",
        "resourceVersion": "55",
        "creationTimestamp": T0,
        "ownerReferences": [{"kind": "ReplicaSet", "name": "infer-5f4d", "controller": True}],
    },
    "spec": {
        "nodeName": "gpu-b",
        "resourceClaims": [
            {"name": "gpu", "resourceClaimTemplateName": "single-gpu"},
            {"name": "shared", "resourceClaimName": "team-a100"},
        ],
        "containers": [{"name": "server", "resources": {"claims": [{"name": "gpu"}, {"name": "shared"}]}}],
    },
    "status": {
        "phase": "Running",
        "qosClass": "BestEffort",
        "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "infer-7d9c-gpu-x2k4p"}],
    },
}
CLAIMS: dict[tuple[str, str], dict[str, Any]] = {
    ("serve", "infer-7d9c-gpu-x2k4p"): {
        "metadata": {
            "name": "infer-7d9c-gpu-x2k4p",
            "namespace": "serve",
            "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"},
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "gpu-b", "device": "gpu-0"}
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": "infer-7d9c", "uid": "dra-uid-1"}],
        },
    },
    ("serve", "team-a100"): {
        "metadata": {"name": "team-a100", "namespace": "serve"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "mig/small",
                            "driver": "gpu.nvidia.com",
                            "pool": "gpu-b",
                            "device": "gpu-1-mig-1g10gb-19-2",
                            "shareID": "s-1",
                        }
                    ]
                }
            }
        },
    },
    ("other-ns", "infer-7d9c-gpu-x2k4p"): {"metadata": {"name": "wrong-namespace"}, "status": {}},
}

SIDECAR_POD: dict[str, Any] = {
    "metadata": {
        "name": "etl",
        "namespace": "data",
        "uid": "sc-1",
        "creationTimestamp": T0,
        "deletionTimestamp": "2026-03-01T10:10:30Z",
        "deletionGracePeriodSeconds": 30,
        "ownerReferences": [
            {"kind": "Workflow", "name": "wf"},
            {"kind": "Job", "name": "etl-job", "controller": True},
        ],
    },
    "spec": {
        "initContainers": [
            {"name": "fetch", "resources": {}},  # ordinary init container: not reported
            {
                "name": "proxy",
                "restartPolicy": "Always",
                "resources": {"limits": {"nvidia.com/gpu.shared": "1"}},
            },
        ],
        "containers": [{"name": "main", "resources": {"requests": {"cpu": "500m"}}}],
    },
    "status": {
        "phase": "Running",
        "initContainerStatuses": [
            {"name": "fetch", "containerID": "containerd://f0"},
            {"name": "proxy", "containerID": "docker://p1"},
        ],
        "containerStatuses": [{"name": "main"}],
    },
}

MIRROR_POD: dict[str, Any] = {
    "metadata": {
        "name": "gpu-burn-gpu-c",
        "namespace": "kube-system",
        "uid": "mirror-uid",
        "creationTimestamp": T0,
        "annotations": {"kubernetes.io/config.mirror": "6c1f2a", "kubernetes.io/config.hash": "6c1f2a"},
        "ownerReferences": [{"kind": "Node", "name": "gpu-c", "controller": True}],
    },
    "spec": {
        "nodeName": "gpu-c",
        "containers": [{"name": "burn", "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
    },
    "status": {"phase": "Pending"},
}

PENDING_POD: dict[str, Any] = {
    "metadata": {"name": "queued", "namespace": "ml", "uid": "pend-1", "creationTimestamp": T0},
    "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}}}]},
    "status": {"phase": "Pending"},
}

POD_CASES: list[tuple[str, dict[str, Any], PodInfo]] = [
    (
        "statefulset pod, first incarnation",
        STS_POD_V1,
        PodInfo(
            uid="0b5c-old",
            namespace="ml",
            name="trainer-0",
            node="gpu-a",
            phase="Running",
            qos="Guaranteed",
            owner_kind="StatefulSet",
            owner_name="trainer",
            labels=(("app", "trainer"), ("statefulset.kubernetes.io/pod-name", "trainer-0")),
            created_ms=T0_MS,
            resource_version="101",
            started_ms=ms(2),
            containers=(
                ContainerInfo(
                    name="cuda",
                    container_id="a1b2c3",
                    runtime="containerd",
                    requests=(("nvidia.com/gpu", "1"),),
                    limits=(("nvidia.com/gpu", "1"),),
                ),
            ),
        ),
    ),
    (
        "statefulset pod recreated with the same name",
        STS_POD_V2,
        PodInfo(
            uid="7f3e-new",
            namespace="ml",
            name="trainer-0",
            node="gpu-a",
            phase="Running",
            qos="Guaranteed",
            owner_kind="StatefulSet",
            owner_name="trainer",
            labels=(("app", "trainer"), ("statefulset.kubernetes.io/pod-name", "trainer-0")),
            created_ms=ms(300),
            resource_version="140",
            started_ms=ms(301),
            containers=(
                ContainerInfo(
                    name="cuda",
                    container_id="d4e5f6",
                    runtime="crio",
                    requests=(("nvidia.com/gpu", "1"),),
                    limits=(("nvidia.com/gpu", "1"),),
                ),
            ),
        ),
    ),
    (
        "pod with a generated and a shared DRA claim",
        DRA_POD,
        PodInfo(
            uid="dra-uid-1",
            namespace="serve",
            name="infer-7d9c",
            node="gpu-b",
            phase="Running",
            qos="BestEffort",
            owner_kind="ReplicaSet",
            owner_name="infer-5f4d",
            created_ms=T0_MS,
            resource_version="55",
            containers=(ContainerInfo(name="server", claims=("gpu", "shared")),),
            claim_statuses=(PodClaimStatus("gpu", "infer-7d9c-gpu-x2k4p"),),
            claim_devices=(
                ClaimDevice("infer-7d9c-gpu-x2k4p", "gpu", "gpu.nvidia.com", "gpu-b", "gpu-0"),
                ClaimDevice(
                    "team-a100", "mig/small", "gpu.nvidia.com", "gpu-b", "gpu-1-mig-1g10gb-19-2", "s-1"
                ),
            ),
        ),
    ),
    (
        "sidecar holds the GPU; plain init container skipped; controller owner wins",
        SIDECAR_POD,
        PodInfo(
            uid="sc-1",
            namespace="data",
            name="etl",
            phase="Running",
            qos="Burstable",
            owner_kind="Job",
            owner_name="etl-job",
            created_ms=T0_MS,
            deletion_ms=ms(630),
            containers=(
                ContainerInfo(
                    name="proxy", container_id="p1", limits=(("nvidia.com/gpu.shared", "1"),), init=True,
                    runtime="docker",
                ),
                ContainerInfo(name="main"),
            ),
        ),
    ),
    (
        "static pod mirror, QoS computed from limits",
        MIRROR_POD,
        PodInfo(
            uid="mirror-uid",
            namespace="kube-system",
            name="gpu-burn-gpu-c",
            node="gpu-c",
            phase="Pending",
            qos="BestEffort",
            owner_kind="Node",
            owner_name="gpu-c",
            created_ms=T0_MS,
            mirror_of="6c1f2a",
            containers=(ContainerInfo(name="burn", limits=(("nvidia.com/gpu", "2"),)),),
        ),
    ),
    (
        "unscheduled pod with a MIG request",
        PENDING_POD,
        PodInfo(
            uid="pend-1",
            namespace="ml",
            name="queued",
            phase="Pending",
            qos="BestEffort",
            created_ms=T0_MS,
            containers=(ContainerInfo(name="c", limits=(("nvidia.com/mig-1g.10gb", "1"),)),),
        ),
    ),
]


@pytest.mark.parametrize(("obj", "want"), [c[1:] for c in POD_CASES], ids=[c[0] for c in POD_CASES])
def test_pod_info_golden(obj: dict[str, Any], want: PodInfo) -> None:
    assert mappers.pod_info(obj, CLAIMS) == want


def test_recreated_statefulset_pod_has_two_identities() -> None:
    old, new = mappers.pod_info(STS_POD_V1), mappers.pod_info(STS_POD_V2)
    assert (old.namespace, old.name) == (new.namespace, new.name)
    assert old.uid != new.uid and old.containers[0].container_id != new.containers[0].container_id


def test_pod_event_wraps_info_and_flags() -> None:
    ev = mappers.pod_event(DRA_POD, META, CLAIMS, deleted=True, relist=True)
    assert ev.meta == META and ev.deleted and ev.relist and ev.pod.uid == "dra-uid-1"
    assert mappers.pod_info(DRA_POD).claim_devices == ()  # claims not seen yet: no devices, no crash


def container(requests: dict[str, str] | None = None, limits: dict[str, str] | None = None) -> dict[str, Any]:
    return {"name": "c", "resources": {k: v for k, v in (("requests", requests), ("limits", limits)) if v}}


QOS_CASES = [
    ("no resources", [container()], "BestEffort"),
    ("only a GPU limit", [container(limits={"nvidia.com/gpu": "1"})], "BestEffort"),
    (
        "equal cpu+memory requests and limits",
        [container({"cpu": "1", "memory": "1Gi"}, {"cpu": "1000m", "memory": "1024Mi"})],
        "Guaranteed",
    ),
    (
        "limits only (requests default to limits)",
        [container(limits={"cpu": "2", "memory": "2G"})],
        "Guaranteed",
    ),
    (
        "requests below limits",
        [container({"cpu": "1", "memory": "1Gi"}, {"cpu": "2", "memory": "1Gi"})],
        "Burstable",
    ),
    ("cpu limit without memory limit", [container(limits={"cpu": "1"})], "Burstable"),
    (
        "one guaranteed, one besteffort container",
        [container(limits={"cpu": "1", "memory": "1Gi"}), container()],
        "Burstable",
    ),
    ("zero quantities are ignored", [container({"cpu": "0"}, {"memory": "0"})], "BestEffort"),
]


@pytest.mark.parametrize(("containers", "want"), [c[1:] for c in QOS_CASES], ids=[c[0] for c in QOS_CASES])
def test_compute_qos(containers: list[dict[str, Any]], want: str) -> None:
    assert mappers.compute_qos({"spec": {"containers": containers}}) == want
    # status.qosClass, when the apiserver set it, always wins.
    assert mappers.pod_info({"spec": {"containers": containers}, "status": {"qosClass": "X"}}).qos == "X"


def test_compute_qos_pod_level_resources() -> None:
    pod = {
        "spec": {
            "resources": {"limits": {"cpu": "4", "memory": "8Gi"}, "requests": {"cpu": "4", "memory": "8Gi"}},
            "containers": [container()],
        }
    }
    assert mappers.compute_qos(pod) == "Guaranteed"


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("500m", Fraction(1, 2)),
        ("1Gi", Fraction(2**30)),
        ("2", Fraction(2)),
        ("1e3", Fraction(1000)),
        ("1.5k", Fraction(1500)),
        ("1E", Fraction(10**18)),
        (3, Fraction(3)),
        ("100n", Fraction(1, 10**7)),
    ],
)
def test_parse_quantity(raw: object, want: Fraction) -> None:
    assert mappers.parse_quantity(raw) == want


@pytest.mark.parametrize("raw", ["", "abc", "1Xi", "--1"])
def test_parse_quantity_rejects_garbage(raw: str) -> None:
    with pytest.raises(ValueError):
        mappers.parse_quantity(raw)


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("containerd://abc", "abc"),
        ("cri-o://abc", "abc"),
        ("docker://abc", "abc"),
        ("abc", "abc"),
        (None, ""),
    ],
)
def test_strip_container_id(raw: str | None, want: str) -> None:
    assert mappers.strip_container_id(raw) == want


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        (T0, T0_MS),
        ("2026-03-01T10:00:00.250000Z", T0_MS + 250),
        ("2026-03-01T11:00:00+01:00", T0_MS),
        ("", 0),
        (None, 0),
        ("yesterday", 0),
    ],
)
def test_parse_time_ms(raw: str | None, want: int) -> None:
    assert mappers.parse_time_ms(raw) == want


def test_pod_event_time_uses_latest_object_timestamp_capped_at_now() -> None:
    assert mappers.pod_event_time(STS_POD_V1, now_ms=ms(3600)) == ms(5)  # container start
    assert mappers.pod_event_time(STS_POD_V1, now_ms=ms(4)) == ms(4)  # never in the future
    assert mappers.pod_event_time(SIDECAR_POD, now_ms=ms(3600)) == ms(600)  # deletion requested
    assert mappers.pod_event_time({"metadata": {}}, now_ms=42) == 42


@pytest.mark.parametrize(
    ("obj", "gpu_nodes", "want"),
    [
        (STS_POD_V1, (), True),
        (DRA_POD, (), True),
        (SIDECAR_POD, (), True),
        (PENDING_POD, (), True),
        ({"spec": {"nodeName": "gpu-a", "containers": [container()]}}, ("gpu-a",), True),
        ({"spec": {"nodeName": "cpu-1", "containers": [container({"cpu": "1"})]}}, ("gpu-a",), False),
        (
            {
                "spec": {"nodeName": "cpu-1"},
                "status": {"extendedResourceClaimStatus": {"resourceClaimName": "x"}},
            },
            (),
            True,
        ),
    ],
)
def test_is_gpu_pod(obj: dict[str, Any], gpu_nodes: tuple[str, ...], want: bool) -> None:
    assert mappers.is_gpu_pod(obj, gpu_nodes) is want


GPU_NODE: dict[str, Any] = {
    "metadata": {
        "name": "gpu-a",
        "labels": {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
            "nvidia.com/gpu.count": "8",
            "nvidia.com/gpu.deploy.dcgm-exporter": "false",
        },
    },
    "spec": {"unschedulable": True},
    "status": {
        "capacity": {"cpu": "96", "nvidia.com/gpu": "8"},
        "allocatable": {"cpu": "95", "nvidia.com/gpu": "8"},
        "conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "False"}],
    },
}


def test_node_event_golden() -> None:
    assert mappers.node_event(GPU_NODE, META) == NodeEvent(
        meta=META,
        name="gpu-a",
        labels=(
            ("nvidia.com/gpu.count", "8"),
            ("nvidia.com/gpu.deploy.dcgm-exporter", "false"),
            ("nvidia.com/gpu.present", "true"),
            ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB"),
        ),
        capacity=(("cpu", "96"), ("nvidia.com/gpu", "8")),
        allocatable=(("cpu", "95"), ("nvidia.com/gpu", "8")),
        unschedulable=True,
        ready=False,
    )
    bare = mappers.node_event({"metadata": {"name": "cpu-1"}}, META, deleted=True)
    assert bare == NodeEvent(meta=META, name="cpu-1", deleted=True)
    assert mappers.is_gpu_node(GPU_NODE) and not mappers.is_gpu_node({"metadata": {"name": "cpu-1"}})


def daemonset(name: str, desired: int, ready: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "gpu-operator"},
        "status": {"desiredNumberScheduled": desired, "numberReady": ready, "numberAvailable": ready},
    }


def cluster_policy(name: str, state: str, created: str = T0, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "creationTimestamp": created},
        "spec": spec,
        "status": {"state": state, "namespace": "nvidia-gpu-operator"},
    }


def test_policy_event_golden() -> None:
    policies = [
        cluster_policy("second", "ignored", "2026-01-01T00:00:00Z"),
        cluster_policy(
            "cluster-policy",
            "notReady",
            dcgmExporter={"enabled": False},
            devicePlugin={"enabled": True, "config": {"name": "ts"}},
            gfd={},
            hostPaths="x",
        ),
    ]
    dss = [
        daemonset("nvidia-device-plugin-daemonset", 3, 2),
        daemonset("nvidia-sandbox-validator", 1, 1),
        daemonset("nvidia-device-plugin-mps-control-daemon", 1, 1),
    ]
    ev = mappers.policy_event(
        META, crd="installed", policies=policies, daemonsets=dss, namespace="gpu-operator", dra_available=True
    )
    assert (ev.crd, ev.name, ev.state, ev.namespace, ev.dra_available) == (
        "installed",
        "cluster-policy",
        "notReady",
        "nvidia-gpu-operator",
        True,
    )
    assert ev.components == (("dcgmExporter", False), ("devicePlugin", True), ("gfd", None))
    assert ev.detail == "2 ClusterPolicies; cluster-policy is in force"
    ops = {o.name: o for o in ev.operands}
    assert ops["nvidia-device-plugin-daemonset"] == OperandStatus(
        "nvidia-device-plugin-daemonset", "devicePlugin", True, 3, 2, 2
    )
    assert ops["nvidia-dcgm-exporter"] == OperandStatus("nvidia-dcgm-exporter", "dcgmExporter", False)
    assert ops["nvidia-device-plugin-mps-control-daemon"].component == "devicePlugin"
    assert ops["nvidia-sandbox-validator"].component == "" and ops["nvidia-sandbox-validator"].present
    assert [o.name for o in ev.operands][:2] == [
        "nvidia-driver-daemonset",
        "nvidia-container-toolkit-daemonset",
    ]


def test_policy_event_without_crd_is_a_status_not_an_error() -> None:
    ev = mappers.policy_event(
        META, crd="not-installed", policies=[], daemonsets=[], namespace="gpu-operator", dra_available=False
    )
    assert (ev.crd, ev.name, ev.components, ev.dra_available) == ("not-installed", "", (), False)
    assert all(not o.present for o in ev.operands)


# ---------------------------------------------------------------- the event stream (ClusterState)


class Clock:
    def __init__(self) -> None:
        self.now = ms(3600)

    def __call__(self) -> int:
        return self.now


E = TypeVar("E")


def events(outs: list[Outgoing], kind: type[E]) -> list[E]:
    return [o.value for o in outs if isinstance(o.value, kind)]


def state() -> ClusterState:
    return ClusterState(epoch=T0_MS, clock=Clock())


def pods_of(outs: list[Outgoing]) -> list[tuple[str, str, bool, bool]]:
    return [
        (o.key, o.value.pod.uid, o.value.deleted, o.value.relist)
        for o in outs
        if isinstance(o.value, PodEvent)
    ]


def test_state_tracks_pods_by_uid_through_name_reuse() -> None:
    s = state()
    assert pods_of(s.handle(Changed("pods", "ADDED", STS_POD_V1))) == [("gpu-a", "0b5c-old", False, False)]
    assert pods_of(s.handle(Changed("pods", "DELETED", STS_POD_V1))) == [("gpu-a", "0b5c-old", True, False)]
    assert pods_of(s.handle(Changed("pods", "ADDED", STS_POD_V2))) == [("gpu-a", "7f3e-new", False, False)]
    assert list(s.tracked) == ["7f3e-new"]


def test_state_relist_is_a_full_snapshot_with_deletes_for_vanished_pods() -> None:
    s = state()
    s.handle(Listed("pods", (STS_POD_V1, SIDECAR_POD), "10"))
    outs = s.handle(Listed("pods", (STS_POD_V2, SIDECAR_POD), "20"))
    assert sorted(pods_of(outs)) == [
        ("", "sc-1", False, True),
        ("gpu-a", "0b5c-old", True, True),
        ("gpu-a", "7f3e-new", False, True),
    ]
    seqs = [o.value.meta.seq for o in outs]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_state_skips_updates_that_only_bump_the_resource_version() -> None:
    s = state()
    s.handle(Changed("pods", "ADDED", STS_POD_V1))
    bumped = {**STS_POD_V1, "metadata": {**STS_POD_V1["metadata"], "resourceVersion": "999"}}
    assert s.handle(Changed("pods", "MODIFIED", bumped)) == []
    failed = {**STS_POD_V1, "status": {**STS_POD_V1["status"], "phase": "Failed"}}
    assert [e.pod.phase for e in events(s.handle(Changed("pods", "MODIFIED", failed)), PodEvent)] == [
        "Failed"
    ]


def test_state_publishes_plain_pods_once_their_node_turns_gpu() -> None:
    s = state()
    plain = {
        "metadata": {"name": "x", "namespace": "ml", "uid": "plain-1"},
        "spec": {"nodeName": "gpu-a", "containers": [{"name": "c"}]},
    }
    s.handle(Listed("nodes", ({"metadata": {"name": "gpu-a"}},), "1"))
    assert s.handle(Changed("pods", "ADDED", plain)) == []
    outs = s.handle(
        Changed(
            "nodes", "MODIFIED", {"metadata": {"name": "gpu-a", "labels": {"nvidia.com/gpu.present": "true"}}}
        )
    )
    assert [o.topic for o in outs] == [topics.NODES, topics.PODS] and pods_of(outs)[0][1] == "plain-1"
    gone = events(s.handle(Changed("nodes", "DELETED", {"metadata": {"name": "gpu-a"}})), NodeEvent)
    assert [(e.name, e.deleted) for e in gone] == [("gpu-a", True)]


def test_state_resends_a_pod_when_its_claim_is_allocated() -> None:
    s = state()
    s.handle(Changed("pods", "ADDED", DRA_POD))
    outs = s.handle(Changed("resourceclaims", "ADDED", CLAIMS[("serve", "infer-7d9c-gpu-x2k4p")]))
    assert [d.device for o in outs if isinstance(o.value, PodEvent) for d in o.value.pod.claim_devices] == [
        "gpu-0"
    ]
    outs = s.handle(Unavailable("resourceclaims", 404, "not served"))  # DRA went away: devices drop
    assert [o.value.pod.claim_devices for o in outs if isinstance(o.value, PodEvent)] == [()]


def test_state_watches_gpuclusters_beside_cluster_policies() -> None:
    s = state()
    s.handle(Unavailable("clusterpolicies", 404, "404 Not Found"))
    s.handle(Listed("daemonsets", ({"metadata": {"name": "nvidia-dra-driver-kubelet-plugin"},
                                    "status": {"desiredNumberScheduled": 1, "numberReady": 1}},), "1"))
    s.handle(Listed("resourceclaims", (), "1"))
    cr = {"metadata": {"name": "gpu-cluster"}, "spec": {"draDriver": {}}, "status": {"state": "ready"}}
    [policy] = events(s.handle(Listed("gpuclusters", (cr,), "1")), PolicyEvent)
    assert (policy.kind, policy.name, policy.gpu_cluster_crd, policy.crd) == (
        "GPUCluster", "gpu-cluster", "installed", "not-installed")
    assert [o.name for o in policy.operands if o.present] == ["nvidia-dra-driver-kubelet-plugin"]
    [gone] = events(s.handle(Changed("gpuclusters", "DELETED", cr)), PolicyEvent)
    assert (gone.kind, gone.name) == ("", "")


def test_state_sends_one_policy_event_once_everything_answered() -> None:
    s = state()
    assert s.handle(Unavailable("clusterpolicies", 404, "404 Not Found")) == []
    assert s.handle(Listed("daemonsets", (), "1")) == []
    assert s.handle(Unavailable("gpuclusters", 404, "404 Not Found")) == []
    outs = s.handle(Listed("resourceclaims", (), "1"))
    [policy] = events(outs, PolicyEvent)
    assert [o.key for o in outs] == ["cluster"] and policy.meta.node == "cluster"
    assert (policy.crd, policy.gpu_cluster_crd) == ("not-installed", "not-installed")
    assert policy.dra_available
    assert s.handle(Listed("daemonsets", (), "2")) == []  # nothing changed: nothing sent
    [policy] = events(s.handle(Unavailable("clusterpolicies", 403, "403 Forbidden")), PolicyEvent)
    assert policy.crd == "error" and "403" in policy.detail
    assert policy.meta.time_ms == ms(3600) and policy.meta.epoch == T0_MS
    assert (
        not s.synced and s.handle(Listed("pods", (), "3")) == [] and s.handle(Listed("nodes", (), "3")) == []
    )
    assert s.synced
