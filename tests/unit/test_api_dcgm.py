"""DCGM on the API: MIG util and the profiling fields in /v1/pods and /metrics (null / absent where not
available), through the app over ASGI."""

from __future__ import annotations

import httpx

from periscope.core.model import MigRef
from services.api.app import create_app
from services.api.view import View
from tests.unit.test_api_metrics import by_pod, scrape
from tests.unit.test_api_samples import GPU_A0, GPU_B0, MIG_B0, pod, row

FIELDS = ("sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "dram_active_pct")


def view() -> View:
    v = View()
    v.apply(pod("uid-mig", "infer", "serve-0", "gpu-b", row(
        MIG_B0, gpu_uuid=GPU_B0, sharing="mig", util_pct=92.0, mig=MigRef(MIG_B0, "1g.10gb", 2, 0),
        sources=("checkpoint", "dcgm", "podresources"), sm_active_pct=87.4, sm_occupancy_pct=43.7,
        tensor_active_pct=55.2, dram_active_pct=36.8)))
    v.apply(pod("uid-plain", "ml", "train-0", "gpu-a", row(GPU_A0, util_pct=50.0)))
    return v


async def test_pods_rows_carry_dcgm_fields_or_null() -> None:
    app = create_app(view())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        items = {r["pod_uid"]: r for r in (await c.get("/v1/pods")).json()["items"]}
    mig = items["uid-mig"]
    assert mig["util_pct"] == 92.0 and "dcgm" in mig["sources"]
    assert [mig[f] for f in FIELDS] == [87.4, 43.7, 55.2, 36.8]
    assert [items["uid-plain"][f] for f in FIELDS] == [None] * 4


async def test_metrics_export_dcgm_series_only_where_known() -> None:
    m = await scrape(view())
    for name, want in (("periscope_pod_gpu_sm_active_percent", 87.4),
                       ("periscope_pod_gpu_tensor_active_percent", 55.2),
                       ("periscope_pod_gpu_dram_active_percent", 36.8),
                       ("periscope_pod_gpu_sm_occupancy_percent", 43.7)):
        got = by_pod(m[name])
        assert got["uid-mig"].value == want and "uid-plain" not in got  # unknown is not zero
    assert by_pod(m["periscope_pod_gpu_util_percent"])["uid-mig"].value == 92.0
