"""The simulated apiserver's TokenReview and SubjectAccessReview: real shapes, the scenario's users."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client import ApiClient, V1SubjectAccessReview, V1TokenReview

from periscope.sim.apiserver.reviews import ACCESS_REVIEWS, TOKEN_REVIEWS, review
from periscope.sim.scenario import ScenarioError, UserSpec, load_scenario

USERS = (
    UserSpec(name="alice", token="alice-token", namespaces=("team-a", "team-d")),
    UserSpec(name="ops", token="ops-token", cluster=True),
)


def token_review(token: str) -> dict[str, Any]:
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}


def sar(user: str, **attrs: Any) -> dict[str, Any]:
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": ["system:authenticated"], **attrs},
    }


def pods(ns: str, verb: str = "list") -> dict[str, Any]:
    return {"namespace": ns, "verb": verb, "group": "", "resource": "pods"}


def decode(body: dict[str, Any], kind: str) -> Any:
    """Through the official client's models, as a client of the real apiserver would read it."""
    return ApiClient().deserialize(json.dumps(body), kind, "application/json")


def test_token_review_accepts_a_users_token_in_the_real_shape() -> None:
    code, body = review(USERS, TOKEN_REVIEWS, token_review("alice-token"))
    assert code == 201
    tr: V1TokenReview = decode(body, "V1TokenReview")
    assert tr.status.authenticated is True and tr.status.user.username == "alice"
    assert "system:authenticated" in tr.status.user.groups and tr.status.user.uid


def test_token_review_of_an_unknown_token_omits_authenticated() -> None:
    code, body = review(USERS, TOKEN_REVIEWS, token_review("nope"))
    assert code == 201 and "authenticated" not in body["status"] and body["status"]["error"]
    assert review(USERS, TOKEN_REVIEWS, token_review(""))[0] == 400


@pytest.mark.parametrize(
    ("user", "attrs", "allowed"),
    [
        ("alice", {"resourceAttributes": pods("team-a")}, True),
        ("alice", {"resourceAttributes": pods("team-d", "get")}, True),
        ("alice", {"resourceAttributes": pods("team-b")}, False),
        ("alice", {"resourceAttributes": pods("")}, False),  # every namespace at once
        ("alice", {"resourceAttributes": pods("team-a", "delete")}, False),
        ("alice", {"resourceAttributes": {**pods("team-a"), "resource": "secrets"}}, False),
        ("alice", {"nonResourceAttributes": {"path": "/metrics", "verb": "get"}}, False),
        ("ops", {"resourceAttributes": pods("")}, True),
        ("ops", {"resourceAttributes": pods("team-b")}, True),
        ("ops", {"nonResourceAttributes": {"path": "/v1/policy", "verb": "get"}}, True),
        ("ops", {"resourceAttributes": pods("team-b", "delete")}, False),
        ("mallory", {"resourceAttributes": pods("team-a")}, False),
    ],
)
def test_subject_access_review(user: str, attrs: dict[str, Any], allowed: bool) -> None:
    code, body = review(USERS, ACCESS_REVIEWS, sar(user, **attrs))
    assert code == 201
    out: V1SubjectAccessReview = decode(body, "V1SubjectAccessReview")
    assert out.status.allowed is allowed
    assert out.spec.user == user


def test_invalid_reviews_are_rejected_like_the_apiserver_does() -> None:
    both = sar("ops", resourceAttributes=pods("a"), nonResourceAttributes={"path": "/", "verb": "get"})
    assert review(USERS, ACCESS_REVIEWS, both)[0] == 422
    assert review(USERS, ACCESS_REVIEWS, sar("ops"))[0] == 422
    nobody = {"kind": "SubjectAccessReview", "spec": {"resourceAttributes": pods("a")}}
    assert review(USERS, ACCESS_REVIEWS, nobody)[0] == 422
    assert review(USERS, TOKEN_REVIEWS, {"kind": "SubjectAccessReview", "spec": {}})[0] == 400


def test_tenants_scenario_has_alice_and_ops_over_existing_namespaces() -> None:
    s = load_scenario("tenants")
    users = {u.name: u for u in s.users}
    assert users["alice"].namespaces == ("team-a", "team-d") and users["ops"].cluster
    assert {"team-a", "team-d"} <= {p.namespace for p in s.pods}


@pytest.mark.parametrize(
    ("users", "where"),
    [
        ("[{name: a}]", "users[0].token"),
        ("[{name: a, token: t}, {name: a, token: u}]", "users[1].name"),
        ("[{name: a, token: t}, {name: b, token: t}]", "users[1].token"),
        ("[{name: a, token: t, namespaces: [Team_A]}]", "users[0].namespaces[0]"),
        ("[{name: a, token: t, cluster: yes-please}]", "users[0].cluster"),
        ("[{name: a, token: t, role: admin}]", "users[0]"),
    ],
)
def test_bad_users_are_scenario_errors(tmp_path: Any, users: str, where: str) -> None:
    path = tmp_path / "s.yaml"
    nodes = "[{name: n, gpus: [{model: T4, memory_mib: 1}]}]"
    path.write_text(f"duration: 10s\nnodes: {nodes}\nusers: {users}\n")
    with pytest.raises(ScenarioError, match=rf"{where.replace('[', '.').replace(']', '.')}"):
        load_scenario(str(path))
