"""The API's access control decided by Kubernetes itself: its TokenReviews and SubjectAccessReviews go to
the real apiserver as the API's deploy/ ServiceAccount, and RBAC (the example roles of
deploy/base/api-rbac.yaml, bound per user) decides. The view is the API's sample view: pods in `ml`
and `infer`, GPUs shared across both, XIDs, a policy.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from periscope.sim.controlplane.cluster import apply_all, user_bindings
from periscope.sim.controlplane.process import ControlPlane
from services.api.server import ApiServer
from services.api.settings import ApiSettings
from tests.controlplane.conftest import USERS, Identities
from tests.unit.test_api_samples import sample_view

ALICE = {"Authorization": "Bearer alice-token"}  # infer and team-d
CAROL = {"Authorization": "Bearer carol-token"}  # ml
OPS = {"Authorization": "Bearer ops-token"}  # cluster-wide


async def _serve(plane: ControlPlane, token: str, tmp: Path, **settings: Any) -> tuple[ApiServer, str]:
    kubeconfig = plane.write_kubeconfig(tmp / "api.kubeconfig", token)
    s = ApiSettings(api_port=0, api_auth="kubernetes", kubeconfig=str(kubeconfig), **settings)
    server = ApiServer(s, sample_view(), consume=False)
    return server, await server.start()


@pytest.fixture
async def api(kube: ControlPlane, identities: Identities, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    server, url = await _serve(kube, identities.api.token, tmp_path, api_auth_cache_ttl="2s")
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            yield client
    finally:
        await server.stop()


def _namespaces(body: dict[str, Any]) -> set[str]:
    return {i["namespace"] for i in body["items"]}


async def test_a_namespace_limited_user_sees_only_its_namespaces_on_every_endpoint(
    api: httpx.AsyncClient,
) -> None:
    assert _namespaces((await api.get("/v1/pods", headers=ALICE)).json()) == {"infer"}
    assert _namespaces((await api.get("/v1/pods", headers=CAROL)).json()) == {"ml"}
    assert _namespaces((await api.get("/v1/pods", headers=OPS)).json()) == {"ml", "infer"}
    assert (await api.get("/v1/pods?namespace=ml", headers=ALICE)).json()["items"] == []
    assert (await api.get("/v1/pods/uid-busy", headers=ALICE)).status_code == 404  # ml's pod
    assert (await api.get("/v1/pods/uid-mig", headers=ALICE)).status_code == 200
    assert (await api.get("/v1/pods/uid-busy", headers=CAROL)).status_code == 200
    assert (await api.get("/v1/idle", headers=ALICE)).json()["items"] == []  # the idle pod is ml's
    assert _namespaces((await api.get("/v1/idle", headers=CAROL)).json()) == {"ml"}
    assert all(
        f["namespace"] == "infer" for f in (await api.get("/v1/findings", headers=ALICE)).json()["items"]
    )
    gpus = (await api.get("/v1/gpus", headers=ALICE)).json()["items"]
    owners = [o for g in gpus for o in (*g["owners"], *(o for m in g["mig_devices"] for o in m["owners"]))]
    assert {o["namespace"] for o in owners} == {"infer"} and sum(g["hidden_owners"] for g in gpus) == 2
    one = (await api.get(f"/v1/gpus/{gpus[0]['gpu_uuid']}", headers=ALICE)).json()
    assert all(o["namespace"] == "infer" for o in one["owners"])
    xids = (await api.get("/v1/xid", headers=ALICE)).json()["items"]
    assert {o["namespace"] for x in xids for o in x["owners"]} == {"infer"}
    for path in ("/v1/policy", "/metrics"):  # cluster-scoped: the non-resource URL grant decides
        assert (await api.get(path, headers=ALICE)).status_code == 403, path
        assert (await api.get(path, headers=OPS)).status_code == 200, path
    assert (await api.get("/v1/pods", headers={"Authorization": "Bearer not-a-token"})).status_code == 401


async def test_removing_a_rolebinding_takes_effect_within_the_cache_ttl(
    api: httpx.AsyncClient, kube: ControlPlane
) -> None:
    assert _namespaces((await api.get("/v1/pods", headers=ALICE)).json()) == {"infer"}
    binding = "/apis/rbac.authorization.k8s.io/v1/namespaces/infer/rolebindings/periscope-user-alice"
    with kube.http() as admin:
        assert admin.delete(binding).status_code == 200
    try:
        await asyncio.sleep(2.5)  # the TTL (2s) and RBAC's own propagation (milliseconds)
        assert (await api.get("/v1/pods", headers=ALICE)).json()["items"] == []
        assert _namespaces((await api.get("/v1/pods", headers=OPS)).json()) == {"ml", "infer"}
    finally:
        apply_all(kube, [b for b in user_bindings(USERS) if b["metadata"]["name"] == "periscope-user-alice"])
    await asyncio.sleep(2.5)  # granted again: also within the TTL (a denial is cached as long)
    assert _namespaces((await api.get("/v1/pods", headers=ALICE)).json()) == {"infer"}


async def test_an_identity_without_the_review_grant_gets_503_never_an_answer(
    kube: ControlPlane, identities: Identities, tmp_path: Path
) -> None:
    """The watcher's ServiceAccount may not create reviews: an API running as it cannot check anyone."""
    server, url = await _serve(kube, identities.watcher.token, tmp_path)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            r = await client.get("/v1/pods", headers=OPS)
            assert r.status_code == 503 and "tokenreviews" in r.json()["error"]
    finally:
        await server.stop()
