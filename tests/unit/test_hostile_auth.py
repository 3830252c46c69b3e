"""Red-team cases against access control: callers who would turn it against the apiserver, or keep
access after it was taken away. Each failed before its fix."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest
from starlette.exceptions import HTTPException

from services.api.app import create_app
from services.api.auth import Gate
from services.api.reviews import Identity
from tests.unit.test_api_access import ALICE, Clock, Reviews
from tests.unit.test_api_samples import pod, sample_view

ALICE_H = {"Authorization": "Bearer alice-token"}


class Revocable(Reviews):
    """The apiserver's answers, where a user can lose every permission and its tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.revoked: set[str] = set()

    async def authenticate(self, token: str) -> Identity | None:
        who = await super().authenticate(token)
        return None if who is None or who.username in self.revoked else who

    async def authorize(self, who: Identity, attributes: dict[str, Any]) -> bool:
        return who.username not in self.revoked and await super().authorize(who, attributes)


def sars(reviews: Reviews) -> int:
    return sum(1 for c in reviews.calls if c[0] == "sar")


def tokens(reviews: Reviews) -> int:
    return sum(1 for c in reviews.calls if c[0] == "token")


def client(gate: Gate, address: str = "10.0.0.1") -> httpx.AsyncClient:
    app = create_app(sample_view(), gate=gate)
    transport = httpx.ASGITransport(app=app, client=(address, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://api")


async def test_namespaces_the_view_does_not_hold_cost_no_review() -> None:
    reviews = Reviews()
    async with client(Gate(reviews, clock=Clock())) as c:
        first = await c.get("/v1/pods", headers=ALICE_H)
        assert first.status_code == 200
        before = sars(reviews)  # the cluster-wide one and one per namespace of the view
        for i in range(200):
            r = await c.get(f"/v1/pods?namespace=tenant-{i}", headers=ALICE_H)
            assert r.status_code == 200 and r.json()["items"] == []
    assert sars(reviews) == before


async def test_reviews_per_user_are_capped_and_answered_429() -> None:
    view = sample_view()
    for i in range(30):  # a view of many namespaces: each is a review for a namespaced caller
        view.apply(pod(f"u{i}", f"team-x{i:02d}", "p", "gpu-a"))
    reviews, clock = Reviews(), Clock()
    app = create_app(view, gate=Gate(reviews, ttl_s=30, review_budget=10, clock=clock))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        r = await c.get("/v1/pods", headers=ALICE_H)
        assert r.status_code == 429, r.text
        assert 1 <= int(r.headers["retry-after"]) <= 30 and "access reviews" in r.json()["error"]
        assert sars(reviews) == 10
        for _ in range(20):
            assert (await c.get("/v1/pods", headers=ALICE_H)).status_code == 429
        assert sars(reviews) == 10  # refused without asking
        clock.t += 15  # half the interval: half the budget back
        assert (await c.get("/v1/pods", headers=ALICE_H)).status_code == 429
        assert sars(reviews) == 15
    # A budget above the namespaces the view holds serves the same user.
    reviews = Reviews()
    app = create_app(view, gate=Gate(reviews, ttl_s=30, review_budget=40, clock=Clock()))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        r = await c.get("/v1/pods", headers=ALICE_H)
        assert r.status_code == 200 and {p["namespace"] for p in r.json()["items"]} == set()


async def test_rejected_tokens_are_rate_limited_per_client_before_asking_the_apiserver() -> None:
    reviews = Reviews()
    gate = Gate(reviews, failure_budget=5, clock=Clock())
    async with client(gate, "10.0.0.9") as attacker, client(gate, "10.0.0.2") as tenant:
        assert (await tenant.get("/v1/pods", headers=ALICE_H)).status_code == 200  # warm, cached
        codes = [(await attacker.get("/v1/pods", headers={"Authorization": f"Bearer {uuid.uuid4()}"})
                  ).status_code for _ in range(50)]
        assert codes[:5] == [401] * 5 and set(codes[5:]) == {429}, codes
        assert tokens(reviews) == 1 + 5  # alice's, and five of the attacker's
        refused = await attacker.get("/v1/pods", headers={"Authorization": "Bearer ops-token"})
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
        # Other clients, and tokens already vouched for, are not held up.
        ops = {"Authorization": "Bearer ops-token"}
        assert (await tenant.get("/v1/pods", headers=ops)).status_code == 200
        assert (await attacker.get("/v1/pods", headers=ALICE_H)).status_code == 200


async def test_a_revoked_user_loses_access_within_the_ttl_of_the_review_that_allowed_it() -> None:
    clock, reviews = Clock(), Revocable()
    gate = Gate(reviews, ttl_s=30, clock=clock)
    assert await gate.scope("alice-token", ["team-a"]) == ALICE.__class__(False, frozenset({"team-a"}))
    clock.t += 27
    # A crafted request that brings a new namespace must not renew the 27 s old decisions.
    await gate.scope("alice-token", ["team-a", "team-e"])
    reviews.revoked.add("alice")
    clock.t += 3.5  # 30.5 s after the reviews that allowed alice
    with pytest.raises(HTTPException) as e:
        await gate.scope("alice-token", ["team-a"])
    assert e.value.status_code == 401


async def test_concurrent_random_tokens_from_one_client_cannot_outrun_the_limit() -> None:
    reviews = Reviews(delay_s=0.01)
    gate = Gate(reviews, failure_budget=5, clock=Clock())
    async with client(gate, "10.0.0.9") as attacker:
        answers = await asyncio.gather(*(
            attacker.get("/v1/pods", headers={"Authorization": f"Bearer {uuid.uuid4()}"}) for _ in range(40)))
    assert {r.status_code for r in answers} <= {401, 429}
    assert tokens(reviews) == 5
