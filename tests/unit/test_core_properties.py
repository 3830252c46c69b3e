"""Properties of the pure core: duplicates, reordering and late events converge; names never leak UIDs."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from periscope.core.engine import EngineConfig, apply, current_view, flush, new_state
from periscope.core.model import NodeInput, Output, PodAttribution
from periscope.core.snapshot import from_parts, to_parts
from periscope.core.watermark import ALL_STREAMS
from tests.unit.core_builders import NODE, alloc, ck, dev, gpu, inventory, pod, pr, proc, tel, uid

S = 1000
GPUS = [gpu(i) for i in range(3)]


@st.composite
def state_events(draw: st.DrawFn) -> list[NodeInput]:
    """A random history of pods (with name reuse) and allocation snapshots over 60 s."""
    events: list[NodeInput] = [inventory(gpus=3)]
    n_pods = draw(st.integers(1, 6))
    lifetimes: dict[int, tuple[int, int]] = {}
    for n in range(1, n_pods + 1):
        name = draw(st.sampled_from(["a", "b", "c"]))  # few names: reuse is common
        start = draw(st.integers(0, 40)) * S
        end = 10**9
        events.append(pod(n, name, start))
        if draw(st.booleans()):
            end = start + draw(st.integers(1, 20)) * S
            events.append(pod(n, name, start, deleted_at=end))
        lifetimes[n] = (start, end)
    for t in sorted(draw(st.sets(st.integers(1, 60), min_size=1, max_size=8))):
        entries = []
        for g in GPUS:
            holder = draw(st.sampled_from(["none", "a", "b", "c"]))
            if holder != "none":
                entries.append(pr("ml", holder, (g,)))
            # The kubelet's checkpoint only ever names pods that exist (possibly not yet seen by us).
            alive = [n for n, (a, b) in lifetimes.items() if a <= t * S < b]
            if alive and draw(st.booleans()):
                entries.append(ck(uid(draw(st.sampled_from(alive))), (g,)))
        events.append(alloc(t * S, *entries))
    return events


def holdings_timeline(events: list[NodeInput]) -> list[tuple[str, ...]]:
    state = new_state(NODE)
    for e in events:
        apply(state, e)
    return [tuple(f"{h.pod_uid}|{h.container}|{h.device.device_id}|{h.sources}|{h.candidates}"
                  for h in state.holdings_at(t * S)) for t in range(0, 62)]


@settings(max_examples=60, deadline=None)
@given(state_events(), st.randoms(use_true_random=False), st.lists(st.integers(0, 100), max_size=10))
def test_state_events_converge_under_any_order_and_duplicates(
    events: list[NodeInput], rnd: object, dup_idx: list[int]
) -> None:
    shuffled = list(events) + [events[i % len(events)] for i in dup_idx]
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert holdings_timeline(shuffled) == holdings_timeline(events)
    assert allocation_runs(shuffled) == allocation_runs(events)  # the same history is kept, too


def allocation_runs(events: list[NodeInput]) -> list[tuple[object, ...]]:
    state = new_state(NODE)
    for e in events:
        apply(state, e)
    return [(a.meta.time_ms, a.entries, tuple(state.alloc_repeats.get((a.meta.time_ms, a.meta.epoch,
                                                                       a.meta.seq), ())))
            for a in state.allocs]


def with_samples(events: list[NodeInput]) -> list[NodeInput]:
    samples = [
        tel(t * S, *(dev(g, float((t * 7 + i * 13) % 100), index=i,
                         procs=(proc(100 + i, uid(1 + (t + i) % 3), 1.0, 1.0),)) for i, g in enumerate(GPUS)))
        for t in range(1, 62)
    ]
    return sorted([*events, *samples], key=lambda e: e.meta.time_ms)


def run_outputs(events: list[NodeInput]) -> list[Output]:
    state = new_state(NODE)
    outs: list[Output] = []
    for e in events:
        o = apply(state, e)
        outs.extend(o)
    outs.extend(flush(state))
    return outs


@settings(max_examples=40, deadline=None)
@given(state_events(), st.data())
def test_reordering_within_lateness_changes_no_output(events: list[NodeInput], data: st.DataObject) -> None:
    ordered = with_samples(events)
    lateness = EngineConfig().lateness_ms
    # Delay each event by a random amount below the lateness bound, then deliver in arrival order.
    delays = [data.draw(st.integers(0, lateness - 1)) for _ in ordered]
    arrival = [e for _, _, e in sorted(
        ((e.meta.time_ms + d, i, e) for i, (e, d) in enumerate(zip(ordered, delays, strict=True))),
        key=lambda x: (x[0], x[1]))]
    # Pod events carry apiserver times; deliver them early, as the watcher does.
    assert run_outputs(arrival) == run_outputs(ordered)


@settings(max_examples=40, deadline=None)
@given(state_events())
def test_a_reused_name_never_carries_the_old_uids_usage(events: list[NodeInput]) -> None:
    outs = run_outputs(with_samples(events))
    state = new_state(NODE)
    for e in events:
        apply(state, e)
    for o in outs:
        if not isinstance(o, PodAttribution):
            continue
        rec = state.pods.get(o.pod_uid)
        assert rec is not None
        for row in o.rows:
            if row.active and row.sample_ms:
                # Usage is attributed to a UID only while that very pod was alive.
                assert rec.alive_at(row.sample_ms), (o.pod_uid, row.sample_ms, rec.deleted_ms)
                assert o.pod == rec.info.name


@settings(max_examples=25, deadline=None)
@given(state_events(), st.integers(5, 55))
def test_state_survives_a_round_trip_through_its_persisted_form(events: list[NodeInput], cut: int) -> None:
    full = with_samples(events)
    head = [e for e in full if e.meta.time_ms <= cut * S]
    tail = [e for e in full if e.meta.time_ms > cut * S]
    state = new_state(NODE)
    for e in head:
        apply(state, e)
    node_part, pod_parts = to_parts(state)
    restored = from_parts(json.loads(json.dumps(node_part)), json.loads(json.dumps(pod_parts)))
    assert current_view(restored) == current_view(state)
    assert (restored.allocs, restored.alloc_repeats) == (state.allocs, state.alloc_repeats)
    a_out: list[Output] = []
    b_out: list[Output] = []
    for e in tail:
        o1 = apply(state, e)
        o2 = apply(restored, e)
        a_out.extend(o1)
        b_out.extend(o2)
    # After restart the first outputs may repeat (nothing was remembered as emitted); state must agree.
    assert current_view(restored) == current_view(state)
    assert a_out[-5:] == b_out[-5:] if a_out else True


def drifting_samples(deltas: list[float]) -> list[NodeInput]:
    """Samples whose utilization drifts by small steps, so that the change thresholds decide."""
    out: list[NodeInput] = []
    util = [30.0, 60.0, 5.0]
    for t, d in enumerate(deltas, start=1):
        util = [min(100.0, max(0.0, u + d * (i + 1))) for i, u in enumerate(util)]
        out.append(tel(t * S, *(dev(g, round(util[i], 2), index=i, fb=1000.0 + round(d * 3, 1),
                                    procs=(proc(100 + i, uid(1 + (t + i) % 3), util[i], 1.0),))
                                for i, g in enumerate(GPUS))))
    return out


@settings(max_examples=40, deadline=None)
@given(state_events(), st.lists(st.floats(-1.5, 1.5), min_size=20, max_size=60), st.data())
def test_the_change_rule_publishes_the_same_under_duplicates_and_reordering(
        events: list[NodeInput], deltas: list[float], data: st.DataObject) -> None:
    ordered = sorted([*events, *drifting_samples(deltas)], key=lambda e: e.meta.time_ms)
    lateness = EngineConfig().lateness_ms
    delays = [data.draw(st.integers(0, lateness - 1)) for _ in ordered]
    dups = data.draw(st.lists(st.integers(0, len(ordered) - 1), max_size=15))
    # Each event delayed below the lateness bound; some delivered a second time, as late as allowed.
    timed = [(e.meta.time_ms + d, i, e) for i, (e, d) in enumerate(zip(ordered, delays, strict=True))]
    timed += [(ordered[j].meta.time_ms + lateness - 1, len(ordered) + k, ordered[j])
              for k, j in enumerate(dups)]
    arrival = [e for _, _, e in sorted(timed, key=lambda x: (x[0], x[1]))]
    assert run_outputs(arrival) == run_outputs(ordered)


@settings(max_examples=25, deadline=None)
@given(state_events(), st.lists(st.floats(-1.5, 1.5), min_size=20, max_size=60), st.integers(3, 50))
def test_a_restored_state_publishes_what_the_uninterrupted_one_publishes(
        events: list[NodeInput], deltas: list[float], cut: int) -> None:
    full = sorted([*events, *drifting_samples(deltas)], key=lambda e: e.meta.time_ms)
    state = new_state(NODE)
    for e in (e for e in full if e.meta.time_ms <= cut * S):
        apply(state, e)
    node_part, pod_parts = to_parts(state)
    restored = from_parts(json.loads(json.dumps(node_part)), json.loads(json.dumps(pod_parts)))
    a_out: list[Output] = []
    b_out: list[Output] = []
    for e in (e for e in full if e.meta.time_ms > cut * S):
        o1 = apply(state, e)
        o2 = apply(restored, e)
        a_out.extend(o1)
        b_out.extend(o2)
    a_out.extend(flush(state))
    b_out.extend(flush(restored))
    assert a_out == b_out


def _replayed(full: list[NodeInput], cut: int, back: int, config: EngineConfig) -> tuple[
        list[Output], list[Output], list[Output], list[Output]]:
    """The uninterrupted run, and a run persisted after record `cut`, restored from its JSON, then fed
    again from record `cut - back` on (at-least-once: what a restarted joiner re-reads past its last
    committed offset). Returns (uninterrupted outputs after the cut, restored outputs, and each run's
    final view)."""
    state = new_state(NODE)
    for e in full[:cut]:
        apply(state, e, config)
    node_part, pod_parts = to_parts(state)
    restored = from_parts(json.loads(json.dumps(node_part)), json.loads(json.dumps(pod_parts)))
    a_out: list[Output] = []
    for e in full[cut:]:
        a_out.extend(apply(state, e, config))
    b_out: list[Output] = []
    for e in full[max(0, cut - back):]:
        b_out.extend(apply(restored, e, config))
    a_out.extend(flush(state, config))
    b_out.extend(flush(restored, config))
    return a_out, b_out, current_view(state), current_view(restored)


@settings(max_examples=40, deadline=None)
@given(state_events(), st.lists(st.floats(-1.5, 1.5), min_size=20, max_size=60), st.data())
def test_a_restored_state_fed_again_from_an_earlier_record_publishes_what_the_uninterrupted_one_does(
        events: list[NodeInput], deltas: list[float], data: st.DataObject) -> None:
    """Records between the last committed offset and the persist are read again on top of the state
    that already holds them: none may count twice in a window or an average, and none may go missing."""
    full = sorted([*events, *drifting_samples(deltas)], key=lambda e: e.meta.time_ms)
    cut = data.draw(st.integers(1, len(full) - 1))
    back = data.draw(st.integers(0, cut))
    # The joiner aligns its input streams by default; replay does not.
    config = EngineConfig(align=data.draw(st.sampled_from([frozenset(), ALL_STREAMS])))
    a_out, b_out, a_view, b_view = _replayed(full, cut, back, config)
    assert b_out == a_out
    assert b_view == a_view
