"""GET /v1/usage and the GPU-hours counters: the windows' accounting as the view merged it."""

from __future__ import annotations

from dataclasses import replace

import httpx
import pytest

from periscope.contract.values import rfc3339
from periscope.core.model import PodAttribution, WindowStat
from services.api import windows
from services.api.access import Scope
from services.api.accounts import OTHER, GpuHoursTotals
from services.api.app import create_app
from services.api.auth import caller
from services.api.view import View
from tests.unit.test_api_app import client, get
from tests.unit.test_api_metrics import scrape
from tests.unit.test_api_samples import GPU_A0, GPU_A1, MIN, T0, pod, row
from tests.unit.test_api_samples import idle_windows as windows_at

HOUR = 60 * MIN
BASE = T0 - T0 % MIN


def view_of(*pods: PodAttribution) -> View:
    v = View()
    for p in pods:
        v.apply(p)
    return v


def job(uid: str, ns: str, name: str, gpu: str, pct: float, n: int = 30, **kw: object) -> PodAttribution:
    return pod(uid, ns, name, "gpu-a", row(gpu, windows=windows_at(pct, n)), owner_kind="Job",
               owner_name=name, **kw)


def iso(ms: int) -> str:
    return rfc3339(ms)


async def test_usage_groups_the_windows_in_the_period_and_the_total_is_their_sum() -> None:
    v = view_of(job("u1", "ml", "train", GPU_A0, 80.0), job("u2", "nb", "notebook", GPU_A1, 1.0))
    async with client(v) as c:
        doc = await get(c, f"/v1/usage?from={iso(BASE - 10 * MIN)}&to={iso(BASE)}&by=namespace")
    ml, nb = doc["groups"]
    assert (ml["key"], nb["key"]) == ("ml", "nb")
    hour = pytest.approx(10 / 60, abs=1e-6)
    assert ml["allocated_gpu_hours"] == hour and ml["used_gpu_hours"] == pytest.approx(8 / 60, abs=1e-6)
    assert ml["idle_gpu_hours"] == 0 and ml["efficiency"] == 0.8 and ml["cost"] is None
    assert nb["idle_gpu_hours"] == hour and nb["request_gpu_hours"] == hour
    assert doc["total"]["allocated_gpu_hours"] == pytest.approx(20 / 60, abs=1e-6)
    assert doc["total"]["pods"] == 2
    assert doc["from"] == iso(BASE - 10 * MIN) and doc["by"] == "namespace"


async def test_usage_by_workload_and_pod_and_a_namespace_filter() -> None:
    v = view_of(job("u1", "ml", "train", GPU_A0, 80.0), job("u2", "nb", "notebook", GPU_A1, 1.0))
    async with client(v) as c:
        work = await get(c, "/v1/usage?from=20m&by=workload")
        pods = await get(c, "/v1/usage?from=20m&by=pod&namespace=nb")
    assert [g["key"] for g in work["groups"]] == ["ml/Job/train", "nb/Job/notebook"]
    (only,) = pods["groups"]
    assert (only["key"], only["namespace"], only["pod"]) == ("u2", "nb", "notebook")


@pytest.mark.parametrize(("query", "message"), [
    ("from=2h", "is before the API's view"),
    ("from=10m&by=label:team", "pod labels are not in the API's view"),
    ("from=10m&by=team", "by: unknown grouping 'team'"),
    ("from=10m&to=20m", "is not before to"),
    ("from=yesterday", "from: not an RFC 3339 time or a duration"),
    ("to=10m", "from"),
    ("from=10m&size=3", "unknown query parameter 'size'"),
])
async def test_bad_usage_queries_are_400_naming_the_problem(query: str, message: str) -> None:
    async with client(view_of(job("u1", "ml", "train", GPU_A0, 80.0))) as c:
        body = await get(c, f"/v1/usage?{query}", status=400)
    assert message in body["error"]
    if "before the API's view" in message:
        assert "periscope usage --from T --to T" in body["error"]


async def test_a_namespaced_caller_sees_only_its_namespaces_groups() -> None:
    v = view_of(job("u1", "ml", "train", GPU_A0, 80.0), job("u2", "nb", "notebook", GPU_A1, 1.0))
    app = create_app(v)
    app.dependency_overrides[caller] = lambda: Scope(cluster=False, namespaces=frozenset({"nb"}))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        r = await c.get("/v1/usage?from=20m")
    doc = r.json()
    assert r.status_code == 200 and [g["key"] for g in doc["groups"]] == ["nb"]
    assert doc["total"]["allocated_gpu_hours"] == doc["groups"][0]["allocated_gpu_hours"]


async def test_counters_count_each_window_once_and_only_grow() -> None:
    v = view_of(job("u1", "ml", "train", GPU_A0, 80.0, n=3))
    first = {k: h for k, h in v.gpu_hours.hours()}
    assert first == {("ml", "Job/train"): pytest.approx((3 / 60, 2.4 / 60, 0.0))}
    # The same windows again (at-least-once delivery, a replica re-reading): nothing more.
    v.apply(replace(job("u1", "ml", "train", GPU_A0, 80.0, n=3), as_of_ms=T0 + 1))
    assert dict(v.gpu_hours.hours()) == first
    # A repeat of the last window, whole after the row came back in it, adds only what it grew.
    last = windows_at(80.0, 1)[0]
    grown = replace(last, gpu_ms=last.gpu_ms + 30_000, used_gpu_ms=last.used_gpu_ms + 24_000)
    v.apply(pod("u1", "ml", "train", "gpu-a", row(GPU_A0, windows=(grown,)), owner_kind="Job",
                owner_name="train", as_of=T0 + 2))
    (hours,) = dict(v.gpu_hours.hours()).values()
    assert hours == pytest.approx((3.5 / 60, 2.8 / 60, 0.0))
    # A late, older copy that is smaller takes nothing back.
    v.apply(pod("u1", "ml", "train", "gpu-a", row(GPU_A0, windows=(last,)), owner_kind="Job",
                owner_name="train", as_of=T0 - 5))
    assert dict(v.gpu_hours.hours()) == {("ml", "Job/train"): hours}
    m = await scrape(v)
    (alloc,) = m["periscope_gpu_hours_allocated_total"]
    assert alloc.labels == {"namespace": "ml", "workload": "Job/train"}
    assert alloc.value == pytest.approx(3.5 / 60)
    assert m["periscope_gpu_hours_idle_total"][0].value == 0.0


def test_counters_outlive_pruned_windows_and_evicted_pods() -> None:
    v = view_of(job("u1", "ml", "train", GPU_A0, 80.0, n=10))
    before = dict(v.gpu_hours.hours())
    v.prune_windows(T0 + HOUR)
    v.apply(replace(job("u1", "ml", "train", GPU_A0, 80.0, n=0), as_of_ms=T0 + 2 * HOUR))
    assert dict(v.gpu_hours.hours()) == before


def test_counter_series_are_bounded() -> None:
    t = GpuHoursTotals(max_series=3)
    w = ((BASE, 1000.0, 500.0, 0.0), None)
    for n in range(10):
        t.add(("ml", f"Job/etl-{n}"), [w])
    t.add(("nb", "Pod"), [w])
    keys = [k for k, _ in t.hours()]
    etl = [("ml", f"Job/etl-{n}") for n in range(3)]
    assert keys == [*etl, ("ml", OTHER), ("nb", OTHER)]
    total = sum(h[0] for _, h in t.hours())
    assert total == pytest.approx(11 * 1000.0 / HOUR)  # nothing is lost, only folded
    for n in range(10):
        t.add((f"ns-{n}", "Pod"), [w])
    assert len(t) <= 2 * 3 + 1 and (OTHER, OTHER) in dict(t.hours())


def test_windows_without_accounting_keep_their_old_layout() -> None:
    plain = [WindowStat(BASE + (k - 5) * MIN, 60, 60.0, 60, 1024.0, 6000.0) for k in range(3)]
    s = windows.merge(b"", plain, 0)
    assert len(s) == 27 + 3 * 20 and windows.windows(s) == tuple(plain)
    acct = windows_at(80.0, 3)
    s2 = windows.merge(s, acct[-1:], 0)  # a window with accounting widens every record, exactly
    assert windows.windows(s2)[-1] == replace(acct[-1], alloc_basis="")
    assert windows.windows(s2)[:-1] == tuple(plain)
