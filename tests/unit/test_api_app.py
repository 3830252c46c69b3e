"""HTTP contract of the query API over a preloaded view (ASGI, in-process)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from services.api.app import create_app
from services.api.status import ConsumerStatus
from services.api.view import View
from tests.unit.test_api_samples import (
    GPU_A0,
    GPU_A1,
    GPU_B0,
    MIG_B0,
    MIN,
    T0,
    T0_TEXT,
    idle_windows,
    pod,
    row,
    sample_view,
)

POD_FIELDS = {
    "pod_uid",
    "namespace",
    "pod",
    "container",
    "node",
    "device_id",
    "gpu_uuid",
    "mig",
    "sharing",
    "share_basis",
    "util_pct",
    "fb_used_mib",
    "power_w",
    "active",
    "idle",
    "first_seen",
    "last_seen",
    "sources",
}
GPU_FIELDS = {
    "node",
    "gpu_uuid",
    "model",
    "index",
    "mig_devices",
    "sharing",
    "util_pct",
    "fb_used_mib",
    "fb_total_mib",
    "power_w",
    "temp_c",
    "owners",
    "last_xid",
    "sample_at",
}


def client(view: View, status: ConsumerStatus | None = None) -> httpx.AsyncClient:
    app = create_app(view, status)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api")


@pytest.fixture
async def api() -> AsyncIterator[httpx.AsyncClient]:
    async with client(sample_view()) as c:
        yield c


async def get(c: httpx.AsyncClient, url: str, status: int = 200) -> Any:
    r = await c.get(url)
    assert r.status_code == status, r.text
    return r.json()


async def test_pods_rows_carry_every_contract_field(api: httpx.AsyncClient) -> None:
    body = await get(api, "/v1/pods")
    assert body["as_of"] == T0_TEXT and body["continue"] is None
    items = body["items"]
    assert [(r["namespace"], r["pod"], r["pod_uid"]) for r in items] == [
        ("infer", "serve-0", "uid-mig"),
        ("ml", "notebook-0", "uid-idle"),
        ("ml", "train-0", "uid-busy"),
        ("ml", "train-0", "uid-gone"),
    ]
    for r in items:
        assert set(r) >= POD_FIELDS
    mig = items[0]
    assert mig["mig"] == {"uuid": MIG_B0, "profile": "1g.10gb", "gi": 2, "ci": 0}
    assert mig["gpu_uuid"] == GPU_B0 and mig["device_id"] == MIG_B0
    assert mig["util_pct"] is None and mig["sharing"] == "mig"
    busy = items[2]
    assert busy["util_pct"] == 80.0 and busy["fb_used_mib"] == 2048.0 and busy["power_w"] == 250.0
    assert busy["first_seen"] == "2026-11-22T03:35:06.789Z" and busy["last_seen"] == T0_TEXT
    assert busy["sources"] == ["checkpoint", "podresources"] and busy["mig"] is None


async def test_pods_filters(api: httpx.AsyncClient) -> None:
    uids = lambda b: [r["pod_uid"] for r in b["items"]]  # noqa: E731
    assert uids(await get(api, "/v1/pods?active=false")) == ["uid-gone"]
    assert "uid-gone" not in uids(await get(api, "/v1/pods?active=true"))
    assert uids(await get(api, "/v1/pods?node=gpu-b")) == ["uid-mig"]
    assert uids(await get(api, "/v1/pods?namespace=infer")) == ["uid-mig"]
    assert uids(await get(api, "/v1/pods?namespace=ml&node=gpu-a&active=true")) == ["uid-idle", "uid-busy"]
    assert uids(await get(api, "/v1/pods?node=nowhere")) == []


async def test_pagination_walks_every_row_once_in_order() -> None:
    v = View()
    for i in range(23):
        v.apply(pod(f"u{i:02d}", "ml", f"p{i:02d}", "gpu-a", row(GPU_A0), row(GPU_A1)))
    async with client(v) as c:
        full = (await get(c, "/v1/pods"))["items"]
        seen, token, pages = [], None, 0
        while True:
            url = "/v1/pods?limit=5" + (f"&continue={token}" if token else "")
            body = await get(c, url)
            seen += body["items"]
            pages += 1
            token = body["continue"]
            if token is None:
                break
            # A row added before the cursor between pages does not shift the rest.
            if pages == 2:
                v.apply(pod("a-first", "aa", "x", "gpu-a"))
        assert seen == full and pages == 10


async def test_bad_and_foreign_continue_tokens_are_400(api: httpx.AsyncClient) -> None:
    gpus = await get(api, "/v1/gpus?limit=1")
    assert gpus["continue"]
    body = await get(api, f"/v1/pods?continue={gpus['continue']}", 400)
    assert "continue" in body["error"]
    await get(api, "/v1/pods?continue=!!!", 400)
    await get(api, "/v1/pods?continue=WzFd", 400)  # valid base64 JSON, not a token


@pytest.mark.parametrize(
    "url",
    [
        "/v1/pods?active=maybe",
        "/v1/pods?limit=0",
        "/v1/pods?limit=abc",
        "/v1/pods?nmespace=ml",
        "/v1/gpus?active=true",
        "/v1/idle?threshold_pct=101",
        "/v1/idle?threshold_pct=nan",
        "/v1/idle?window=soon",
        "/v1/idle?window=0s",
        "/v1/xid?since=yesterday",
        "/v1/policy?x=1",
        "/v1/findings?active=2",
        "/v1/findings?kind=bogus",
    ],
)
async def test_bad_query_values_are_400_with_an_error(api: httpx.AsyncClient, url: str) -> None:
    body = await get(api, url, 400)
    assert set(body) == {"error"} and body["error"]


async def test_unknown_ids_are_404(api: httpx.AsyncClient) -> None:
    assert "nope" in (await get(api, "/v1/pods/nope", 404))["error"]
    assert (await get(api, "/v1/gpus/GPU-nope", 404))["error"]
    assert (await get(api, "/v1/nothing-here", 404))["error"]


async def test_pod_detail(api: httpx.AsyncClient) -> None:
    body = await get(api, "/v1/pods/uid-gone")
    assert {"pod_uid", "namespace", "pod", "node", "owner", "phase", "created", "deleted", "rows"} <= set(
        body
    )
    assert body["owner"] == {"kind": "ReplicaSet", "name": "train-7486d6bbb5"}
    assert body["phase"] == "Succeeded" and body["deleted"] == "2026-11-22T03:25:06.789Z"
    assert body["created"] == "2026-11-22T03:34:06.789Z"
    assert [r["active"] for r in body["rows"]] == [False]
    idle = await get(api, "/v1/pods/uid-idle")
    windows = idle["rows"][0]["windows"]
    assert len(windows) == 30 and windows[-1]["avg_util_pct"] == 1.0


async def test_gpus(api: httpx.AsyncClient) -> None:
    items = (await get(api, "/v1/gpus"))["items"]
    assert [(g["node"], g["index"]) for g in items] == [("gpu-a", 0), ("gpu-a", 1), ("gpu-b", 0)]
    for g in items:
        assert set(g) >= GPU_FIELDS
    a0, _, b0 = items
    assert a0["owners"] == [
        {"pod_uid": "uid-busy", "namespace": "ml", "pod": "train-0", "container": "cuda", "device_id": GPU_A0}
    ]
    assert a0["last_xid"] == {"code": 79, "at": "2026-11-22T04:00:06.789Z"} and a0["sample_at"] == T0_TEXT
    assert b0["sharing"] == "mig" and b0["owners"] == []
    (m,) = b0["mig_devices"]
    assert {"uuid": m["uuid"], "profile": m["profile"], "gi": m["gi"], "ci": m["ci"]} == {
        "uuid": MIG_B0,
        "profile": "1g.10gb",
        "gi": 2,
        "ci": 0,
    }
    assert [o["pod_uid"] for o in m["owners"]] == ["uid-mig"]
    assert [g["gpu_uuid"] for g in (await get(api, "/v1/gpus?node=gpu-b"))["items"]] == [GPU_B0]
    assert [g["gpu_uuid"] for g in (await get(api, "/v1/gpus?namespace=infer"))["items"]] == [GPU_B0]
    assert (await get(api, f"/v1/gpus/{GPU_A1}"))["index"] == 1


IDLE_DEFAULTS = ("", "?threshold_pct=5", "?window=10m", "?threshold_pct=5&window=10m",
                 "?window=600s&threshold_pct=5.0")


async def test_idle_with_and_without_its_default_parameters_is_one_answer(api: httpx.AsyncClient) -> None:
    """One rule (periscope.core.idle), one path: the defaults spelt out change nothing."""
    bodies = [await get(api, "/v1/idle" + q) for q in IDLE_DEFAULTS]
    assert all(b == bodies[0] for b in bodies[1:])
    body = bodies[0]
    assert body["threshold_pct"] == 5 and body["window"] == "10m"
    (r,) = body["items"]
    assert set(r) >= POD_FIELDS
    # Judged from its 30 published one-minute windows at 1 %: idle since the first of them.
    assert r["pod_uid"] == "uid-idle" and r["idle_since"] == "2026-11-22T03:36:00.000Z"
    since = T0 - T0 % MIN - 29 * MIN
    assert r["avg_util_pct"] == 1.0 and r["wasted_gpu_hours"] == pytest.approx((T0 - since) / 3_600_000)


async def test_idle_recomputes_for_a_threshold_and_window() -> None:
    v = View()
    # 30 minutes at 3 % on a half GPU; 30 minutes at 40 %; one at 3 % but only 5 minutes old.
    v.apply(
        pod(
            "u-low",
            "ml",
            "low",
            "gpu-a",
            row(GPU_A0, util_pct=3.0, gpu_fraction=0.5, windows=idle_windows(3.0)),
        )
    )
    v.apply(pod("u-mid", "ml", "mid", "gpu-a", row(GPU_A1, util_pct=40.0, windows=idle_windows(40.0))))
    v.apply(
        pod(
            "u-new",
            "ml",
            "new",
            "gpu-a",
            row(GPU_B0, util_pct=3.0, first_seen_ms=T0 - 5 * MIN, windows=idle_windows(3.0, 5)),
        )
    )
    async with client(v) as c:
        body = await get(c, "/v1/idle?threshold_pct=5&window=10m")
        assert all([await get(c, "/v1/idle" + q) == body for q in IDLE_DEFAULTS])
        assert body["threshold_pct"] == 5 and body["window"] == "10m"
        (r,) = body["items"]
        assert r["pod_uid"] == "u-low" and r["avg_util_pct"] == pytest.approx(3.0) and r["idle"] is True
        # Idle for all its 30 one-minute windows (first window starts at the minute after first_seen).
        assert r["idle_since"] == "2026-11-22T03:36:00.000Z"
        assert r["wasted_gpu_hours"] == pytest.approx((T0 - (T0 - T0 % MIN - 29 * MIN)) / 3_600_000 * 0.5)
        high = await get(c, "/v1/idle?threshold_pct=50")
        assert [x["pod_uid"] for x in high["items"]] == ["u-low", "u-mid"] and high["window"] == "10m"
        wide = await get(c, "/v1/idle?window=3m")
        assert [x["pod_uid"] for x in wide["items"]] == ["u-low", "u-new"]


async def test_xid_lists_owners_at_the_time_and_filters_by_since(api: httpx.AsyncClient) -> None:
    items = (await get(api, "/v1/xid"))["items"]
    assert [x["code"] for x in items] == [48, 79, 94]
    old = items[0]
    assert set(old) >= {"at", "node", "gpu_uuid", "mig", "code", "owners"}
    assert old["owners"] == [
        {"pod_uid": "uid-gone", "namespace": "ml", "pod": "train-0", "container": "cuda", "device_id": GPU_A0}
    ]
    assert items[2]["mig"] == {"gi": 2, "ci": 0, "uuid": MIG_B0, "profile": "1g.10gb"}
    since = await get(api, "/v1/xid?since=2026-11-22T04:00:00Z")
    assert [x["code"] for x in since["items"]] == [79, 94]
    assert [x["code"] for x in (await get(api, "/v1/xid?since=2m"))["items"]] == [94]
    assert [x["code"] for x in (await get(api, "/v1/xid?node=gpu-b"))["items"]] == [94]
    assert [x["code"] for x in (await get(api, "/v1/xid?namespace=ml"))["items"]] == [48, 79]


async def test_findings_listing(api: httpx.AsyncClient) -> None:
    body = await get(api, "/v1/findings?kind=xid-owner")
    assert len(body["items"]) == 3 and {f["xid_code"] for f in body["items"]} == {48, 79, 94}
    assert (await get(api, "/v1/findings?kind=idle"))["items"] == []


async def test_policy_is_the_core_policy_view(api: httpx.AsyncClient) -> None:
    policy = pytest.importorskip("periscope.core.policy")
    body = await get(api, "/v1/policy")
    v = sample_view()
    expected = policy.policy_view(v.policy, v.nodes.values()).to_json()
    assert {k: body[k] for k in expected} == expected
    assert body["cluster_policy"] == {"name": "cluster-policy", "state": "notReady"}
    plugin = next(c for c in body["components"] if c["name"] == "devicePlugin")
    assert {"intended", "desired", "ready", "status"} <= set(plugin)


async def test_policy_with_nothing_seen_yet() -> None:
    pytest.importorskip("periscope.core.policy")
    async with client(View()) as c:
        body = await get(c, "/v1/policy")
        assert body["cluster_policy"] is None and isinstance(body["components"], list)


async def test_empty_view_lists_are_empty_with_null_as_of() -> None:
    async with client(View()) as c:
        for url in ("/v1/pods", "/v1/gpus", "/v1/idle", "/v1/xid", "/v1/findings"):
            assert await get(c, url) == {
                "items": [],
                "as_of": None,
                "continue": None,
                **({"threshold_pct": 5.0, "window": "10m"} if url == "/v1/idle" else {}),
            }


async def test_health_and_readiness_follow_the_consumer() -> None:
    status = ConsumerStatus(group_id="periscope-api-x", pending={("periscope.gpus.v1", 0): 10})
    async with client(View(), status) as c:
        assert (await get(c, "/healthz")) == {"status": "ok"}
        body = await get(c, "/readyz", 503)
        assert body["ready"] is False and body["group_id"] == "periscope-api-x"
        status.ready = True
        assert (await get(c, "/readyz"))["ready"] is True


async def test_openapi_and_docs_are_served(api: httpx.AsyncClient) -> None:
    spec = await get(api, "/openapi.json")
    for path in (
        "/v1/pods",
        "/v1/pods/{pod_uid}",
        "/v1/gpus",
        "/v1/idle",
        "/v1/xid",
        "/v1/policy",
        "/metrics",
        "/healthz",
        "/readyz",
    ):
        assert path in spec["paths"], path
    params = {p["name"] for p in spec["paths"]["/v1/pods"]["get"]["parameters"]}
    assert {"active", "namespace", "node", "limit", "continue"} <= params
    assert (await api.get("/docs")).status_code == 200


async def test_100k_rows_answer_node_filtered_pods_and_gpus() -> None:
    from tests.unit.test_api_samples import gpu

    v, nodes = View(), 400
    for i in range(25_000):
        n = i % nodes
        rows = [row(f"GPU-{n:03d}-{d}") for d in range(4)]
        v.apply(pod(f"uid-{i:05d}", f"ns-{i % 5}", f"pod-{i:05d}", f"node-{n:03d}", *rows))
    for n in range(nodes):
        for d in range(4):
            v.apply(gpu(f"GPU-{n:03d}-{d}", f"node-{n:03d}", d))
    assert v.row_count() == 100_000
    async with client(v) as c:
        items = (await get(c, "/v1/pods?node=node-007"))["items"]
        expected = sorted((f"ns-{i % 5}", f"pod-{i:05d}", f"uid-{i:05d}") for i in range(7, 25_000, nodes))
        assert sorted({(r["namespace"], r["pod"], r["pod_uid"]) for r in items}) == expected
        assert len(items) == len(expected) * 4 and {r["node"] for r in items} == {"node-007"}
        assert [r["device_id"] for r in items[:4]] == [f"GPU-007-{d}" for d in range(4)]
        page1 = await get(c, "/v1/pods?node=node-007&namespace=ns-2&limit=10")
        assert len(page1["items"]) == 10 and {r["namespace"] for r in page1["items"]} == {"ns-2"}
        gpus = (await get(c, "/v1/gpus"))["items"]
        assert len(gpus) == nodes * 4
        assert [(g["node"], g["index"]) for g in gpus[:5]] == [
            ("node-000", 0),
            ("node-000", 1),
            ("node-000", 2),
            ("node-000", 3),
            ("node-001", 0),
        ]
        assert [g["gpu_uuid"] for g in (await get(c, "/v1/gpus?node=node-399"))["items"]] == [
            f"GPU-399-{d}" for d in range(4)
        ]
