"""The probe scraping a dcgm-exporter over HTTP (the simulator's, serving text in the real exporter's
format), through to the telemetry it publishes on the broker: MIG instances and whole GPUs get DCGM's
profiling fields; an exporter that fails, talks garbage or goes away is a health state and a metric,
its old values are dropped, and the probe keeps sampling."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from periscope.bus.clients import Kafka
from periscope.core.model import DeviceInventory, NodeTelemetry
from periscope.sim.dcgm import FakeDcgmExporter
from services.probe.service import Probe
from tests.integration.test_probe_service import GPU0, GPU1, MIG_A, MIG_B, Collector, Node, latest_with

LABELS = 'pci_bus_id="00000000:07:00.0",modelName="NVIDIA A100-SXM4-80GB",Hostname="n"'


def exposition() -> str:
    """GPU0 whole (80 % busy), GPU1 in MIG mode: GI 9 (MIG_A) 42 % busy, GI 2 (MIG_B) idle."""
    g0 = f'gpu="0",UUID="{GPU0}",device="nvidia0",{LABELS}'
    g1 = f'gpu="1",UUID="{GPU1}",device="nvidia1",{LABELS}'
    a = f'gpu="1",UUID="{GPU1}",device="nvidia1",GPU_I_PROFILE="1g.10gb",GPU_I_ID="9",{LABELS}'
    b = f'gpu="1",UUID="{GPU1}",device="nvidia1",GPU_I_PROFILE="3g.40gb",GPU_I_ID="2",{LABELS}'
    return "\n".join([
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).", "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
        f"DCGM_FI_DEV_GPU_UTIL{{{g0}}} 80",
        "# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).", "# TYPE DCGM_FI_DEV_POWER_USAGE gauge",
        f"DCGM_FI_DEV_POWER_USAGE{{{g1}}} 100",
        "# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.",
        "# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge",
        f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{g0}}} 0.800000",
        f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{a}}} 0.420000",
        f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{b}}} 0.000000",
        "# HELP DCGM_FI_PROF_PIPE_TENSOR_ACTIVE Ratio of cycles the tensor (HMMA) pipe is active.",
        "# TYPE DCGM_FI_PROF_PIPE_TENSOR_ACTIVE gauge",
        f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{a}}} 0.250000",
    ]) + "\n"


@pytest.fixture
async def node(tmp_path: Path, unique: str) -> AsyncIterator[Node]:
    n = Node(tmp_path, f"gpu-{unique}")
    await n.start()
    yield n
    await n.kubelet.stop()


@pytest.fixture
async def collector(broker: Kafka, node: Node) -> AsyncIterator[Collector]:
    c = Collector(broker, node.name)
    await c.start()
    yield c
    await c.stop()


@pytest.fixture
async def exporter() -> AsyncIterator[FakeDcgmExporter]:
    e = FakeDcgmExporter("n")
    e.text = exposition()
    await e.start()
    yield e
    await e.stop()


def devices(t: NodeTelemetry) -> dict[str, object]:
    return {d.uuid: d.dcgm for d in t.devices}


async def test_profiling_fields_reach_the_telemetry_and_failures_are_health(
    broker: Kafka, node: Node, collector: Collector, exporter: FakeDcgmExporter
) -> None:
    probe = Probe(node.settings(broker, dcgm_exporter_url=exporter.url, dcgm_interval=0.2, dcgm_timeout=0.5))
    await probe.start()
    try:
        tel = await collector.wait(lambda: latest_with(
            collector, NodeTelemetry, lambda t: any(d.dcgm is not None for d in t.devices)))
        by = {d.uuid: d for d in tel.devices}
        assert by[MIG_A].dcgm is not None and by[MIG_A].dcgm.gr_engine_active_pct == 42.0
        assert by[MIG_A].dcgm.tensor_active_pct == 25.0 and by[MIG_A].util_pct is None  # NVML has none
        assert by[MIG_B].dcgm is not None and by[MIG_B].dcgm.gr_engine_active_pct == 0.0
        assert by[GPU0].dcgm is not None and by[GPU0].dcgm.gr_engine_active_pct == 80.0
        assert by[GPU0].util_pct == 80  # NVML's own, unchanged
        ok = await collector.wait(lambda: latest_with(
            collector, DeviceInventory, lambda i: ("dcgm", "ok") in {(h.source, h.state) for h in i.health}))
        assert ok is not None

        exporter.mode = "garbage"
        since = time.monotonic()
        await collector.wait(lambda: latest_with(
            collector, DeviceInventory, lambda i: any(h.source == "dcgm" and h.state == "corrupt"
                                                      for h in i.health), since))
        # two scrape intervals (two ticks) later the old values are gone, and sampling goes on
        later = time.monotonic() + 0.5
        await collector.wait(lambda: latest_with(
            collector, NodeTelemetry, lambda t: all(d.dcgm is None for d in t.devices), later), timeout=10)

        await exporter.stop()  # connection refused
        since = time.monotonic()
        await collector.wait(lambda: latest_with(
            collector, DeviceInventory, lambda i: any(h.source == "dcgm" and h.state == "unavailable"
                                                      for h in i.health), since))
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{probe.health_port}") as http:
            text = (await http.get("/metrics")).text
            ready = (await http.get("/readyz")).json()
        assert f'periscope_probe_dcgm_scrapes_total{{node="{node.name}",result="corrupt"}}' in text
        assert 'result="unavailable"' in text and 'result="ok"' in text
        assert f'periscope_probe_source_up{{node="{node.name}",source="dcgm"}} 0.0' in text
        assert ready["sources"]["dcgm"]["state"] == "unavailable"
        assert ready["ready"]  # an optional source: the probe still serves
        recent = time.monotonic() - 1.0
        assert latest_with(collector, NodeTelemetry, lambda t: True, recent) is not None
    finally:
        await probe.stop()


async def test_off_by_default_no_dcgm_source(broker: Kafka, node: Node, collector: Collector) -> None:
    probe = Probe(node.settings(broker))
    await probe.start()
    try:
        inv = await collector.wait(lambda: latest_with(collector, DeviceInventory, lambda i: bool(i.gpus)))
        tel = await collector.wait(lambda: latest_with(collector, NodeTelemetry, lambda t: bool(t.devices)))
    finally:
        await probe.stop()
    assert "dcgm" not in {h.source for h in inv.health}
    assert all(d.dcgm is None for d in tel.devices)
