"""Attribution with DCGM's profiling fields: MIG util from the instance's graphics-engine activity, NVML
primary on whole GPUs, the fields only on rows whose unit is theirs alone, idle detection on MIG."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from periscope.core.engine import EngineConfig
from periscope.core.model import DcgmProfile, DeviceSample, Finding, MigRef, Output, PodAttribution
from periscope.core.rows import RowConfig
from periscope.core.usage import device_util
from tests.unit.core_builders import (
    alloc,
    ck,
    dev,
    gpu,
    inventory,
    mig,
    node_labels,
    pod,
    pr,
    proc,
    run,
    tel,
    uid,
)

S = 1000
PROF = DcgmProfile(gr_engine_active_pct=92.0, sm_active_pct=87.4, sm_occupancy_pct=43.7,
                   tensor_active_pct=55.2, dram_active_pct=36.8)
MIG_RES = "nvidia.com/mig-3g.40gb"


def last_pod(outs: list[Output], pod_uid: str) -> PodAttribution:
    return [o for o in outs if isinstance(o, PodAttribution) and o.pod_uid == pod_uid][-1]


def mig_events(profile: DcgmProfile | None, ticks: int = 2) -> list:  # type: ignore[type-arg]
    g, m = gpu(0), mig(1)
    ref = MigRef(uuid=m, profile="3g.40gb", gi=1, ci=0)
    return [
        inventory(migs=((1, "3g.40gb", 1, 0, 40192.0),)), pod(1, "train", 0),
        alloc(S, pr("ml", "train", (m,), resource=MIG_RES), ck(uid(1), (m,), resource=MIG_RES)),
        *(tel(k * S, dev(g, None, fb=None, power=250.0),
              replace(dev(m, None, fb=12000.0, power=None, parent=g, mig_ref=ref,
                          procs=(proc(5, uid(1), None, 12000.0),)), dcgm=profile))
          for k in range(2, 2 + ticks)),
    ]


def test_mig_util_from_gr_engine_active_with_dcgm_source() -> None:
    _, outs = run(mig_events(PROF))
    [row] = last_pod(outs, uid(1)).rows
    assert row.util_pct == 92.0 and "dcgm" in row.sources and row.share_basis == "exclusive"
    assert (row.sm_active_pct, row.sm_occupancy_pct, row.tensor_active_pct, row.dram_active_pct) == (
        87.4, 43.7, 55.2, 36.8)
    gstate = [o for o in outs if hasattr(o, "mig_devices") and o.mig_devices][-1]
    assert gstate.mig_devices[0].util_pct == 92.0  # /v1/gpus shows it too


def test_without_dcgm_mig_util_stays_null() -> None:
    _, outs = run(mig_events(None))
    [row] = last_pod(outs, uid(1)).rows
    assert row.util_pct is None and "dcgm" not in row.sources and row.sm_active_pct is None


def test_whole_gpu_nvml_stays_primary_dcgm_fields_added() -> None:
    g = gpu(0)
    sample = replace(dev(g, 40.0, procs=(proc(5, uid(1), 40.0, 1000.0),)), dcgm=PROF)
    _, outs = run([inventory(gpus=1), pod(1, "ft", 0), alloc(S, pr("ml", "ft", (g,)), ck(uid(1), (g,))),
                   tel(2 * S, sample)])
    [row] = last_pod(outs, uid(1)).rows
    assert row.util_pct == 40.0  # NVML's, not DCGM's 92
    assert row.tensor_active_pct == 55.2 and "dcgm" in row.sources


def test_shared_gpu_rows_get_no_device_wide_profile() -> None:
    g = gpu(0)
    a, b = f"{g}::0", f"{g}::1"
    sample = replace(dev(g, 60.0, procs=(proc(5, uid(1), 40.0, 1000.0), proc(6, uid(2), 20.0, 1000.0))),
                     dcgm=PROF)
    _, outs = run([
        inventory(gpus=1), node_labels(0, **{"nvidia.com/gpu.replicas": "2"}), pod(1, "a", 0), pod(2, "b", 0),
        alloc(S, pr("ml", "a", (a,)), ck(uid(1), (a,)), pr("ml", "b", (b,)), ck(uid(2), (b,))),
        tel(2 * S, sample),
    ])
    for n in (1, 2):
        [row] = last_pod(outs, uid(n)).rows
        assert row.sharing == "time-slicing" and row.sm_active_pct is None and "dcgm" not in row.sources


def test_idle_mig_holder_is_found() -> None:
    idle = DcgmProfile(gr_engine_active_pct=0.5)
    cfg = EngineConfig(rows=RowConfig(window_ms=2 * S, idle_window_ms=5 * S, idle_threshold_pct=5.0))
    _, outs = run(mig_events(idle, ticks=10), cfg)
    assert last_pod(outs, uid(1)).rows[0].idle
    assert any(isinstance(o, Finding) and o.kind == "idle" and o.pod_uid == uid(1) for o in outs)


@given(st.one_of(st.none(), st.floats(0, 100)), st.one_of(st.none(), st.floats(0, 100)))
def test_device_util_prefers_nvml(nvml: float | None, gr: float | None) -> None:
    d = DeviceSample("GPU-x", util_pct=nvml, dcgm=DcgmProfile(gr_engine_active_pct=gr))
    util, from_dcgm = device_util(d)
    assert util == (nvml if nvml is not None else gr)
    assert from_dcgm == (nvml is None and gr is not None)
