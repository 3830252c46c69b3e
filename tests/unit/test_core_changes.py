"""The change rule: which outputs the core publishes (golden table), windows once when they close, the
heartbeat on event time, and what a row keeps in memory."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from periscope.core.changes import ChangeConfig, carry_windows, worth_publishing
from periscope.core.engine import EngineConfig, apply, current_view, flush, new_state
from periscope.core.model import (
    AttributionRow,
    GpuState,
    MigRef,
    MigState,
    NodeInput,
    Output,
    Owner,
    PodAttribution,
    WindowStat,
    XidRef,
)
from periscope.core.rows import IW, RowConfig, W
from tests.unit.core_builders import NODE, alloc, dev, gpu, inventory, pod, pr, proc, run, tel, uid

S = 1000
CFG = ChangeConfig()
ROW = AttributionRow(
    container="cuda", device_id="GPU-1", gpu_uuid="GPU-1", sharing="exclusive", share_basis="exclusive",
    util_pct=50.0, fb_used_mib=1000.0, power_w=200.0, active=True, idle=False, first_seen_ms=1000,
    last_seen_ms=10_000, sources=("checkpoint", "podresources"), idle_since_ms=0, avg_util_pct=48.5,
    wasted_gpu_hours=0.0, gpu_fraction=1.0, sample_ms=10_000,
)
POD = PodAttribution(pod_uid="u1", namespace="ml", pod="train", node=NODE, rows=(ROW,), owner_kind="Job",
                     owner_name="train", phase="Running", created_ms=500, as_of_ms=10_000)
OWNER = Owner("u1", "ml", "train", "cuda", "GPU-1")
GPU = GpuState(node=NODE, gpu_uuid="GPU-1", model="A100", util_pct=50.0, fb_used_mib=1000.0,
               fb_total_mib=80_000.0, power_w=200.0, temp_c=60.0, owners=(OWNER,), sample_ms=10_000,
               as_of_ms=10_000)
MIG = MigState(uuid="MIG-1", profile="1g.10gb", gi=1, ci=0, fb_used_mib=100.0, util_pct=None)


def later(ms: int = 1000, **row: Any) -> PodAttribution:
    """POD one sample later (`ms` of event time), with row fields changed."""
    t = POD.as_of_ms + ms
    return replace(POD, as_of_ms=t, rows=(replace(ROW, last_seen_ms=t, sample_ms=t, **row),))


POD_CASES: list[tuple[str, PodAttribution, bool]] = [
    ("only the sample time advanced", later(), False),
    ("util +0.99", later(util_pct=50.99), False),
    ("util -1.0", later(util_pct=49.0), True),
    ("util 50.3 -> 49.3 (float noise)", replace(later(util_pct=49.3)), True),
    ("util to None", later(util_pct=None), True),
    ("avg +0.5", later(avg_util_pct=49.0), False),
    ("avg +1.0", later(avg_util_pct=49.5), True),
    ("avg to None", later(avg_util_pct=None), True),
    ("fb +0.5 MiB", later(fb_used_mib=1000.5), False),
    ("fb +1 MiB", later(fb_used_mib=1001.0), True),
    ("power +0.9 W", later(power_w=200.9), False),
    ("power -1 W", later(power_w=199.0), True),
    ("wasted +0.009 h", later(wasted_gpu_hours=0.009), False),
    ("wasted +0.01 h", later(wasted_gpu_hours=0.01), True),
    ("idle flag", later(idle=True), True),
    ("idle_since", later(idle_since_ms=5000), True),
    ("active flag", later(active=False), True),
    ("sources", later(sources=("checkpoint",)), True),
    ("sharing", later(sharing="time-slicing"), True),
    ("share basis", later(share_basis="equal-split"), True),
    ("gpu fraction", later(gpu_fraction=0.5), True),
    ("mig", later(mig=MigRef("MIG-1", "1g.10gb", 1, 0)), True),
    ("a window closed", later(windows=(WindowStat(0, 60, 3000.0, 60, 1000.0, 12_000.0),)), True),
    ("heartbeat not yet (4.999 s)", later(4999), False),
    ("heartbeat (5 s)", later(5000), True),
    ("phase", replace(later(), phase="Succeeded"), True),
    ("deleted", replace(later(), deleted_ms=10_500), True),
    ("owner", replace(later(), owner_kind="ReplicaSet"), True),
    ("a second row", replace(later(), rows=(ROW, replace(ROW, device_id="GPU-2"))), True),
]


@pytest.mark.parametrize(("what", "new", "published"), POD_CASES, ids=[c[0] for c in POD_CASES])
def test_pod_attribution_golden_table(what: str, new: PodAttribution, published: bool) -> None:
    base = replace(POD, rows=(replace(ROW, util_pct=50.3),)) if "float noise" in what else POD
    assert worth_publishing(base, new, CFG) is published


def gpu_later(ms: int = 1000, **changes: Any) -> GpuState:
    return replace(GPU, sample_ms=GPU.sample_ms + ms, as_of_ms=GPU.as_of_ms + ms, **changes)


GPU_CASES: list[tuple[str, GpuState, bool]] = [
    ("only the sample time advanced", gpu_later(), False),
    ("util +0.5", gpu_later(util_pct=50.5), False),
    ("util +1", gpu_later(util_pct=51.0), True),
    ("fb +1 MiB", gpu_later(fb_used_mib=1001.0), True),
    ("power +0.5 W", gpu_later(power_w=200.5), False),
    ("power +1 W", gpu_later(power_w=201.0), True),
    ("temp +0.9", gpu_later(temp_c=60.9), False),
    ("temp +1", gpu_later(temp_c=61.0), True),
    ("temp to None", gpu_later(temp_c=None), True),
    ("owners", gpu_later(owners=()), True),
    ("sharing", gpu_later(sharing="time-slicing"), True),
    ("last XID", gpu_later(last_xid=XidRef(79, 10_500)), True),
    ("lost", gpu_later(lost=True), True),
    ("fb total", gpu_later(fb_total_mib=40_000.0), True),
    ("a MIG device appears", gpu_later(mig_devices=(MIG,)), True),
    ("heartbeat (5 s)", gpu_later(5000), True),
]


@pytest.mark.parametrize(("what", "new", "published"), GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_gpu_state_golden_table(what: str, new: GpuState, published: bool) -> None:
    assert worth_publishing(GPU, new, CFG) is published


def test_mig_devices_compare_with_thresholds_and_their_owners_exactly() -> None:
    base = gpu_later(mig_devices=(MIG,))
    assert not worth_publishing(base, replace(base, as_of_ms=base.as_of_ms + 1,
                                              mig_devices=(replace(MIG, fb_used_mib=100.5),)), CFG)
    assert worth_publishing(base, replace(base, mig_devices=(replace(MIG, fb_used_mib=101.0),)), CFG)
    assert worth_publishing(base, replace(base, mig_devices=(replace(MIG, owners=(OWNER,)),)), CFG)


def test_first_output_of_a_key_is_always_published_and_heartbeat_zero_publishes_every_new_sample() -> None:
    assert worth_publishing(None, POD, CFG) and worth_publishing(None, GPU, CFG)
    every = ChangeConfig(heartbeat_ms=0)
    assert worth_publishing(POD, later(1), every) and not worth_publishing(POD, POD, every)


def test_carry_windows_keeps_every_window_of_held_back_outputs_once() -> None:
    w0, w1 = WindowStat(0, 60), WindowStat(60_000, 60)
    older = later(windows=(w0,))
    newer = later(2000, windows=(w1,))
    merged = carry_windows(older, newer)
    assert isinstance(merged, PodAttribution) and merged.rows[0].windows == (w0, w1)
    assert carry_windows(newer, newer) == newer  # a repeat is not doubled
    assert carry_windows(None, newer) is newer


# ---------------------------------------------------------------- through the engine


def setup(pods: int = 1) -> list[NodeInput]:
    return [inventory(gpus=pods), *(pod(n, f"p{n}", 0) for n in range(1, pods + 1)),
            alloc(S, *(pr("ml", f"p{n}", (gpu(n - 1),)) for n in range(1, pods + 1)))]


def sample(t_ms: int, util: float, n: int = 1) -> NodeInput:
    return tel(t_ms, *(dev(gpu(i), util, index=i, procs=(proc(10 + i, uid(i + 1), util, 100.0),))
                       for i in range(n)))



def pods_of(outs: list[Output], n: int = 1) -> list[PodAttribution]:
    return [o for o in outs if isinstance(o, PodAttribution) and o.pod_uid == uid(n)]


def test_heartbeat_fires_on_event_time_when_nothing_changes() -> None:
    cfg = EngineConfig(rows=RowConfig(window_ms=3_600_000), changes=ChangeConfig(heartbeat_ms=5 * S))
    # Samples every 2 s of event time, all alike: published at the first, then at the first sample at
    # least 5 s after the previous publication.
    _, outs = run([*setup(), *(sample(t * S, 40.0) for t in range(2, 30, 2))], cfg)
    assert [o.as_of_ms for o in pods_of(outs)] == [2 * S, 8 * S, 14 * S, 20 * S, 26 * S]
    gpus = [o.as_of_ms for o in outs if isinstance(o, GpuState)]
    assert gpus == [2 * S, 8 * S, 14 * S, 20 * S, 26 * S]
    # A change in between is published at once and restarts the heartbeat.
    _, outs = run([*setup(), *(sample(t * S, 40.0 if t != 10 else 60.0) for t in range(2, 30, 2))], cfg)
    assert [o.as_of_ms for o in pods_of(outs)] == [2 * S, 8 * S, 10 * S, 12 * S, 18 * S, 24 * S]


def test_a_slowly_drifting_number_is_published_once_it_moved_a_whole_threshold() -> None:
    cfg = EngineConfig(rows=RowConfig(window_ms=3_600_000), changes=ChangeConfig(heartbeat_ms=3_600_000))
    _, outs = run([*setup(), *(sample(t * S, 40.0 + 0.25 * t) for t in range(2, 20))], cfg)
    assert [o.rows[0].util_pct for o in pods_of(outs)] == [40.5, 41.5, 42.5, 43.5, 44.5]


def test_every_closed_window_is_published_exactly_once_in_order_over_a_long_run() -> None:
    cfg = EngineConfig(rows=RowConfig(window_ms=60 * S, idle_window_ms=600 * S))
    ticks = range(1, 2 * 3600)  # two hours of 1 s samples, utilization moving now and then
    state, outs = run([*setup(), *(sample(t * S, float(t // 97 % 50)) for t in ticks)], cfg)
    windows = [w for o in pods_of(outs) for w in o.rows[0].windows]
    starts = [w.start_ms for w in windows]
    assert starts == list(range(0, 7140 * S, 60 * S))  # every closed minute, once, oldest first
    assert [w.samples for w in windows] == [59] + [60] * 118  # the open minute is not published
    assert sum(w.util_samples for w in windows) + 60 == len(ticks)  # + the open minute
    assert all(o.as_of_ms >= w.start_ms + 60 * S for o in pods_of(outs) for w in o.rows[0].windows)
    # Bounded memory: the row keeps what idle detection needs (11 minutes) plus the open one.
    [row] = state.rows.values()
    assert len(row.windows) // W == 1 and len(row.idle_windows) // IW == 10  # the open one in full
    assert all(not r.windows for o in state.emitted.values() if isinstance(o, PodAttribution) for r in o.rows)
    # The pod goes away: its last window is published as closed with the inactive row.
    outs2 = []
    for e in [alloc(7200 * S), sample(7201 * S, 0.0)]:
        o = apply(state, e, cfg)
        outs2.extend(o)
    outs2.extend(flush(state, cfg))
    [gone] = pods_of(outs2)
    assert not gone.rows[0].active and [w.start_ms for w in gone.rows[0].windows] == [7140 * S]


def test_a_restored_state_publishes_exactly_what_the_uninterrupted_one_does() -> None:
    import json

    from periscope.core.snapshot import from_parts, to_parts

    cfg = EngineConfig(rows=RowConfig(window_ms=10 * S, idle_window_ms=60 * S))
    events = [*setup(2), *(sample(t * S, float(t % 7) * 0.4, n=2) for t in range(2, 120))]
    head, tail = events[:60], events[60:]
    state = new_state(NODE)
    for e in head:
        apply(state, e, cfg)
    node_part, pod_parts = to_parts(state)
    restored = from_parts(json.loads(json.dumps(node_part)), json.loads(json.dumps(pod_parts)))
    a: list[Output] = []
    b: list[Output] = []
    for e in tail:
        o1 = apply(state, e, cfg)
        o2 = apply(restored, e, cfg)
        a.extend(o1)
        b.extend(o2)
    assert a and a == b
    assert current_view(restored) == current_view(state)
