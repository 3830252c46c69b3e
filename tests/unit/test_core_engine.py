"""The attribution engine, situation by situation: exclusive, time-slicing, MIG, reuse, XIDs, idle."""

from __future__ import annotations

from periscope.core.engine import EngineConfig, NodeState, apply, current_view, new_state
from periscope.core.model import DeviceSample, Finding, GpuState, MigRef, NodeInput, Output, PodAttribution
from periscope.core.rows import RowConfig
from tests.unit.core_builders import (
    NODE,
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
    xid,
)

S = 1000



def last_pod(outs: list[Output], pod_uid: str) -> PodAttribution:
    return [o for o in outs if isinstance(o, PodAttribution) and o.pod_uid == pod_uid][-1]


def last_gpu(outs: list[Output], gpu_uuid: str) -> GpuState:
    return [o for o in outs if isinstance(o, GpuState) and o.gpu_uuid == gpu_uuid][-1]


def findings(outs: list[Output], kind: str) -> list[Finding]:
    return [o for o in outs if isinstance(o, Finding) and o.kind == kind]


def test_exclusive_gpu_joins_podresources_and_checkpoint_on_uid() -> None:
    g = gpu(0)
    _, outs = run([
        inventory(), pod(1, "train-0", 0),
        alloc(1 * S, pr("ml", "train-0", (g,)), ck(uid(1), (g,))),
        tel(2 * S, dev(g, 85.0, fb=20000.0, power=300.0, procs=(proc(100, uid(1), 85.0, 20000.0),))),
    ])
    att = last_pod(outs, uid(1))
    assert (att.namespace, att.pod, att.node) == ("ml", "train-0", NODE)
    [row] = att.rows
    assert (row.gpu_uuid, row.device_id, row.sharing, row.share_basis) == (g, g, "exclusive", "exclusive")
    assert (row.util_pct, row.fb_used_mib, row.power_w) == (85.0, 20000.0, 300.0)
    assert row.sources == ("checkpoint", "podresources", "process")
    assert row.active and not row.idle
    assert last_gpu(outs, g).owners[0].pod_uid == uid(1)


def test_time_slicing_splits_by_process_and_flags_equal_split_without_process_data() -> None:
    g = gpu(0)
    base: list[NodeInput] = [
        inventory(), pod(1, "a", 0), pod(2, "b", 0), pod(3, "c", 0),
        alloc(S, pr("ml", "a", (f"{g}::0",)), pr("ml", "b", (f"{g}::1",)), pr("ml", "c", (f"{g}::2",))),
    ]
    procs = (proc(10, uid(1), 50.0, 4000.0), proc(11, uid(2), 20.0, 2000.0), proc(12, uid(2), 10.0, 1000.0))
    _, outs = run([*base, tel(2 * S, dev(g, 80.0, fb=7000.0, power=200.0, procs=procs))])
    a, b, c = (last_pod(outs, uid(n)).rows[0] for n in (1, 2, 3))
    assert {r.sharing for r in (a, b, c)} == {"time-slicing"}
    assert {r.share_basis for r in (a, b, c)} == {"process"}
    assert (a.util_pct, b.util_pct, c.util_pct) == (50.0, 30.0, 0.0)
    assert (a.fb_used_mib, b.fb_used_mib, c.fb_used_mib) == (4000.0, 3000.0, 0.0)
    assert a.power_w == 125.0 and b.power_w == 75.0 and c.power_w == 0.0
    assert "process" in a.sources and "process" not in c.sources

    no_util = tuple(proc(p.pid, p.pod_uid, None, p.used_mib) for p in procs)
    _, outs = run([*base, tel(2 * S, dev(g, 90.0, fb=7000.0, procs=no_util))])
    rows = [last_pod(outs, uid(n)).rows[0] for n in (1, 2, 3)]
    assert {r.share_basis for r in rows} == {"equal-split"}
    assert [r.util_pct for r in rows] == [30.0, 30.0, 30.0]
    assert [r.fb_used_mib for r in rows] == [4000.0, 3000.0, 0.0]  # memory is still per process


def test_mps_label_names_the_sharing_strategy() -> None:
    g = gpu(0)
    _, outs = run([
        inventory(), node_labels(0, **{"nvidia.com/gpu.sharing-strategy": "mps"}), pod(1, "a", 0),
        pod(2, "b", 0), alloc(S, pr("ml", "a", (f"{g}::0",)), pr("ml", "b", (f"{g}::1",))),
        tel(2 * S, dev(g, 40.0, procs=(proc(1, uid(1), 30.0, 10.0), proc(2, uid(2), 10.0, 10.0)))),
    ])
    assert last_pod(outs, uid(1)).rows[0].sharing == "mps"
    assert last_gpu(outs, g).sharing == "mps"


def test_mig_instance_resolves_to_parent_gpu_with_per_instance_memory_and_null_util() -> None:
    g, m = gpu(0), mig(1)
    ref = MigRef(uuid=m, profile="3g.40gb", gi=1, ci=0)
    _, outs = run([
        inventory(migs=((1, "3g.40gb", 1, 0, 40192.0),)), pod(1, "nb", 0),
        alloc(S, pr("ml", "nb", (m,), resource="nvidia.com/mig-3g.40gb"),
              ck(uid(1), (m,), resource="nvidia.com/mig-3g.40gb")),
        tel(2 * S, dev(g, None, fb=None, power=250.0),
            dev(m, None, fb=12000.0, power=None, parent=g, mig_ref=ref,
                procs=(proc(5, uid(1), None, 12000.0),))),
    ])
    [row] = last_pod(outs, uid(1)).rows
    assert row.gpu_uuid == g and row.mig == ref and row.sharing == "mig"
    assert row.util_pct is None and row.fb_used_mib == 12000.0 and row.power_w is None
    assert row.gpu_fraction == round(40192.0 / 81920.0, 4)
    state = last_gpu(outs, g)
    assert state.sharing == "mig" and state.mig_devices[0].owners[0].pod_uid == uid(1)


def test_reused_name_never_inherits_the_old_uid() -> None:
    g = gpu(0)
    _, outs = run([
        inventory(), pod(1, "web-0", 0),
        alloc(S, pr("ml", "web-0", (g,))),
        tel(2 * S, dev(g, 70.0, procs=(proc(1, uid(1), 70.0, 10.0),))),
        pod(1, "web-0", 0, deleted_at=3 * S), pod(2, "web-0", 4 * S),
        alloc(5 * S, pr("ml", "web-0", (g,))),
        tel(6 * S, dev(g, 10.0, procs=(proc(2, uid(2), 10.0, 10.0),))),
        tel(7 * S, dev(g, 12.0, procs=(proc(2, uid(2), 12.0, 10.0),))),
    ])
    old, new = last_pod(outs, uid(1)), last_pod(outs, uid(2))
    assert old.deleted_ms == 3 * S and not old.rows[0].active
    assert old.rows[0].last_seen_ms == 2 * S  # nothing after the reuse was attributed to the old UID
    assert new.rows[0].util_pct == 12.0 and new.rows[0].first_seen_ms == 6 * S


def test_two_live_pods_with_one_name_and_no_checkpoint_is_ambiguous_not_guessed() -> None:
    g = gpu(0)
    _, outs = run([
        inventory(), pod(1, "job", 0), pod(2, "job", S),
        alloc(2 * S, pr("ml", "job", (g,))), tel(3 * S, dev(g, 50.0)),
    ])
    assert not [o for o in outs if isinstance(o, PodAttribution)]
    [amb] = findings(outs, "ambiguous-join")
    assert {o.pod_uid for o in amb.owners} == {uid(1), uid(2)}
    # ...and the checkpoint settles it.
    _, outs = run([
        inventory(), pod(1, "job", 0), pod(2, "job", S),
        alloc(2 * S, pr("ml", "job", (g,)), ck(uid(2), (g,))), tel(3 * S, dev(g, 50.0)),
    ])
    assert last_pod(outs, uid(2)).rows[0].util_pct == 50.0
    assert not findings(outs, "ambiguous-join")


def test_xid_owners_are_the_owners_at_the_error_time() -> None:
    g = gpu(0)
    _, outs = run([
        inventory(), pod(1, "a", 0), pod(2, "b", 0),
        alloc(S, pr("ml", "a", (g,))), tel(2 * S, dev(g, 50.0)),
        xid(2500, g, 79),
        alloc(3 * S, pr("ml", "b", (g,))), tel(4 * S, dev(g, 50.0)),
    ])
    [f] = findings(outs, "xid-owner")
    assert f.xid_code == 79 and f.at_ms == 2500 and [o.pod_uid for o in f.owners] == [uid(1)]
    assert last_gpu(outs, g).last_xid is not None
    assert last_gpu(outs, g).owners[0].pod_uid == uid(2)


def test_late_xid_still_uses_history() -> None:
    g = gpu(0)
    state, _ = run([
        inventory(), pod(1, "a", 0), pod(2, "b", 0), alloc(S, pr("ml", "a", (g,))),
        tel(2 * S, dev(g, 1.0)), alloc(3 * S, pr("ml", "b", (g,))),
        *(tel(t * S, dev(g, 1.0)) for t in range(4, 9)),
    ])
    late = apply(state, xid(2 * S, g, 48))
    [f] = findings(late, "xid-owner")
    assert [o.pod_uid for o in f.owners] == [uid(1)]


def test_idle_pod_is_flagged_with_wasted_gpu_hours_and_busy_pod_is_not() -> None:
    cfg = EngineConfig(rows=RowConfig(window_ms=10 * S, idle_window_ms=60 * S, idle_threshold_pct=5.0))
    g0, g1 = gpu(0), gpu(1)
    events: list[NodeInput] = [
        inventory(), pod(1, "notebook", 0), pod(2, "train", 0),
        alloc(S, pr("ml", "notebook", (g0,)), pr("ml", "train", (g1,))),
    ]
    events += [tel(t * S, dev(g0, 1.0), dev(g1, 90.0, index=1)) for t in range(2, 200)]
    state, outs = run(events, cfg)
    nb, tr = last_pod(outs, uid(1)).rows[0], last_pod(outs, uid(2)).rows[0]
    assert nb.idle and not tr.idle
    assert nb.idle_since_ms == 2 * S
    # Published on change or heartbeat: the last record is as of its own sample, the state as of the last.
    assert nb.wasted_gpu_hours == round((nb.sample_ms - 2 * S) / 3_600_000, 6)
    now = last_pod(current_view(state), uid(1)).rows[0]
    assert now.sample_ms == 199 * S and now.wasted_gpu_hours == round((199 - 2) * S / 3_600_000, 6)
    assert nb.avg_util_pct == 1.0
    [f] = findings(outs, "idle")
    assert f.pod_uid == uid(1) and f.active


def test_idle_clears_when_work_resumes() -> None:
    cfg = EngineConfig(rows=RowConfig(window_ms=5 * S, idle_window_ms=20 * S))
    g = gpu(0)
    events: list[NodeInput] = [inventory(), pod(1, "nb", 0), alloc(S, pr("ml", "nb", (g,)))]
    events += [tel(t * S, dev(g, 0.0)) for t in range(2, 40)]
    events += [tel(t * S, dev(g, 95.0)) for t in range(40, 80)]
    _, outs = run(events, cfg)
    idle = findings(outs, "idle")
    assert [f.active for f in idle] == [True, False]
    assert not last_pod(outs, uid(1)).rows[0].idle


def test_process_of_a_pod_that_does_not_hold_the_gpu_is_unattributed() -> None:
    g0, g1 = gpu(0), gpu(1)
    _, outs = run([
        inventory(), pod(1, "a", 0), pod(2, "sneaky", 0), alloc(S, pr("ml", "a", (g0,))),
        tel(2 * S, dev(g0, 10.0, procs=(proc(1, uid(1), 10.0, 1.0), proc(7, uid(2), 5.0, 1.0))),
            dev(g1, 30.0, index=1, procs=(proc(9, "", 30.0, 1.0),))),
    ])
    un = {(f.gpu_uuid, f.pod_uid, f.pids) for f in findings(outs, "unattributed-usage")}
    assert un == {(g0, uid(2), (7,)), (g1, "", (9,))}


def test_checkpoint_alone_when_podresources_is_down_and_stale_entries_are_dropped() -> None:
    g0, g1 = gpu(0), gpu(1)
    _, outs = run([
        inventory(), pod(1, "a", 0), pod(3, "gone", 0, deleted_at=500),
        alloc(S, ck(uid(1), (g0,)), ck(uid(3), (g1,)), pr_state="unavailable"),
        tel(2 * S, dev(g0, 60.0), dev(g1, 0.0, index=1)),
    ])
    assert last_pod(outs, uid(1)).rows[0].sources == ("checkpoint",)
    assert not [o for o in outs if isinstance(o, PodAttribution) and o.pod_uid == uid(3)]


def test_an_unhealthy_source_is_a_finding_while_it_lasts_and_a_disabled_one_is_not() -> None:
    g0 = gpu(0)
    _, outs = run([
        inventory(), pod(1, "a", 0),
        alloc(S, ck(uid(1), (g0,)), pr_state="unavailable"),
        tel(2 * S, dev(g0, 60.0)),
        tel(3 * S, dev(g0, 60.0)),
        alloc(4 * S, pr("ml", "a", (g0,)), ck(uid(1), (g0,)), pr_state="disabled"),
        tel(5 * S, dev(g0, 60.0)),
    ])
    health = [o for o in outs if isinstance(o, Finding) and o.kind == "source-health"]
    # Raised once (not again on the next tick), cleared once the kubelet answers again.
    fid = f"source-health/{NODE}/podresources"
    assert [(f.active, f.at_ms, f.id) for f in health] == [(True, 2 * S, fid), (False, 5 * S, fid)]
    assert health[0].message == "podresources unavailable" and health[0].key == NODE


def test_sample_is_joined_against_allocation_as_of_its_own_time_despite_arrival_order() -> None:
    g = gpu(0)
    ordered: list[NodeInput] = [
        inventory(), pod(1, "a", 0), pod(2, "b", 0), alloc(S, pr("ml", "a", (g,))),
        tel(2 * S, dev(g, 10.0)), alloc(2500, pr("ml", "b", (g,))), tel(3 * S, dev(g, 20.0)),
    ]
    swapped = [*ordered[:4], ordered[5], ordered[4], ordered[6]]  # the b snapshot overtakes the 2 s sample
    _, o1 = run(ordered)
    _, o2 = run(swapped)
    assert o1 == o2
    assert last_pod(o1, uid(1)).rows[0].last_seen_ms == 2 * S


def test_duplicate_messages_change_nothing() -> None:
    g = gpu(0)
    evs: list[NodeInput] = [inventory(), pod(1, "a", 0), alloc(S, pr("ml", "a", (g,))),
                            *(tel(t * S, dev(g, float(t))) for t in range(2, 6))]
    _, once = run(evs)
    _, twice = run([e for e in evs for _ in (0, 1)])
    assert once == twice


def test_holdings_at_answers_for_any_past_time() -> None:
    g = gpu(0)
    state, _ = run([inventory(), pod(1, "a", 0), pod(2, "b", 0), alloc(S, pr("ml", "a", (g,))),
                    alloc(10 * S, pr("ml", "b", (g,))), tel(11 * S, dev(g, 1.0))])
    assert [h.pod_uid for h in state.holdings_at(5 * S)] == [uid(1)]
    assert [h.pod_uid for h in state.holdings_at(10 * S)] == [uid(2)]
    assert state.holdings_at(500) == []
    assert current_view(state)


def test_the_last_sample_is_persisted_without_its_processes_and_still_detects_duplicates() -> None:
    import json

    from periscope.core.snapshot import from_parts, to_parts

    g = gpu(0)
    last = tel(2 * S, dev(g, 85.0, fb=20000.0, procs=(proc(100, uid(1), 85.0, 20000.0),)))
    state, _ = run([inventory(), pod(1, "train-0", 0), alloc(1 * S, pr("ml", "train-0", (g,))), last])
    node_part, pod_parts = to_parts(state)
    assert node_part["last_telemetry"]["devices"][0]["processes"] == []
    restored = from_parts(json.loads(json.dumps(node_part)), json.loads(json.dumps(pod_parts)))
    assert restored.last_telemetry is not None and restored.last_telemetry.devices[0].processes == ()
    assert restored.last_telemetry.devices[0].util_pct == 85.0
    outs = apply(restored, last)
    assert outs == [] and restored.counters.duplicates == state.counters.duplicates + 1
    assert current_view(restored) == current_view(state)


def test_a_sample_is_joined_when_the_next_tick_arrives_even_a_few_ms_early() -> None:
    # Probes tick once a second, but each tick's clock reading jitters by a few ms: with the lateness at
    # exactly 1 s, a sample whose next tick read 999 ms later waited for a second tick (a quarter of the
    # samples in the freshness benchmark, 2 s old instead of 1 s when published).
    g = gpu(0)
    state = new_state(NODE)
    outs = [o for ev in (
        inventory(), pod(1, "train-0", 0), alloc(1 * S, pr("ml", "train-0", (g,)), ck(uid(1), (g,))),
        tel(2 * S, dev(g, 40.0, procs=(proc(100, uid(1), 40.0, 500.0),))),
        tel(3 * S - 3, dev(g, 60.0, procs=(proc(100, uid(1), 60.0, 500.0),))),
    ) for o in apply(state, ev)]
    assert last_gpu(outs, g).as_of_ms == 2 * S  # the first sample is out; the second waits for the next
    assert [p.meta.time_ms for p in state.pending] == [3 * S - 3]


def test_a_nodes_holdings_share_what_every_holding_repeats() -> None:
    """A worker keeps each node's holdings: the sources every holding of a device lists and the holders
    of a whole GPU (its unit's too) are one object each, not a copy per pod-device row."""
    g0, g1 = gpu(0), gpu(1)
    state, _ = run([
        inventory(), pod(1, "train-0", 0), pod(2, "train-1", 0),
        alloc(1 * S, pr("ml", "train-0", (g0,)), ck(uid(1), (g0,)), pr("ml", "train-1", (g1,)),
              ck(uid(2), (g1,))),
        tel(2 * S, dev(g0, 50.0), dev(g1, 60.0)),
    ])
    held = state.held_at(2 * S)
    a, b = held.holdings
    assert a.sources == b.sources == ("checkpoint", "podresources") and a.sources is b.sources
    ix = held.index
    for g in (g0, g1):
        assert [h.pod_uid for h in ix.by_gpu[g]] == [h.pod_uid for h in ix.by_instance[g][0]]
        assert ix.by_gpu[g] is ix.by_instance[g][0]


def _two_pods_a_gpu_each_sampled(sample0: DeviceSample, sample1: DeviceSample
                                 ) -> tuple[NodeState, list[Output]]:
    """train-0 on GPU 0 and train-1 on GPU 1, then one telemetry tick with the two samples."""
    g0, g1 = gpu(0), gpu(1)
    return run([
        inventory(), pod(1, "train-0", 0), pod(2, "train-1", 0),
        alloc(1 * S, pr("ml", "train-0", (g0,)), ck(uid(1), (g0,)), pr("ml", "train-1", (g1,)),
              ck(uid(2), (g1,))),
        tel(2 * S, sample0, sample1),
    ])


def test_a_rows_utilization_is_the_samples_own_number_unless_rounding_changes_it() -> None:
    """Rows keep the sample's utilization to three decimals; a whole percentage (what NVML reports,
    which the decoder shares between samples) is kept as the sample's own object, not a copy per row."""
    g0, g1 = gpu(0), gpu(1)
    whole, long = dev(g0, 85.0), dev(g1, 33.333333)
    state, outs = _two_pods_a_gpu_each_sampled(whole, long)
    util = {row.gpu_uuid: row.usage and row.usage.util_pct for row in state.rows.values()}
    assert util[g0] == 85.0 and util[g0] is whole.util_pct
    assert util[g1] == 33.333
    # The same rule for memory and power: a row keeps the sample's numbers, not copies of them.
    power = {row.gpu_uuid: row.usage and row.usage.power_w for row in state.rows.values()}
    assert power[g0] == 100.0 and power[g0] is whole.power_w
    assert [r.util_pct for r in last_pod(outs, uid(2)).rows] == [33.333]


def test_rows_holding_a_gpu_alone_share_what_their_last_sample_charged() -> None:
    """A row keeps its last charge rate for a deletion between samples; a whole GPU's (its share and
    basis) is one object for every row that holds one, and the power is the sample's own number."""
    from periscope.core.snapshot import from_parts, to_parts

    g0, g1 = gpu(0), gpu(1)
    a, b = dev(g0, 50.0), dev(g1, 60.0)
    state, _ = _two_pods_a_gpu_each_sampled(a, b)
    rows = {row.gpu_uuid: row for row in state.rows.values()}
    assert rows[g0].charged == rows[g1].charged == (1.0, "exclusive")
    assert rows[g0].charged is rows[g1].charged
    assert rows[g0].charged_power is a.power_w and rows[g1].charged_scale == 1.0
    back = {row.gpu_uuid: row for row in from_parts(*to_parts(state)).rows.values()}
    again = back[g0]
    assert (again.charged, again.charged_power, again.charged_scale) == ((1.0, "exclusive"), 100.0, 1.0)


def test_nodes_without_mig_share_their_empty_mig_tables() -> None:
    from periscope.core.devices import DeviceMap

    plain_a, plain_b = DeviceMap.from_inventory(inventory()), DeviceMap.from_inventory(inventory(gpus=4))
    assert plain_a.mig_by_uuid is plain_b.mig_by_uuid and not plain_a.mig_by_uuid
    assert plain_a.mig_memory is plain_b.mig_memory and not plain_b.mig_by_gi
    with_mig = DeviceMap.from_inventory(inventory(migs=((0, "1g.10gb", 1, 0, 9856.0),)))
    [(parent, ref)] = with_mig.mig_by_uuid.values()
    assert parent == gpu(0) and with_mig.mig_by_pos[(gpu(0), 1, 0)] == ref
    assert with_mig.mig_memory == {mig(0): 9856.0}
    assert not plain_a.mig_by_uuid  # building a MIG node's tables left the shared ones empty
