"""Red-team cases against the HTTP API, in process: hostile query values, /v1/owners under load, the
API docs page, label values on /metrics. Each case was a 500, a hang or a leak before its fix."""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from services.api.app import create_app
from services.api.owners import OwnerQueries, OwnersLimits
from services.api.owners import router as owners_router
from services.api.view import View
from tests.unit.test_api_samples import GPU_A0, gpu, owner, pod, row, sample_view, xid

HUGE = "9" * 400


class Lookups:
    """Stands in for the replay behind /v1/owners: counts calls, and takes `delay_s` each."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.calls: list[tuple[int, str | None, str | None]] = []

    async def __call__(self, at_ms: int, gpu_uuid: str | None, node: str | None) -> dict[str, Any]:
        self.calls.append((at_ms, gpu_uuid, node))
        await asyncio.sleep(self.delay_s)
        from periscope.wirejson import rfc3339

        item = {"node": "gpu-a", "gpu_uuid": GPU_A0, "device_id": GPU_A0, "mig": None, "pod_uid": "u1",
                "namespace": "ml", "pod": "train-0", "container": "cuda"}
        return {"at": rfc3339(at_ms), "items": [item]}


def client(view: View, lookups: Lookups | None = None,
           limits: OwnersLimits | None = None) -> httpx.AsyncClient:
    routers = [owners_router(OwnerQueries(lookups or Lookups(), limits or OwnersLimits()))]
    app = create_app(view, extra_routers=routers)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api")


@pytest.fixture
async def api() -> AsyncIterator[httpx.AsyncClient]:
    async with client(sample_view()) as c:
        yield c


# ---------------------------------------------------------------- item 7: 400, never 500


@pytest.mark.parametrize(
    "url",
    [
        f"/v1/idle?window={HUGE}s",
        f"/v1/idle?window={HUGE}",
        f"/v1/idle?window=1{'0' * 30}d",
        f"/v1/xid?since={HUGE}s",
        f"/v1/xid?since={HUGE}h",
        f"/v1/xid?since=1{'0' * 30}d",
        "/v1/owners?at=9999-12-31T23:59:59-14:00",
        "/v1/owners?at=0001-01-01T00:00:00%2B14:00",
        f"/v1/owners?at={HUGE}",
        "/v1/xid?since=9999-12-31T23:59:59-14:00",
    ],
)
async def test_absurd_times_and_durations_are_400_not_500(api: httpx.AsyncClient, url: str) -> None:
    r = await api.get(url)
    assert r.status_code == 400, r.text
    assert r.json()["error"]


def _nested_token(depth: int) -> str:
    raw = ("[" * depth + "]" * depth).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize("path", ["/v1/pods", "/v1/gpus", "/v1/idle", "/v1/xid", "/v1/findings"])
async def test_a_deeply_nested_continue_token_is_400(api: httpx.AsyncClient, path: str) -> None:
    for token in (_nested_token(20_000), "A" * 60_000):
        r = await api.get(path, params={"continue": token})
        assert r.status_code == 400, r.text
        assert "continue" in r.json()["error"]


async def test_owners_renders_at_as_rfc3339_utc_whatever_the_offset_given(api: httpx.AsyncClient) -> None:
    body = (await api.get("/v1/owners", params={"at": "2026-11-22T06:05:06.5+02:00"})).json()
    assert body["at"] == "2026-11-22T04:05:06.500Z"
    body = (await api.get("/v1/owners", params={"at": "0001-01-01T00:00:00Z"})).json()
    assert body["at"] == "0001-01-01T00:00:00.000Z"


# ---------------------------------------------------------------- item 4: /v1/owners under load


async def test_owners_queue_is_bounded_and_answers_429_with_retry_after() -> None:
    lookups = Lookups(delay_s=0.3)
    limits = OwnersLimits(concurrency=1, queue=2, cache_ttl_s=0.0)
    async with client(sample_view(), lookups, limits) as c:
        urls = [f"/v1/owners?at=2026-11-22T04:05:{i:02d}Z" for i in range(8)]
        answers = await asyncio.gather(*(c.get(u) for u in urls))
    codes = sorted(r.status_code for r in answers)
    assert codes.count(200) == 3 and codes.count(429) == 5, codes  # one running, two queued
    for r in answers:
        if r.status_code == 429:
            assert int(r.headers["retry-after"]) >= 1
            assert "busy" in r.json()["error"]
    assert len(lookups.calls) == 3


async def test_identical_recent_owner_queries_are_answered_once() -> None:
    lookups = Lookups(delay_s=0.05)
    async with client(sample_view(), lookups, OwnersLimits(concurrency=1, queue=1, cache_ttl_s=60)) as c:
        url = "/v1/owners?at=2026-11-22T04:05:06Z&node=gpu-a"
        # Forty at once: one replay, the rest wait for it (not a queue place each) or hit the cache.
        answers = await asyncio.gather(*(c.get(url) for _ in range(40)))
        again = await c.get(url)
    assert {r.status_code for r in answers} == {200} and again.status_code == 200
    assert len(lookups.calls) == 1
    assert again.json() == answers[0].json()


async def test_a_waiting_owner_query_gives_up_within_its_deadline() -> None:
    lookups = Lookups(delay_s=5.0)
    limits = OwnersLimits(concurrency=1, queue=4, cache_ttl_s=0.0, timeout_s=0.3)
    async with client(sample_view(), lookups, limits) as c:
        t0 = asyncio.get_running_loop().time()
        answers = await asyncio.gather(*(c.get(f"/v1/owners?at=2026-11-22T04:05:0{i}Z") for i in range(3)))
        took = asyncio.get_running_loop().time() - t0
    assert took < 2.0
    assert {r.status_code for r in answers} <= {503, 429}
    assert all("retry-after" in r.headers for r in answers)


# ---------------------------------------------------------------- item 6: /docs without a CDN


async def test_docs_load_no_script_from_elsewhere_and_html_pages_have_a_csp(api: httpx.AsyncClient) -> None:
    docs = await api.get("/docs")
    assert docs.status_code == 200
    html = docs.text
    sources = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert sources, html
    for s in sources:
        assert s.startswith("/"), f"/docs loads {s} from elsewhere"
        assert (await api.get(s)).status_code == 200, s
    assert "<script>" not in html.replace(" ", "")  # no inline script: the CSP can forbid them
    for path in ("/", "/docs", "/docs/assets/start.js", "/v1/pods", "/metrics"):
        r = await api.get(path)
        csp = dict(d.strip().split(" ", 1) for d in r.headers.get("content-security-policy", "").split(";"))
        assert csp.get("default-src") == "'none'", (path, csp)
        if path != "/":  # the web view's own inline script is its whole page (webview.py)
            assert "script-src" not in csp or "'unsafe-inline'" not in csp["script-src"], (path, csp)
        assert r.headers.get("x-content-type-options") == "nosniff", path
    for gone in ("/redoc", "/docs/oauth2-redirect"):  # CDN script, inline script: not served
        assert (await api.get(gone)).status_code == 404, gone


# ---------------------------------------------------------------- item 3: label values on /metrics


async def test_metrics_label_values_carry_no_control_characters() -> None:
    evil = "ml\x1b[31m\r\x00\x07\u2028x\n"
    v = View()
    v.apply(pod("uid-evil\x1b]0;pwned\x07", evil, "p\x1b[2J", "gpu-a\x0b", row(GPU_A0, container="c\x1b")))
    v.apply(gpu(GPU_A0, "gpu-a\x0b", 0, owner("uid-evil", evil, "p\x1b"), model="A100\x1b[0m"))
    v.apply(xid(GPU_A0, 1_795_320_306_789, 79, owner("uid-evil", evil, "p\x1b"), node="gpu-a\x0b"))
    async with client(v) as c:
        text = (await c.get("/metrics")).text
    assert "periscope_pod_gpu_allocated{" in text and "periscope_xid_errors_total{" in text
    bad = [ch for ch in text if (ord(ch) < 32 and ch != "\n") or 0x7F <= ord(ch) < 0xA0 or ch == "\u2028"]
    assert not bad, sorted({repr(b) for b in bad})
    assert 'namespace="ml[31mx\\n"' in text  # the printable part, and a newline written escaped
