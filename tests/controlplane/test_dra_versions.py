"""DRA on the resource.k8s.io versions real clusters serve: v1 (1.34+), v1beta2 only (as 1.33) and
v1beta1 only (as 1.32), each switched on with the apiserver's own --runtime-config.

The watcher finds the version by API discovery, reads the claims in it, attributes the allocated
devices to the pod that uses the claim, and says which version it reads (/readyz detail and a metric).
The beta-only control planes run RBAC without Node authorization: a 1.36 apiserver's Node authorizer
watches ResourceSlices in v1 and would never become ready with v1 switched off.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from periscope.core.model import ClaimDevice
from periscope.sim.controlplane.cluster import apply_all, deploy_rbac
from periscope.sim.controlplane.process import ControlPlane
from periscope.sim.controlplane.writer import KubeObjects
from tests.controlplane.conftest import Identities, needs_controlplane
from tests.controlplane.test_watcher_real import claim, gpu_node, gpu_pod, running, unique, until, write_claim

ONLY = {
    "v1beta2": "resource.k8s.io/v1=false,resource.k8s.io/v1beta2=true",
    "v1beta1": "resource.k8s.io/v1=false,resource.k8s.io/v1beta1=true",
}


@pytest.fixture(scope="module", params=["v1", "v1beta2", "v1beta1"])
def served(request: pytest.FixtureRequest, identities: Identities) -> Iterator[tuple[str, ControlPlane]]:
    version = request.param
    if version == "v1":
        yield version, request.getfixturevalue("kube")
        return
    needs_controlplane()
    plane = ControlPlane(users=[identities.watcher], runtime_config=ONLY[version], authorization_mode="RBAC")
    plane.start()
    try:
        apply_all(plane, deploy_rbac())
        yield version, plane
    finally:
        plane.stop()


def test_discovery_serves_only_the_switched_on_version(served: tuple[str, ControlPlane]) -> None:
    version, plane = served
    with plane.http() as http:
        group = http.get("/apis/resource.k8s.io").json()
        listed = [v["version"] for v in group["versions"]]
        assert version in listed and group["preferredVersion"]["version"] == version
        if version != "v1":
            assert "v1" not in listed
            assert http.get("/apis/resource.k8s.io/v1/resourceclaims").status_code == 404


async def test_claims_are_attributed_in_the_served_version(
    served: tuple[str, ControlPlane], identities: Identities, tmp_path: Path
) -> None:
    version, plane = served
    objects = KubeObjects(plane.server, plane.ca_file, plane.admin.token)
    ns, node = unique("dra"), unique("dra-node")
    objects.upsert("nodes", gpu_node(node))
    objects.ensure_namespace(ns)
    write_claim(objects, claim(ns, "train-gpu", version, "gpu-1"))
    uid = objects.upsert("pods", gpu_pod(ns, "train", node, "Burstable", claim="train-gpu"))["metadata"][
        "uid"
    ]
    async with running(plane, identities.watcher.token, tmp_path) as (watcher, sink):
        await until(lambda: any(e.pod.uid == uid and e.pod.claim_devices for e in sink.pods(ns)))
        event = [e for e in sink.pods(ns) if e.pod.uid == uid][-1]
        assert event.pod.claim_devices == (
            ClaimDevice("train-gpu", "gpu", "gpu.nvidia.com", "gpu-node-0", "gpu-1"),
        )
        # Pods wait for nodes and claims only; readiness also waits for the policy sources' lists.
        await until(lambda: watcher.ready()[0] and bool(sink.policies()))
        body = watcher.ready()[1]
        assert body["dra_available"] is True and body["dra_version"] == f"resource.k8s.io/{version}"
        assert f'periscope_watcher_dra_api_info{{version="{version}"}} 1' in watcher.metrics()
        policy = sink.policies()[-1]
        assert policy.dra_available is True
