"""Access control end to end over real HTTP: the API server asks the simulated apiserver (TokenReview,
SubjectAccessReview) through a kubeconfig, and serves each user only its namespaces."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from periscope.bus.clients import Kafka
from periscope.settings.api import ApiSettings
from periscope.sim.apiserver import FakeApiServer
from periscope.sim.scenario import UserSpec
from services.api.server import ApiServer
from tests.kafka_tier import settings_of
from tests.unit.test_api_samples import sample_view

USERS = (
    UserSpec(name="alice", token="alice-token", namespaces=("infer", "team-d")),
    UserSpec(name="carol", token="carol-token", namespaces=("ml",)),
    UserSpec(name="ops", token="ops-token", cluster=True),
)
ALICE = {"Authorization": "Bearer alice-token"}
OPS = {"Authorization": "Bearer ops-token"}


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    with FakeApiServer(users=USERS) as server:
        yield server


def settings(kubeconfig: Path, **kw: str) -> ApiSettings:
    return ApiSettings(api_port=0, api_auth="kubernetes", kubeconfig=str(kubeconfig), **kw)


@pytest.fixture
async def api(apiserver: FakeApiServer, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    server = ApiServer(
        settings(apiserver.write_kubeconfig(tmp_path / "kubeconfig")), sample_view(), consume=False
    )
    url = await server.start()
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            yield client
    finally:
        await server.stop()


async def test_no_or_bad_token_is_401_with_a_bearer_challenge(api: httpx.AsyncClient) -> None:
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic YWxpY2U6eA=="}):
        r = await api.get("/v1/pods", headers=headers)
        assert r.status_code == 401, headers
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert "error" in r.json()


async def test_health_readiness_and_schema_are_open(api: httpx.AsyncClient) -> None:
    for path in ("/healthz", "/readyz", "/openapi.json"):
        assert (await api.get(path)).status_code == 200, path


async def test_alice_sees_only_her_namespaces(api: httpx.AsyncClient) -> None:
    pods = (await api.get("/v1/pods", headers=ALICE)).json()["items"]
    assert pods and {p["namespace"] for p in pods} == {"infer"}
    everyone = (await api.get("/v1/pods", headers=OPS)).json()["items"]
    assert {p["namespace"] for p in everyone} == {"ml", "infer"}
    # Asking for another namespace explicitly gives nothing, not an error that confirms it exists.
    assert (await api.get("/v1/pods?namespace=ml", headers=ALICE)).json()["items"] == []
    assert (await api.get("/v1/idle", headers=ALICE)).json()["items"] == []
    findings = (await api.get("/v1/findings", headers=ALICE)).json()["items"]
    assert all(f["namespace"] == "infer" for f in findings)


async def test_another_namespaces_pod_is_404(api: httpx.AsyncClient) -> None:
    assert (await api.get("/v1/pods/uid-busy", headers=ALICE)).status_code == 404
    assert (await api.get("/v1/pods/uid-mig", headers=ALICE)).status_code == 200
    assert (await api.get("/v1/pods/uid-busy", headers=OPS)).status_code == 200


async def test_gpu_and_xid_owners_outside_her_namespaces_are_hidden_and_counted(
    api: httpx.AsyncClient,
) -> None:
    gpus = (await api.get("/v1/gpus", headers=ALICE)).json()["items"]
    owners = [o for g in gpus for o in (*g["owners"], *(o for m in g["mig_devices"] for o in m["owners"]))]
    assert owners and {o["namespace"] for o in owners} == {"infer"}
    assert sum(g["hidden_owners"] for g in gpus) == 2  # uid-busy and uid-idle (ml)
    xids = (await api.get("/v1/xid", headers=ALICE)).json()["items"]
    assert len(xids) == 3  # the errors stay; who they hit does not
    assert {o["namespace"] for x in xids for o in x["owners"]} == {"infer"}
    assert sum(x["hidden_owners"] for x in xids) == 2
    ops = (await api.get("/v1/gpus", headers=OPS)).json()["items"]
    assert all(g["hidden_owners"] == 0 for g in ops)
    one = (await api.get(f"/v1/gpus/{gpus[0]['gpu_uuid']}", headers=ALICE)).json()
    assert all(o["namespace"] == "infer" for o in one["owners"])


async def test_cluster_scoped_urls_need_a_non_resource_grant(api: httpx.AsyncClient) -> None:
    for path in ("/v1/policy", "/metrics"):
        assert (await api.get(path, headers=ALICE)).status_code == 403, path
        assert (await api.get(path, headers=OPS)).status_code == 200, path
        assert (await api.get(path)).status_code == 401, path


async def test_apiserver_down_is_503_never_open(apiserver: FakeApiServer, tmp_path: Path) -> None:
    server = ApiServer(
        settings(apiserver.write_kubeconfig(tmp_path / "kubeconfig")), sample_view(), consume=False
    )
    url = await server.start()
    try:
        apiserver.stop()
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            r = await client.get("/v1/pods", headers=ALICE)
            assert r.status_code == 503 and "apiserver" in r.json()["error"]
            assert (await client.get("/healthz")).status_code == 200
    finally:
        await server.stop()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl binary to make a certificate")
async def test_serves_https_with_the_configured_certificate(apiserver: FakeApiServer, tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    s = settings(
        apiserver.write_kubeconfig(tmp_path / "kubeconfig"),
        api_tls_certfile=str(cert),
        api_tls_keyfile=str(key),
    )
    server = ApiServer(s, sample_view(), consume=False)
    url = await server.start()
    try:
        assert url.startswith("https://")
        async with httpx.AsyncClient(base_url=url, timeout=10, verify=str(cert)) as client:
            r = await client.get("/v1/pods", headers=OPS)
            assert r.status_code == 200 and r.json()["items"]
        async with httpx.AsyncClient(base_url=url.replace("https", "http"), timeout=10) as plain:
            with pytest.raises(httpx.HTTPError):
                await plain.get("/healthz")
    finally:
        await server.stop()


async def test_owners_replayed_from_the_topics_are_scoped_too(
    apiserver: FakeApiServer, tmp_path: Path, broker: Kafka, unique: str
) -> None:
    """/v1/owners names pods the view may not hold: their namespaces are reviewed on the spot."""
    from periscope.contract.values import rfc3339
    from tests.integration.test_replay import BASE, publish
    from tests.unit.test_replay_owners import reuse_scenario

    # Earlier than the replay module's times: this module runs first, and replay's start-offset tests
    # need every record already in a partition to be older than their own.
    start = BASE - 60_000 * 1000
    node = f"auth-owners-{unique}"
    await publish(broker, node, reuse_scenario(node, start))  # both pods in namespace "ml"
    s = settings(apiserver.write_kubeconfig(tmp_path / "kubeconfig"), **settings_of(broker),
                 api_group_prefix=f"test-auth-{unique}-")
    server = ApiServer(s, consume=False)  # an empty view: "ml" is known from the replay only
    url = await server.start()
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            q = {"at": rfc3339(start + 90_000), "node": node}
            carol_token = {"Authorization": "Bearer carol-token"}
            carol = (await c.get("/v1/owners", params=q, headers=carol_token)).json()
            assert [i["namespace"] for i in carol["items"]] == ["ml", "ml"] and carol["hidden_owners"] == 0
            alice = (await c.get("/v1/owners", params=q, headers=ALICE)).json()
            assert alice["items"] == [] and alice["hidden_owners"] == 2
            ops = (await c.get("/v1/owners", params=q, headers=OPS)).json()
            assert len(ops["items"]) == 2 and "hidden_owners" not in ops  # replay's own document
    finally:
        await server.stop()
