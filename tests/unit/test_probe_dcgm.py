"""The probe's dcgm-exporter source: parsing and mapping (golden tables over the hand-written exposition
in the exporter's documented format), and what it does when the exporter is down, garbage or stale."""

from __future__ import annotations

from pathlib import Path

import pytest

from periscope.core.model import DcgmProfile, DeviceSample, MigRef
from periscope.settings.probe import ProbeSettings
from services.probe.dcgm import NO_PROFILING, DcgmSource, ExporterError, Reading, annotate, parse, profiles

CORPUS = Path(__file__).parent / "data" / "corpus" / "dcgm"
GPU0 = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
GPU1 = "GPU-bbbbbbbb-0000-4000-8000-000000000000"
MIG1, MIG2 = "MIG-11111111-0000-4000-8000-000000000000", "MIG-22222222-0000-4000-8000-000000000000"
DEVICES = (
    DeviceSample(GPU0, index=0),
    DeviceSample(MIG1, parent_uuid=GPU0, mig=MigRef(MIG1, "3g.40gb", 1, 0), fb_used_mib=36000),
    DeviceSample(MIG2, parent_uuid=GPU0, mig=MigRef(MIG2, "1g.10gb", 2, 0)),
    DeviceSample(GPU1, index=1, util_pct=70),
)


def golden() -> str:
    return (CORPUS / "a100-mig-k8s.prom").read_text()


def test_parse_golden_exposition() -> None:
    readings, total = parse(golden())
    assert total == 13  # every DCGM series, profiling or not
    assert set(readings) == {
        Reading("gr_engine_active_pct", GPU0, 1, 92.0),
        Reading("gr_engine_active_pct", GPU0, 2, 0.0),
        Reading("gr_engine_active_pct", GPU1, None, 70.0),
        Reading("tensor_active_pct", GPU0, 1, 55.2),
        Reading("tensor_active_pct", GPU1, None, 42.0),
        Reading("dram_active_pct", GPU0, 1, 36.8),
        Reading("dram_active_pct", GPU1, None, 28.0),
    }


def test_map_to_gpus_and_mig_instances() -> None:
    got = profiles(parse(golden())[0], DEVICES)
    assert got == {
        MIG1: DcgmProfile(gr_engine_active_pct=92.0, tensor_active_pct=55.2, dram_active_pct=36.8),
        MIG2: DcgmProfile(gr_engine_active_pct=0.0),
        GPU1: DcgmProfile(gr_engine_active_pct=70.0, tensor_active_pct=42.0, dram_active_pct=28.0),
    }
    out = annotate(DEVICES, got)
    assert out[0].dcgm is None and out[1].dcgm == got[MIG1] and out[3].util_pct == 70  # NVML untouched


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # (series, the reading it gives or None when skipped)
        ('DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-x"} 0.5', Reading("sm_active_pct", "GPU-x", None, 50.0)),
        ('DCGM_FI_PROF_SM_OCCUPANCY{gpu="0",UUID="GPU-x",GPU_I_PROFILE="1g.10gb",GPU_I_ID="7"} 0.25',
         Reading("sm_occupancy_pct", "GPU-x", 7, 25.0)),
        ('DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO{gpu="0",UUID="GPU-x"} 1', Reading("gr_engine_active_pct", "GPU-x",
                                                                              None, 100.0)),
        ('DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",uuid="GPU-old"} 0.1',
         Reading("gr_engine_active_pct", "GPU-old", None, 10.0)),  # --use-old-namespace
        ('DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0"} 0.1', None),  # no UUID
        ('DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-x",GPU_I_ID="one"} 0.1', None),
        ('DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-x"} 1.5', None),  # not a ratio
        ('DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-x"} NaN', None),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-x"} 40', None),  # NVML's field: not taken from DCGM
    ],
)
def test_parse_series_table(line: str, expected: Reading | None) -> None:
    readings, _ = parse(line + "\n")
    assert readings == ([] if expected is None else [expected])


def test_unknown_devices_left_out_and_duplicates_take_the_first() -> None:
    gr = "gr_engine_active_pct"
    readings = [Reading(gr, GPU1, None, 30.0), Reading(gr, GPU1, None, 31.0),
                Reading(gr, "GPU-elsewhere", None, 5.0), Reading(gr, GPU0, 9, 5.0)]  # no GI 9 on GPU0
    assert profiles(readings, DEVICES) == {GPU1: DcgmProfile(gr_engine_active_pct=30.0)}


@pytest.mark.parametrize(
    "body",
    ["<html><body>502 Bad Gateway</body></html>\n", "DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu=0 0.5\n",
     "# HELP up whatever\nup 1\n", "", "\x00\x01\x02garbage"],
)
def test_garbage_is_corrupt(body: str) -> None:
    with pytest.raises(ExporterError) as e:
        parse(body)
    assert e.value.state == "corrupt"


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def source(bodies: list[str | Exception], clock: Clock) -> DcgmSource:
    def fetch(url: str, timeout_s: float, max_bytes: int) -> str:
        b = bodies.pop(0)
        if isinstance(b, Exception):
            raise b
        return b

    return DcgmSource("http://exporter/metrics", 1.0, 0.5, 1 << 20, fetch=fetch, monotonic=clock)


def test_values_kept_until_two_scrapes_failed_then_dropped_never_reused() -> None:
    clock = Clock()
    down = ExporterError("unavailable", "ConnectError")
    src = source([golden(), down, down, golden()], clock)
    src.scrape()
    assert src.health.state == "ok" and src.annotate(DEVICES)[1].dcgm is not None
    clock.t += 1.0
    src.scrape()  # down: the values of one scrape ago still count
    assert src.health.state == "unavailable" and src.annotate(DEVICES)[1].dcgm is not None
    clock.t += 1.0
    src.scrape()  # down again: two scrapes failed to renew them
    assert all(d.dcgm is None for d in src.annotate(DEVICES))
    clock.t += 1.0
    assert all(d.dcgm is None for d in src.annotate(DEVICES))  # dropped, not brought back
    src.scrape()
    assert src.health.state == "ok" and src.annotate(DEVICES)[1].dcgm is not None


def test_garbage_after_good_keeps_nothing_stale_and_says_corrupt() -> None:
    clock = Clock()
    src = source([golden(), "<html>oops</html>", "<html>oops</html>"], clock)
    src.scrape()
    clock.t += 1.0
    src.scrape()
    assert src.health.state == "corrupt" and src.last_result == "corrupt"
    clock.t += 1.5
    src.scrape()
    assert all(d.dcgm is None for d in src.annotate(DEVICES))


def test_unexpected_error_is_a_state_not_a_crash() -> None:
    src = source([RuntimeError("boom")], Clock())
    src.scrape()
    assert src.health.state == "unavailable" and "boom" in src.health.detail


def test_no_profiling_fields_is_ok_and_says_why() -> None:
    src = source(['DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-x"} 40\n'], Clock())
    src.scrape()
    assert src.health.state == "ok" and src.health.detail == NO_PROFILING


def test_settings() -> None:
    s = ProbeSettings(node_name="n", tick="2s")
    assert s.dcgm_exporter_url == "" and s.dcgm_every() == 5.0
    assert ProbeSettings(node_name="n", tick="10s").dcgm_every() == 10.0
    s = ProbeSettings(node_name="n", dcgm_exporter_url="http://10.0.0.1:9400/metrics", dcgm_interval="5s",
                      dcgm_timeout="250ms")
    assert (s.dcgm_every(), s.dcgm_timeout) == (5.0, 0.25)
    for bad in ({"dcgm_exporter_url": "10.0.0.1:9400"}, {"dcgm_timeout": "0s"}, {"dcgm_max_bytes": 10}):
        with pytest.raises(ValueError):
            ProbeSettings(node_name="n", **bad)


def test_values_dropped_when_the_scrape_loop_stalls() -> None:
    clock = Clock()
    src = source([golden()], clock)
    src.scrape()
    clock.t += 2 * (1.0 + 0.5) + 0.1  # no scrape for longer than two intervals and two timeouts
    assert all(d.dcgm is None for d in src.annotate(DEVICES))


def test_only_the_profiling_lines_are_parsed() -> None:
    # A field the probe does not read is counted but not parsed: a broken one costs nothing.
    text = 'DCGM_FI_DEV_GPU_UTIL{gpu="0" 40\nDCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-x"} 0.5\n'
    assert parse(text) == ([Reading("gr_engine_active_pct", "GPU-x", None, 50.0)], 2)
