"""Access control: the decision table, the row filters, and the gate's caching and failure rules."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.exceptions import HTTPException

from services.api import access
from services.api.access import EVERYTHING, NOTHING, Scope, decide
from services.api.auth import Gate, TtlCache
from services.api.reviews import Identity, ReviewUnavailable

ALICE = Scope(False, frozenset({"team-a", "team-d"}))


@pytest.mark.parametrize(
    ("cluster", "namespaces", "want"),
    [
        (True, {}, EVERYTHING),
        (True, {"team-a": False}, EVERYTHING),  # a cluster-wide allow wins
        (False, {}, NOTHING),
        (False, {"team-a": True, "team-b": False, "team-d": True}, ALICE),
        (False, {"team-a": False}, NOTHING),
        (False, {"": True}, NOTHING),  # no namespace is never a namespace
    ],
)
def test_decision_table(cluster: bool, namespaces: dict[str, bool], want: Scope) -> None:
    assert decide(cluster, namespaces) == want


@pytest.mark.parametrize(
    ("scope", "ns", "sees"),
    [
        (EVERYTHING, "team-b", True),
        (EVERYTHING, "", True),
        (ALICE, "team-a", True),
        (ALICE, "team-b", False),
        (ALICE, "", False),
        (NOTHING, "team-a", False),
    ],
)
def test_who_sees_which_namespace(scope: Scope, ns: str, sees: bool) -> None:
    assert scope.sees(ns) is sees


def owner(ns: str, uid: str) -> dict[str, Any]:
    return {"pod_uid": uid, "namespace": ns, "pod": uid, "container": "c", "device_id": "0"}


def test_row_keys_keep_only_the_callers_namespaces() -> None:
    keys = [
        ("team-a", "p", "u1", "c", "0", 0),
        ("team-b", "p", "u2", "c", "0", 0),
        ("team-d", "q", "u3", "c", "0", 0),
    ]
    assert [k[2] for k in access.row_keys(keys, ALICE)] == ["u1", "u3"]
    assert access.row_keys(keys, EVERYTHING) is keys
    assert access.row_keys(keys, NOTHING) == []


def test_gpu_row_hides_other_namespaces_owners_and_counts_them() -> None:
    row = {
        "gpu_uuid": "GPU-1",
        "owners": [owner("team-a", "a1"), owner("team-b", "b1")],
        "mig_devices": [{"uuid": "MIG-1", "owners": [owner("team-c", "c1"), owner("team-d", "d1")]}],
        "hidden_owners": 0,
    }
    out = access.gpu_row(row, ALICE)
    assert [o["pod_uid"] for o in out["owners"]] == ["a1"]
    assert [o["pod_uid"] for o in out["mig_devices"][0]["owners"]] == ["d1"]
    assert out["hidden_owners"] == 2
    assert row["owners"][1]["pod_uid"] == "b1"  # the cached rendering is not mutated
    assert access.gpu_row(row, EVERYTHING) is row
    assert access.gpu_row(row, NOTHING)["hidden_owners"] == 4


def test_xid_row_and_findings() -> None:
    xid = {"code": 79, "owners": [owner("team-b", "b1"), owner("team-d", "d1")], "hidden_owners": 0}
    out = access.xid_row(xid, ALICE)
    assert [o["namespace"] for o in out["owners"]] == ["team-d"] and out["hidden_owners"] == 1
    assert access.finding({"namespace": "team-b", "owners": []}, ALICE) is None
    assert access.finding({"namespace": "", "owners": []}, ALICE) is None  # cluster-level finding
    f = {"namespace": "team-a", "owners": [owner("team-a", "a1")], "hidden_owners": 0}
    assert access.finding(f, ALICE) is f
    assert access.finding({"namespace": "", "owners": []}, EVERYTHING) is not None


def test_owner_items() -> None:
    items = [owner("team-a", "a1"), owner("team-b", "b1"), owner("team-c", "c1")]
    seen, hidden = access.owner_items(items, ALICE)
    assert [i["pod_uid"] for i in seen] == ["a1"] and hidden == 2
    assert access.owner_items(items, EVERYTHING) == (items, 0)


# ---------------------------------------------------------------- the gate


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Reviews:
    """Answers like the apiserver would for alice (team-a, team-d) and ops (cluster), counting calls."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.calls: list[tuple[str, Any]] = []
        self.down = False

    async def authenticate(self, token: str) -> Identity | None:
        self.calls.append(("token", None))
        await asyncio.sleep(self.delay_s)
        if self.down:
            raise ReviewUnavailable("cannot reach the Kubernetes apiserver (ConnectError)")
        return {"alice-token": Identity("alice"), "ops-token": Identity("ops")}.get(token)

    async def authorize(self, who: Identity, attributes: dict[str, Any]) -> bool:
        self.calls.append(("sar", attributes))
        await asyncio.sleep(self.delay_s)
        if self.down:
            raise ReviewUnavailable("cannot reach the Kubernetes apiserver (ConnectError)")
        if who.username == "ops":
            return True
        res = attributes.get("resourceAttributes") or {}
        return res.get("namespace") in ("team-a", "team-d")


NS = ["team-a", "team-b", "team-c", "team-d"]


async def test_scope_is_reviewed_once_then_served_from_cache_until_the_ttl() -> None:
    clock, reviews = Clock(), Reviews()
    gate = Gate(reviews, ttl_s=30, negative_ttl_s=5, clock=clock)
    assert await gate.scope("alice-token", NS) == ALICE
    # One TokenReview, one cluster-wide SAR, one per namespace.
    assert len(reviews.calls) == 1 + 1 + len(NS)
    assert await gate.scope("alice-token", NS) == ALICE
    assert len(reviews.calls) == 6
    clock.t += 4
    assert await gate.scope("alice-token", NS) == ALICE and len(reviews.calls) == 6
    clock.t += 27  # past the TTL: the token and every decision are reviewed again, denials included
    assert await gate.scope("alice-token", NS) == ALICE
    assert len(reviews.calls) == 6 + 1 + 1 + len(NS)
    assert await gate.scope("ops-token", NS) == EVERYTHING


async def test_a_new_namespace_is_reviewed_when_it_appears() -> None:
    reviews = Reviews()
    gate = Gate(reviews, clock=Clock())
    await gate.scope("alice-token", ["team-a"])
    n = len(reviews.calls)
    assert await gate.scope("alice-token", ["team-a", "team-e"]) == Scope(False, frozenset({"team-a"}))
    assert [c for c in reviews.calls[n:] if c[0] == "sar"][-1][1]["resourceAttributes"][
        "namespace"
    ] == "team-e"


async def test_concurrent_requests_with_one_token_share_one_review() -> None:
    reviews = Reviews(delay_s=0.05)
    gate = Gate(reviews, clock=Clock())
    scopes = await asyncio.gather(*(gate.scope("alice-token", NS) for _ in range(20)))
    assert all(s == ALICE for s in scopes)
    assert sum(1 for c in reviews.calls if c[0] == "token") == 1
    assert sum(1 for c in reviews.calls if c[0] == "sar") == 1 + len(NS)


async def test_bad_token_is_401_with_the_bearer_challenge_and_cached_briefly() -> None:
    clock, reviews = Clock(), Reviews()
    gate = Gate(reviews, ttl_s=30, negative_ttl_s=5, clock=clock)
    for _ in range(2):
        with pytest.raises(HTTPException) as e:
            await gate.scope("stolen", NS)
        assert e.value.status_code == 401 and e.value.headers == {
            "WWW-Authenticate": 'Bearer realm="periscope"'
        }
    assert len(reviews.calls) == 1
    clock.t += 6
    with pytest.raises(HTTPException):
        await gate.scope("stolen", NS)
    assert len(reviews.calls) == 2


async def test_apiserver_down_never_fails_open_and_is_not_cached() -> None:
    reviews = Reviews()
    reviews.down = True
    gate = Gate(reviews, clock=Clock())
    with pytest.raises(ReviewUnavailable):
        await gate.scope("alice-token", NS)
    with pytest.raises(ReviewUnavailable):
        await gate.url("ops-token", "/metrics")
    reviews.down = False
    assert await gate.scope("alice-token", NS) == ALICE


async def test_cluster_urls_are_non_resource_get_reviews() -> None:
    reviews = Reviews()
    gate = Gate(reviews, clock=Clock())
    assert await gate.url("ops-token", "/v1/policy") is True
    assert await gate.url("alice-token", "/v1/policy") is False
    sar = [c[1] for c in reviews.calls if c[0] == "sar"]
    assert sar[0] == {"nonResourceAttributes": {"path": "/v1/policy", "verb": "get"}}


def test_ttl_cache_is_bounded_and_expires() -> None:
    clock = Clock()
    c = TtlCache(2, clock)
    c.put("a", 1, 10)
    c.put("b", 2, 10)
    assert c.get("a") == (True, 1)  # a is now the most recently used
    c.put("c", 3, 10)
    assert c.get("b") == (False, None) and len(c) == 2
    clock.t += 11
    assert c.get("a") == (False, None)


async def test_a_disconnected_first_caller_does_not_cancel_the_shared_review() -> None:
    reviews = Reviews(delay_s=0.05)
    gate = Gate(reviews, clock=Clock())
    first = asyncio.ensure_future(gate.scope("alice-token", NS))
    await asyncio.sleep(0.01)
    second = asyncio.ensure_future(gate.scope("alice-token", NS))
    await asyncio.sleep(0.01)
    first.cancel()  # the client went away while its review was in flight
    assert await second == ALICE
    assert sum(1 for c in reviews.calls if c[0] == "token") == 1


def test_tls_to_the_apiserver_uses_the_kubeconfigs_ca_and_client_certificate(tmp_path: Any) -> None:
    import base64
    import shutil
    import ssl
    import subprocess

    import yaml

    from services.api.reviews import kube_configuration, tls_context

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl binary to make a certificate")
    cert, key = tmp_path / "c.crt", tmp_path / "c.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=k8s",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    b64 = {p: base64.b64encode(p.read_bytes()).decode() for p in (cert, key)}
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443",
                                               "certificate-authority-data": b64[cert]}}],
        "users": [{"name": "u", "user": {"client-certificate-data": b64[cert], "client-key-data": b64[key]}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    ctx = tls_context(kube_configuration(str(kubeconfig)))
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert [c["subject"] for c in ctx.get_ca_certs()] == [((("commonName", "k8s"),),)]
