"""/metrics: Prometheus text generated from the view at scrape time."""

from __future__ import annotations

from dataclasses import replace

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from services.api.app import create_app
from services.api.status import ConsumerStatus
from services.api.view import View
from tests.unit.test_api_samples import GPU_A0, MIG_B0, T0, pod, row, sample_view


async def scrape(view: View, status: ConsumerStatus | None = None) -> dict[str, list[Sample]]:
    app = create_app(view, status)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        r = await c.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out: dict[str, list[Sample]] = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def by_pod(samples: list[Sample]) -> dict[str, Sample]:
    return {s.labels["pod_uid"]: s for s in samples}


async def test_attribution_series_are_labelled_with_pod_uid_and_device() -> None:
    m = await scrape(sample_view())
    util = by_pod(m["periscope_pod_gpu_util_percent"])
    assert util["uid-busy"].value == 80.0 and util["uid-idle"].value == 1.0
    assert util["uid-busy"].labels == {
        "pod_uid": "uid-busy",
        "namespace": "ml",
        "pod": "train-0",
        "container": "cuda",
        "node": "gpu-a",
        "gpu_uuid": GPU_A0,
        "device_id": GPU_A0,
        "mig_profile": "",
    }
    assert "uid-mig" not in util  # MIG slice without profiling data: no utilization, not a zero
    fb = by_pod(m["periscope_pod_gpu_fb_used_bytes"])
    assert fb["uid-mig"].value == 2048 * 1024 * 1024 and fb["uid-mig"].labels["mig_profile"] == "1g.10gb"
    assert fb["uid-mig"].labels["device_id"] == MIG_B0
    assert by_pod(m["periscope_pod_gpu_power_watts"])["uid-busy"].value == 250.0
    idle = by_pod(m["periscope_pod_gpu_idle"])
    assert idle["uid-idle"].value == 1.0 and idle["uid-busy"].value == 0.0
    assert "uid-gone" not in idle  # released allocations are not exported


async def test_gpu_and_xid_series() -> None:
    m = await scrape(sample_view())
    util = {s.labels["gpu_uuid"]: s.value for s in m["periscope_gpu_util_percent"]}
    assert util[GPU_A0] == 80.0
    temps = m["periscope_gpu_temperature_celsius"]
    assert {s.value for s in temps} == {61.0} and temps[0].labels.keys() >= {
        "node",
        "gpu_uuid",
        "model",
        "index",
    }
    owners = {s.labels["node"] + "/" + s.labels["index"]: s.value for s in m["periscope_gpu_owners"]}
    assert owners == {"gpu-a/0": 1, "gpu-a/1": 1, "gpu-b/0": 1}
    xids = {(s.labels["code"], s.labels["pod_uid"]): s.value for s in m["periscope_xid_errors_total"]}
    assert xids == {("79", "uid-busy"): 1.0, ("48", "uid-gone"): 1.0, ("94", "uid-mig"): 1.0}


async def test_series_follow_the_view_at_each_scrape() -> None:
    v = View()
    v.apply(pod("u1", "ml", "a", "gpu-a", row(GPU_A0, util_pct=10.0), as_of=T0))
    assert by_pod((await scrape(v))["periscope_pod_gpu_util_percent"])["u1"].value == 10.0
    v.apply(pod("u1", "ml", "a", "gpu-a", row(GPU_A0, util_pct=55.0), as_of=T0 + 1))
    assert by_pod((await scrape(v))["periscope_pod_gpu_util_percent"])["u1"].value == 55.0
    v.apply(pod("u1", "ml", "a", "gpu-a", replace(row(GPU_A0), active=False, util_pct=None), as_of=T0 + 2))
    assert "periscope_pod_gpu_util_percent" not in await scrape(v)


async def test_consumer_metrics() -> None:
    status = ConsumerStatus(
        group_id="g",
        consumed={"periscope.gpus.v1": 7},
        applied=5,
        stale=2,
        dead_letters=1,
        lag={("periscope.gpus.v1", 0): 3, ("periscope.gpus.v1", 1): 4},
    )
    m = await scrape(View(), status)
    assert m["periscope_api_records_consumed_total"][0].value == 7
    assert m["periscope_api_records_consumed_total"][0].labels == {"topic": "periscope.gpus.v1"}
    assert m["periscope_api_dead_letters_total"][0].value == 1
    assert m["periscope_api_records_applied_total"][0].value == 5
    assert m["periscope_api_consumer_lag"][0].value == 7
    assert m["periscope_api_ready"][0].value == 0
    status.ready = True
    assert (await scrape(View(), status))["periscope_api_ready"][0].value == 1


async def test_label_values_are_escaped_and_survive_a_parse() -> None:
    v = View()
    odd = 'we"ird\\name\nx'
    v.apply(pod("u1", "ml", "a", "gpu-a", row(GPU_A0, container=odd, util_pct=12.5)))
    m = await scrape(v)
    (s,) = m["periscope_pod_gpu_util_percent"]
    assert s.labels["container"] == odd and s.value == 12.5
    # Label sets are cached between scrapes; a changed value still comes through.
    v.apply(pod("u1", "ml", "a", "gpu-a", row(GPU_A0, container=odd, util_pct=99.0), as_of=T0 + 1))
    assert (await scrape(v))["periscope_pod_gpu_util_percent"][0].value == 99.0


async def test_every_metric_family_is_exported_once() -> None:
    # Two collectors exporting one name make the exposition invalid for Prometheus.
    app = create_app(View(), ConsumerStatus(group_id="g"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        text = (await c.get("/metrics")).text
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert types and len(types) == len(set(types)), sorted(t for t in types if types.count(t) > 1)


@pytest.mark.parametrize("series", ["PodSeries", "GpuSeries"])
async def test_view_series_are_rendered_once_per_view_version_and_follow_every_change(
    monkeypatch: pytest.MonkeyPatch, series: str
) -> None:
    from services.api import metrics

    cls = getattr(metrics, series)
    renders = 0
    original = cls.render

    def counting(self: metrics.ViewSeries) -> str:
        nonlocal renders
        renders += 1
        return str(original(self))

    monkeypatch.setattr(cls, "render", counting)
    view = sample_view()
    app = create_app(view, None)

    async def utils() -> tuple[float, float]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
            text = (await c.get("/metrics")).text
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        gpus = {s.labels["gpu_uuid"]: s.value for s in fams["periscope_gpu_util_percent"].samples}
        return by_pod(fams["periscope_pod_gpu_util_percent"].samples)["uid-busy"].value, gpus[GPU_A0]

    assert await utils() == (80.0, 80.0) and await utils() == (80.0, 80.0)
    assert renders == 1  # the view did not change between the scrapes
    assert view.apply(pod("uid-busy", "ml", "train-0", "gpu-a", row(GPU_A0, util_pct=55.0), as_of=T0 + 1000))
    assert await utils() == (55.0, 80.0) and renders == 2
    newer = replace(view.gpus[GPU_A0], util_pct=33.0, sample_ms=T0 + 2000, as_of_ms=T0 + 2000)
    assert view.apply(newer)
    assert await utils() == (55.0, 33.0) and renders == 3
