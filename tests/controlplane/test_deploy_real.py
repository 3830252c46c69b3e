"""deploy/ against Kubernetes itself: every rendering (base, overlays, components, monitoring) is
server-side applied as a dry run, so validation, defaulting and admission (Pod Security included)
judge it; then, impersonating each ServiceAccount, every API call its service makes is allowed and a
sample of others (secrets, writes, other namespaces, other Leases) is denied, by the RBAC as written.

The renderings come from the same small kustomize the unit tier uses (tests/unit/test_deploy.py).
The prometheus-operator kinds of deploy/monitoring and Strimzi's KafkaUser get stand-in CRDs with open
schemas: the dry run proves they are well-formed objects of a served kind, not that their operators
accept them. The Helm chart is held equal to these renderings by its own tier.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from periscope.devkit.helm import home as helm_home
from periscope.sim.controlplane.apply import apply_documents
from periscope.sim.controlplane.cluster import apply_all
from periscope.sim.controlplane.process import ControlPlane
from periscope.sim.controlplane.writer import KubeObjects
from tests.controlplane.conftest import Identities
from tests.controlplane.test_watcher_real import running, until
from tests.unit.test_deploy import FLAVOURS, _flavour
from tests.unit.test_helm import PRESETS as HELM_PRESETS
from tests.unit.test_helm import _chart as helm_chart

Obj = dict[str, Any]
SA = "system:serviceaccount:{}:{}"
WATCHER, API = SA.format("periscope", "periscope-kube-watcher"), SA.format("periscope", "periscope-api")
LIST, WATCH = {"limit": "1"}, {"watch": "true", "timeoutSeconds": "1"}
DRY = {"dryRun": "All"}

# (method, path, query, body) of every call each service makes to the apiserver.
WATCHER_CALLS: list[tuple[str, str, dict[str, str], Obj | None]] = [
    *[
        (m, p, q, None)
        for p in (
            "/api/v1/pods",
            "/api/v1/nodes",
            "/apis/apps/v1/namespaces/gpu-operator/daemonsets",
            "/apis/nvidia.com/v1/clusterpolicies",
            "/apis/nvidia.com/v1alpha1/gpuclusters",
            "/apis/resource.k8s.io/v1/resourceclaims",
        )
        for m, q in (("GET", LIST), ("GET", WATCH))
    ],
    ("GET", "/apis", {}, None),  # discovery of the DRA version served
    ("GET", "/apis/resource.k8s.io", {}, None),
    ("GET", "/apis/resource.k8s.io/v1", {}, None),
]
LEASE = "/apis/coordination.k8s.io/v1/namespaces/periscope/leases"
LEASE_CALLS: list[tuple[str, str, dict[str, str], Obj | None]] = [  # with components/leader-election
    (
        "POST",
        LEASE,
        DRY,
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "periscope-kube-watcher"},
        },
    ),
    ("GET", f"{LEASE}/periscope-kube-watcher", {}, None),
    ("PUT", f"{LEASE}/periscope-kube-watcher", DRY, None),  # body: the Lease as read
]
API_CALLS: list[tuple[str, str, dict[str, str], Obj | None]] = [
    (
        "POST",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        {},
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": "alice-token"}},
    ),
    (
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        {},
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": "alice",
                "resourceAttributes": {"verb": "list", "resource": "pods", "namespace": "ml"},
            },
        },
    ),
]
# Calls no Periscope service may make.
DENIED: list[tuple[str, str, dict[str, str], Obj | None]] = [
    ("GET", "/api/v1/namespaces/periscope/secrets", {}, None),
    ("GET", "/api/v1/secrets", {}, None),
    ("GET", "/api/v1/namespaces/kube-system/configmaps", {}, None),
    (
        "POST",
        "/api/v1/namespaces/periscope/pods",
        DRY,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "x"},
            "spec": {"containers": [{"name": "c", "image": "registry.example/c:1"}]},
        },
    ),
    ("DELETE", "/api/v1/nodes/any-node", DRY, None),
    (
        "PATCH",
        "/apis/nvidia.com/v1/clusterpolicies/cluster-policy",
        DRY,
        {"metadata": {"labels": {"x": "y"}}},
    ),
    ("DELETE", "/apis/apps/v1/namespaces/gpu-operator/daemonsets/nvidia-dcgm-exporter", DRY, None),
    ("GET", f"{LEASE}/someone-elses-lease", {}, None),
    ("PUT", "/apis/coordination.k8s.io/v1/namespaces/default/leases/periscope-kube-watcher", DRY, {}),
    ("DELETE", f"{LEASE}/periscope-kube-watcher", DRY, None),
]
DISCOVERY = {"/apis", "/apis/resource.k8s.io", "/apis/resource.k8s.io/v1"}  # open to every authenticated user


def call(
    client: httpx.Client, method: str, path: str, query: dict[str, str], body: Obj | None
) -> httpx.Response:
    headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
    return client.request(method, path, params=query, json=body, headers=headers)


def allowed(r: httpx.Response) -> bool:
    return r.status_code not in (401, 403)


def _open_crd(group: str, version: str, kind: str, plural: str, scope: str) -> Obj:
    """A stand-in CRD: group, version, kind and scope as upstream's; the schema open."""
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    names = {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": scope,
            "names": names,
            "versions": [{"name": version, "served": True, "storage": True, "schema": schema}],
        },
    }


STAND_INS = [
    _open_crd("monitoring.coreos.com", "v1", "ServiceMonitor", "servicemonitors", "Namespaced"),
    _open_crd("monitoring.coreos.com", "v1", "PrometheusRule", "prometheusrules", "Namespaced"),
    _open_crd("nvidia.com", "v1alpha1", "GPUCluster", "gpuclusters", "Cluster"),  # GPU Operator v26.7
    _open_crd(
        "kafka.strimzi.io", "v1beta2", "KafkaUser", "kafkausers", "Namespaced"
    ),  # components/kafka-acls
]


@pytest.fixture(scope="module")
def monitoring_crds(kube: ControlPlane) -> None:
    """prometheus-operator's kinds for deploy/monitoring, Strimzi's KafkaUser for
    components/kafka-acls, and every kind the watcher reads: the ClusterPolicy CRD Periscope defines
    for its tests, a stand-in for the GPUCluster one."""
    apply_all(kube, STAND_INS)
    KubeObjects(kube.server, kube.ca_file, kube.admin.token).set_crd_installed(True)  # the ClusterPolicy CRD
    with kube.http() as http:
        deadline = time.monotonic() + 30
        for path in (
            "/apis/monitoring.coreos.com/v1",
            "/apis/nvidia.com/v1alpha1",
            "/apis/kafka.strimzi.io/v1beta2",
        ):
            while http.get(path).status_code != 200:
                assert time.monotonic() < deadline, "the stand-in CRDs were not served in time"
                time.sleep(0.1)


@pytest.fixture(scope="module")
def admin(kube: ControlPlane) -> Iterator[httpx.Client]:
    with kube.http() as client:
        yield client


def _dry_run(docs: list[Obj], admin: httpx.Client) -> None:
    """Server-side apply every document as a dry run: no refusal, and no Pod Security warning for the
    periscope namespace (it enforces "restricted": a workload there that would violate it is refused at
    pod creation, so the dry run of its controller must draw none)."""
    namespaces = [d for d in docs if d["kind"] == "Namespace"]
    # Namespaces the manifests use but do not make are the cluster's (Strimzi's `kafka`): made here.
    ours = {d["metadata"]["name"] for d in namespaces}
    theirs = {d["metadata"]["namespace"] for d in docs if d["metadata"].get("namespace")} - ours
    namespaces += [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}} for ns in sorted(theirs)
    ]
    assert all(r.status_code < 300 for r in apply_documents(admin, namespaces))  # namespaced docs need them
    problems, warnings = [], []
    for doc, r in zip(docs, apply_documents(admin, docs, dry_run=True), strict=True):
        name = f"{doc['kind']} {doc['metadata'].get('namespace', '')}/{doc['metadata']['name']}"
        if r.status_code >= 300:
            problems.append(f"{name}: HTTP {r.status_code}: {r.json().get('message', r.text)[:300]}")
        warnings += [f"{name}: {w}" for w in r.headers.get_list("warning") if "PodSecurity" in w]
    assert not problems, "\n".join(problems)
    assert not [w for w in warnings if " periscope/" in w], "\n".join(warnings)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_every_manifest_is_accepted_by_the_apiserver(
    flavour: str, kube: ControlPlane, admin: httpx.Client, monitoring_crds: None
) -> None:
    _dry_run(_flavour(flavour), admin)


# The first rendering may build helm (minutes on 2 cores, cold), past the suite's per-test timeout.
@pytest.mark.timeout(120 if (helm_home() / "complete").exists() else 1800)
@pytest.mark.parametrize("preset", sorted(HELM_PRESETS))
def test_every_helm_preset_is_accepted_by_the_apiserver(
    preset: str, kube: ControlPlane, admin: httpx.Client, monitoring_crds: None
) -> None:
    """The chart's renderings (default values and each preset; skipped where helm cannot be built),
    judged by the same dry run as the kustomize ones."""
    docs = helm_chart(HELM_PRESETS[preset][0])
    assert docs, "the chart rendered nothing"
    _dry_run(docs, admin)


def test_a_manifest_the_apiserver_refuses_or_warns_about_is_reported(admin: httpx.Client) -> None:
    """The checks above can fail: validation refuses a Deployment without containers, and Pod Security
    warns about a hostPID one in the restricted namespace."""

    def deployment(name: str, pod: Obj) -> Obj:
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": "periscope"},
            "spec": {
                "selector": {"matchLabels": {"a": name}},
                "template": {"metadata": {"labels": {"a": name}}, "spec": pod},
            },
        }

    broken, privileged = apply_documents(
        admin,
        [
            deployment("broken", {"containers": []}),
            deployment(
                "privileged",
                {"hostPID": True, "containers": [{"name": "c", "image": "registry.example/c:1"}]},
            ),
        ],
        dry_run=True,
    )
    assert broken.status_code == 422
    assert privileged.status_code < 300
    assert any("PodSecurity" in w and "hostPID" in w for w in privileged.headers.get_list("warning"))


def _service_accounts() -> set[str]:
    return {
        SA.format(d["metadata"]["namespace"], d["metadata"]["name"])
        for f in FLAVOURS
        for d in _flavour(f)
        if d["kind"] == "ServiceAccount"
    }


def test_each_service_account_may_make_its_calls_and_no_others(
    kube: ControlPlane, monitoring_crds: None
) -> None:
    accounts = _service_accounts()
    assert {WATCHER, API} <= accounts and len(accounts) >= 4  # probe, joiner, topic job: no API calls
    granted = {WATCHER: WATCHER_CALLS, API: API_CALLS}
    failures = []
    for account in sorted(accounts):
        mine = granted.get(account, [])
        others = [
            *DENIED,
            *(
                c
                for a, calls in granted.items()
                if a != account
                for c in calls
                if c not in mine and c[1] not in DISCOVERY
            ),
        ]
        with kube.impersonating(account) as client:
            failures += [
                f"{account} {m} {p}: {r.status_code} (should be allowed)"
                for m, p, q, b in mine
                if not allowed(r := call(client, m, p, q, b))
            ]
            failures += [
                f"{account} {m} {p}: {r.status_code} (should be denied)"
                for m, p, q, b in others
                if allowed(r := call(client, m, p, q, b))
            ]
    assert not failures, "\n".join(failures)


def test_leader_election_is_granted_by_its_component_only(kube: ControlPlane, admin: httpx.Client) -> None:
    def lease_calls(client: httpx.Client) -> list[bool]:
        out = []
        for m, p, q, b in LEASE_CALLS:
            if m == "PUT":
                current = admin.get(p)
                b = (
                    current.json()
                    if current.status_code == 200
                    else {
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": {"name": p.rsplit("/", 1)[1]},
                    }
                )
            out.append(allowed(call(client, m, p, q, b)))
        return out

    with kube.impersonating(WATCHER) as client:
        assert lease_calls(client) == [False] * len(LEASE_CALLS)  # base alone: no Lease at all
        component = [
            d for d in _flavour("components/leader-election") if d["kind"] in ("Role", "RoleBinding")
        ]
        apply_all(kube, component)
        # The authorizer learns of new bindings through its own watch: give it a moment.
        deadline = time.monotonic() + 10
        while (granted := lease_calls(client)) != [True] * len(LEASE_CALLS) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert granted == [True] * len(LEASE_CALLS)
        for m, p, q, b in DENIED:  # still nothing else
            assert not allowed(call(client, m, p, q, b)), (m, p)


async def test_the_watcher_runs_as_its_service_account_without_a_refusal(
    kube: ControlPlane, identities: Identities, tmp_path: Path, monitoring_crds: None
) -> None:
    """Every call the watcher really makes (not only those listed above) is allowed: a refused one
    would count as an error of its watch and show as unavailable."""
    async with running(kube, identities.watcher.token, tmp_path) as (watcher, _sink):
        await until(lambda: watcher.ready()[0])
        assert {w.kind: w.stats.errors for w in watcher.watches} == {w.kind: 0 for w in watcher.watches}
        body = watcher.ready()[1]
        assert body["crd"] == "installed" and body["dra_available"] is True
        assert watcher.state.gpucluster_crd == "installed"
