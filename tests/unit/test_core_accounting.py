"""GPU-hours accounting in the core (periscope.core.accounting): golden cases per sharing mode, the idle
booking, and properties: a GPU's parts never exceed the GPU, and a pod's numbers are its own."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from periscope.core.accounting import mig_share, split_shares
from periscope.core.engine import EngineConfig, NodeState
from periscope.core.gpuhours import Account, RowTally
from periscope.core.model import MigRef, NodeInput, Output, PodAttribution, WindowStat
from periscope.core.rows import RowConfig
from periscope.core.snapshot import from_parts, to_parts
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
RowKey = tuple[str, str, str]
CFG = EngineConfig(rows=RowConfig(window_ms=10 * S, idle_window_ms=20 * S, idle_threshold_pct=5.0))


def windows_of(state: NodeState, outs: list[Output]) -> dict[RowKey, list[WindowStat]]:
    """Every window of every row: as published (a repeat replaces its copy), then what the state still
    holds unpublished."""
    got: dict[RowKey, dict[int, WindowStat]] = {}
    for o in outs:
        if isinstance(o, PodAttribution):
            for r in o.rows:
                for w in r.windows:
                    got.setdefault((o.pod_uid, r.container, r.device_id), {})[w.start_ms] = w
    for key, row in state.rows.items():
        for w in row.unpublished():
            got.setdefault(key, {})[w.start_ms] = w
    return {k: [v[s] for s in sorted(v)] for k, v in got.items()}


def totals(state: NodeState, outs: list[Output]) -> dict[RowKey, Account]:
    out = {}
    for key, ws in windows_of(state, outs).items():
        tally = RowTally(-(2**62), 2**62)
        tally.add_all(ws)
        out[key] = tally.total()
    return out


def held(n: int, name: str, device: str, resource: str = "nvidia.com/gpu") -> tuple:
    return (ck(uid(n), (device,), resource=resource), pr("ml", name, (device,), resource=resource))


def one_gpu_run(util: float | list[float], seconds: int = 60, power: float = 200.0,
                fb: float = 2048.0) -> Account:
    utils = util if isinstance(util, list) else [util] * seconds
    events: list[NodeInput] = [inventory(0, gpus=1), pod(1, "train", 0), alloc(0, *held(1, "train", gpu(0)))]
    events += [tel(t * S, dev(gpu(0), u, fb=fb, power=power)) for t, u in enumerate(utils, 1)]
    state, outs = run(events, CFG)
    (acct,) = totals(state, outs).values()
    return acct


def test_a_whole_gpu_is_charged_one_gpu_per_hour_used_by_its_utilization() -> None:
    a = one_gpu_run(50.0, seconds=60, power=200.0, fb=2048.0)
    # The first sample of a node has no previous one: 59 gaps of 1 s are charged.
    assert a.gpu_ms == pytest.approx(59 * S)
    assert a.used_gpu_ms == pytest.approx(0.5 * 59 * S)
    assert a.request_gpu_ms == pytest.approx(59 * S)
    assert a.idle_gpu_ms == 0 and a.unmeasured_gpu_ms == 0
    assert a.fb_mib_ms == pytest.approx(2048 * 59 * S)
    assert a.energy_j == pytest.approx(200 * 59)  # 200 W for 59 s
    doc = a.to_json(priced=False)
    assert doc["allocated_gpu_hours"] == pytest.approx(59 / 3600, abs=1e-6)
    assert doc["memory_gib_hours"] == pytest.approx(2 * 59 / 3600, abs=1e-6)
    assert doc["efficiency"] == 0.5 and doc["cost"] is None


def test_a_gap_longer_than_the_limit_is_not_billed_as_seen() -> None:
    events: list[NodeInput] = [inventory(0, gpus=1), pod(1, "train", 0), alloc(0, *held(1, "train", gpu(0)))]
    events += [tel(1 * S, dev(gpu(0), 50.0)), tel(2 * S, dev(gpu(0), 50.0)), tel(300 * S, dev(gpu(0), 50.0))]
    state, outs = run(events, CFG)
    (a,) = totals(state, outs).values()
    assert a.gpu_ms == pytest.approx(1 * S + CFG.rows.charge_gap_ms)


def test_unknown_utilization_is_unmeasured_never_idle() -> None:
    a = one_gpu_run([None] * 40)  # type: ignore[list-item]
    assert a.unmeasured_gpu_ms == pytest.approx(a.gpu_ms) and a.gpu_ms > 0
    assert a.used_gpu_ms == 0 and a.idle_gpu_ms == 0
    assert a.to_json(priced=False)["efficiency"] is None


def test_idle_is_the_confirmed_below_threshold_run_from_its_first_sample() -> None:
    # Busy for 10 s, then 1 % for 50 s: the verdict needs the 20 s idle window, and then books the run
    # from its first sample (half of the second before it: the run began within it).
    a = one_gpu_run([80.0] * 10 + [1.0] * 50)
    assert a.idle_gpu_ms == pytest.approx(49.5 * S)
    assert a.gpu_ms == pytest.approx(59 * S)


def test_a_dip_shorter_than_the_idle_window_is_not_idle() -> None:
    a = one_gpu_run([80.0] * 20 + [1.0] * 10 + [80.0] * 30)
    assert a.idle_gpu_ms == 0


@pytest.mark.parametrize(("profile", "model", "share", "basis"), [
    ("3g.40gb", "NVIDIA A100-SXM4-80GB", 3 / 7, "mig-slices"),
    ("1g.10gb", "NVIDIA H100 80GB HBM3", 1 / 7, "mig-slices"),
    ("1g.24gb+me", "NVIDIA B200", 1 / 7, "mig-slices"),
    ("2g.12gb", "NVIDIA A30", 2 / 4, "mig-slices"),
    ("1c.3g.40gb", "NVIDIA A100-SXM4-80GB", 1 / 7, "mig-slices"),  # a compute instance of a 3g GI
    ("", "NVIDIA A100-SXM4-80GB", 0.125, "mig-memory"),  # unknown profile: the memory fraction
])
def test_a_mig_slice_is_its_compute_slices_of_the_parent(profile: str, model: str, share: float,
                                                       basis: str) -> None:
    assert mig_share(MigRef(uuid="MIG-x", profile=profile), model, 0.125) == (pytest.approx(share), basis)


def test_a_mig_slice_is_charged_its_share_and_its_power_part_of_the_parent() -> None:
    ref = MigRef(uuid=mig(1), profile="3g.40gb", gi=1, ci=0)
    layout = ((1, "3g.40gb", 1, 0, 40960.0),)
    events: list[NodeInput] = [inventory(0, gpus=1, migs=layout), pod(1, "train", 0),
                               alloc(0, *held(1, "train", mig(1), "nvidia.com/mig-3g.40gb"))]
    events += [tel(t * S, dev(gpu(0), None, power=280.0),
                   dev(mig(1), 60.0, power=None, parent=gpu(0), mig_ref=ref)) for t in range(1, 31)]
    state, outs = run(events, CFG)
    (a,) = totals(state, outs).values()
    assert a.gpu_ms == pytest.approx(3 / 7 * 29 * S)
    assert a.used_gpu_ms == pytest.approx(0.6 * 3 / 7 * 29 * S)  # 60 % of the slice
    assert a.energy_j == pytest.approx(280 * 3 / 7 * 29)
    assert a.request_gpu_ms == pytest.approx(29 * S)  # the baseline counts the slice as a GPU
    ws = windows_of(state, outs)
    assert {w.alloc_basis for w in next(iter(ws.values())) if w.gpu_ms} == {"mig-slices"}


def shared_run(utils: dict[int, float], replicas: int) -> dict[str, Account]:
    """Pods 1..n time-slicing GPU 0 (replicas advertised by the node's label), with per-process util."""
    replicas_label = node_labels(0, **{"nvidia.com/gpu.replicas": str(replicas)})
    events: list[NodeInput] = [inventory(0, gpus=1), replicas_label]
    entries = []
    for n in utils:
        events.append(pod(n, f"p{n}", 0))
        entries += held(n, f"p{n}", f"{gpu(0)}::{n - 1}")
    events.append(alloc(0, *entries))
    procs = tuple(proc(100 + n, uid(n), u, 500.0) for n, u in utils.items())
    events += [tel(t * S, dev(gpu(0), min(100.0, sum(utils.values())), procs=procs)) for t in range(1, 31)]
    state, outs = run(events, CFG)
    return {k[0]: a for k, a in totals(state, outs).items()}


def test_time_sliced_holders_pay_what_they_used_plus_an_equal_part_of_the_unused_time() -> None:
    got = shared_run({1: 30.0, 2: 20.0}, replicas=4)
    # 50 % unused, split four ways (replicas): 0.30 + 0.125 and 0.20 + 0.125 of the GPU.
    assert got[uid(1)].gpu_ms == pytest.approx(0.425 * 29 * S)
    assert got[uid(2)].gpu_ms == pytest.approx(0.325 * 29 * S)
    assert got[uid(1)].used_gpu_ms == pytest.approx(0.30 * 29 * S)
    assert got[uid(1)].request_gpu_ms == pytest.approx(29 * S)  # request x hours: a whole GPU each


def test_demand_above_the_gpu_splits_it_by_use() -> None:
    got = shared_run({1: 90.0, 2: 30.0}, replicas=2)
    assert got[uid(1)].gpu_ms == pytest.approx(0.75 * 29 * S)
    assert got[uid(2)].gpu_ms == pytest.approx(0.25 * 29 * S)
    # Each used all of its part, no more: the GPU is not used 1.2 times over.
    assert got[uid(1)].used_gpu_ms == pytest.approx(got[uid(1)].gpu_ms)
    assert got[uid(2)].used_gpu_ms == pytest.approx(got[uid(2)].gpu_ms)


def test_the_ledger_survives_the_persisted_state() -> None:
    events: list[NodeInput] = [inventory(0, gpus=1), pod(1, "train", 0), alloc(0, *held(1, "train", gpu(0)))]
    events += [tel(t * S, dev(gpu(0), 1.0)) for t in range(1, 36)]
    state, _ = run(events, CFG)
    node, pods = to_parts(state)
    back = from_parts(node, pods)
    for key, row in state.rows.items():
        again = back.rows[key]
        assert again.unpublished() == row.unpublished() and row.unpublished()[-1].gpu_ms > 0
        assert (again.low_gpu_ms, again.idle_booked) == (row.low_gpu_ms, row.idle_booked)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 4), st.lists(st.lists(st.one_of(st.none(), st.floats(0, 100)), min_size=1, max_size=4),
                                   min_size=1, max_size=5))
def test_split_shares_never_add_up_to_more_than_the_unit(replicas: int,
                                                         rounds: list[list[float | None]]) -> None:
    for utils in rounds:
        shares = split_shares(utils, replicas)
        assert all(s >= 0 for s in shares) and sum(shares) <= 1 + 1e-9


@st.composite
def shared_gpu(draw: st.DrawFn) -> list[NodeInput]:
    """Pods coming and going on the replicas of one time-sliced GPU and on a whole GPU, sampled at
    irregular times with random per-process utilization (lost samples and missing numbers too)."""
    replicas = draw(st.integers(1, 4))
    replicas_label = node_labels(0, **{"nvidia.com/gpu.replicas": str(replicas)})
    events: list[NodeInput] = [inventory(0, gpus=2), replicas_label]
    n_pods = draw(st.integers(1, 5))
    for n in range(1, n_pods + 1):
        events.append(pod(n, f"p{n}", 0))
    for t in sorted(draw(st.sets(st.integers(0, 50), min_size=1, max_size=5))):
        entries = []
        for r in range(replicas):
            holder = draw(st.integers(0, n_pods))
            if holder:
                entries += held(holder, f"p{holder}", f"{gpu(0)}::{r}")
        whole = draw(st.integers(0, n_pods))
        if whole:
            entries += held(whole, f"p{whole}", gpu(1))
        events.append(alloc(t * S, *entries))
    times = sorted(draw(st.sets(st.integers(1, 80), min_size=2, max_size=40)))
    for t in times:
        procs = tuple(proc(100 + n, uid(n), draw(st.one_of(st.none(), st.floats(0, 100))), 100.0)
                      for n in range(1, n_pods + 1) if draw(st.booleans()))
        events.append(tel(t * S, dev(gpu(0), draw(st.one_of(st.none(), st.floats(0, 100))), procs=procs),
                          dev(gpu(1), draw(st.floats(0, 100)), index=1)))
    return events


@settings(max_examples=60, deadline=None)
@given(shared_gpu())
def test_the_parts_of_one_gpu_never_add_up_to_more_than_the_gpus_own_hours(events: list[NodeInput]) -> None:
    state, outs = run(events, CFG)
    per_window: dict[tuple[str, int], float] = {}
    parts: dict[tuple[str, int], int] = {}
    for (_, _, device), ws in windows_of(state, outs).items():
        g = device.split("::")[0]
        for w in ws:
            per_window[(g, w.start_ms)] = per_window.get((g, w.start_ms), 0.0) + w.gpu_ms
            parts[(g, w.start_ms)] = parts.get((g, w.start_ms), 0) + 1
            assert w.used_gpu_ms <= w.gpu_ms + 1e-6
        # Idle is booked where the verdict is reached (its run may have begun in an earlier window);
        # each window's numbers are published to the µs of a GPU-ms.
        assert sum(w.idle_gpu_ms for w in ws) <= sum(w.gpu_ms for w in ws) + 0.001 * len(ws)
    times = sorted(e.meta.time_ms for e in events if type(e).__name__ == "NodeTelemetry")
    # The GPU's own time per window: the gaps charged to samples in it, and the part before its end of
    # a gap from a sample in it to one in a later window (split off to the earlier sample's window when
    # the row was charged there).
    seen: dict[int, float] = {}
    for a, b in itertools.pairwise(times):
        w0, wa = b - b % CFG.rows.window_ms, a - a % CFG.rows.window_ms
        dt = min(b - a, CFG.rows.charge_gap_ms)
        seen[w0] = seen.get(w0, 0.0) + dt
        if wa < w0:
            seen[wa] = seen.get(wa, 0.0) + max(0, w0 - (b - dt))
    total = sum(min(b - a, CFG.rows.charge_gap_ms) for a, b in itertools.pairwise(times))
    # Each part is published to the µs of a GPU-ms (up to 0.0005 over); adding them up in floats can
    # leave a last-digit excess beyond that (1000.0020000000001 for four parts of a 1000 ms window).
    float_sum = 1e-9
    for g in {g for g, _ in per_window}:
        n = sum(v for (h, _), v in parts.items() if h == g)
        assert sum(v for (h, _), v in per_window.items() if h == g) <= total + 0.0005 * n + float_sum
    for (g, start), charged in per_window.items():
        rounding = 0.0005 * parts[(g, start)]
        assert charged <= seen.get(start, 0.0) + rounding + float_sum, (start, charged, seen)


@settings(max_examples=40, deadline=None)
@given(st.integers(5, 40), st.lists(st.floats(0, 100), min_size=50, max_size=50), st.booleans())
def test_a_pods_numbers_are_unchanged_by_another_pod_reusing_its_name(
    stop: int, utils: list[float], same_device: bool
) -> None:
    """Pod 1 `worker-0` runs until `stop`; a later pod 2 of the same name (a StatefulSet restart) takes
    the same or another GPU. Pod 1's accounting is what it is without pod 2."""

    def history(with_reuse: bool) -> dict[str, Account]:
        events: list[NodeInput] = [inventory(0, gpus=2), pod(1, "worker-0", 0),
                                   pod(1, "worker-0", 0, deleted_at=stop * S)]
        events.append(alloc(0, *held(1, "worker-0", gpu(0))))
        target = gpu(0) if same_device else gpu(1)
        if with_reuse:
            events += [pod(2, "worker-0", stop * S), alloc(stop * S, *held(2, "worker-0", target))]
        else:
            events.append(alloc(stop * S))
        for t, u in enumerate(utils, 1):
            procs = (proc(101, uid(1), u, 100.0),) if t < stop else (proc(102, uid(2), 100 - u, 100.0),)
            events.append(tel(t * S, dev(gpu(0), u, procs=procs), dev(gpu(1), 100 - u, index=1)))
        state, outs = run(events, CFG)
        return {k[0]: a for k, a in totals(state, outs).items()}

    alone, reused = history(False), history(True)
    assert reused[uid(1)] == alone[uid(1)]
    assert uid(2) in reused and uid(2) not in alone


def lifetime_run(created: int, deleted: int = 0) -> Account:
    events: list[NodeInput] = [inventory(0, gpus=1), pod(1, "train", created)]
    if deleted:
        events.append(pod(1, "train", created, deleted_at=deleted))
    events.append(alloc(created, *held(1, "train", gpu(0))))
    events += [tel(t * S, dev(gpu(0), 50.0, power=100.0)) for t in range(1, 11)]
    events.sort(key=lambda e: e.meta.time_ms)
    state, outs = run(events, CFG)
    (a,) = totals(state, outs).values()
    return a


def test_a_pod_created_between_samples_is_not_charged_for_the_time_before_it() -> None:
    a = lifetime_run(created=2500)
    # First seen by the sample at 3 s, which charges only the half second since the pod's creation.
    assert a.gpu_ms == pytest.approx(7.5 * S) and a.request_gpu_ms == pytest.approx(7.5 * S)


def test_a_pod_deleted_between_samples_is_charged_up_to_its_deletion() -> None:
    a = lifetime_run(created=0, deleted=5500)
    # Samples at 2..5 s charge 4 s; the half second to the deletion is charged as last seen.
    assert a.gpu_ms == pytest.approx(4.5 * S) and a.used_gpu_ms == pytest.approx(0.5 * 4.5 * S)
    assert a.energy_j == pytest.approx(100 * 4.5)


def held_run(created: int, utils: list[float], deleted: int = 0, phase: int = 600) -> NodeState:
    """One pod on one GPU, sampled every second at `phase` ms past it (a probe out of step with the
    windows), from the second of its creation; the state after the run, and its outputs."""
    events: list[NodeInput] = [inventory(0, gpus=1), pod(1, "train", created)]
    if deleted:
        events.append(pod(1, "train", created, deleted_at=deleted))
    events.append(alloc(created, *held(1, "train", gpu(0))))
    first = created // S  # the node's sample before: the pod's first one then has a gap to charge
    events += [tel((first - 1 + i) * S + phase, dev(gpu(0), u)) for i, u in enumerate([0.0, *utils])]
    events.sort(key=lambda e: e.meta.time_ms)
    return run(events, CFG)  # type: ignore[return-value]


def test_a_run_that_starts_with_the_pod_is_idle_from_its_creation() -> None:
    # Created at 20 s, 2 % from its first sample (20.6 s) to its deletion at 45 s (the 45.6 s sample no
    # longer sees it): nothing before its first sample was observed busy, so the whole time it held the
    # GPU is idle, not half of its first gap.
    state, outs = held_run(20 * S, [2.0] * 26, deleted=45 * S)
    (a,) = totals(state, outs).values()
    assert a.gpu_ms == pytest.approx(25 * S)
    assert a.idle_gpu_ms == pytest.approx(25 * S)


def test_each_window_is_charged_the_time_within_it() -> None:
    # Created at 5 s, sampled at 5.6, 6.6, ... 29.6 s; windows are 10 s. A sample's gap that crosses a
    # window's start is split at it, so a period of whole windows counts exactly the time inside it.
    state, outs = held_run(5 * S, [50.0] * 25)
    ws = {w.start_ms: w for w in next(iter(windows_of(state, outs).values()))}
    assert ws[0].gpu_ms == pytest.approx(5 * S)  # 5 s .. 10 s, the last 0.4 s charged by the 10.6 s sample
    assert ws[10 * S].gpu_ms == pytest.approx(10 * S)
    assert ws[10 * S].used_gpu_ms == pytest.approx(5 * S)
    assert ws[10 * S].request_gpu_ms == pytest.approx(10 * S)


def test_an_idle_run_up_is_booked_where_confirmed_and_then_the_whole_hold_is_idle() -> None:
    # 1 % from creation at 5 s to the last sample at 29.6 s: the verdict (held 20 s) comes in the 20 s
    # window, which books the run-up; every allocated millisecond is then idle.
    state, outs = held_run(5 * S, [1.0] * 25)
    ws = {w.start_ms: w for w in next(iter(windows_of(state, outs).values()))}
    assert ws[0].idle_gpu_ms == 0 and ws[10 * S].idle_gpu_ms == 0  # before the verdict
    assert sum(w.gpu_ms for w in ws.values()) == pytest.approx(24.6 * S)
    assert sum(w.idle_gpu_ms for w in ws.values()) == pytest.approx(24.6 * S)


def test_the_only_holder_of_a_shared_gpu_is_charged_from_its_creation() -> None:
    # One time-sliced replica of GPU 0 held by a pod created at 2.5 s (sampled every second): nobody held
    # the GPU before, so its first sample charges the half second since its creation, as on a whole GPU.
    replicas_label = node_labels(0, **{"nvidia.com/gpu.replicas": "3"})
    events: list[NodeInput] = [inventory(0, gpus=1), replicas_label, pod(1, "p1", 2500),
                               alloc(2500, *held(1, "p1", f"{gpu(0)}::0"))]
    procs = (proc(101, uid(1), 30.0, 500.0),)
    events += [tel(t * S, dev(gpu(0), 30.0, procs=procs)) for t in range(1, 11)]
    events.sort(key=lambda e: e.meta.time_ms)
    state, outs = run(events, CFG)
    (a,) = totals(state, outs).values()
    assert a.gpu_ms == pytest.approx((0.3 + 0.7 / 3) * 7.5 * S)
    assert a.request_gpu_ms == pytest.approx(7.5 * S)
