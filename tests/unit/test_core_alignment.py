"""Event-time alignment: while the host is behind, a node's samples and XIDs wait for its other streams.

The reference is event-time order, as replay feeds the core. "The same outputs" means the very same
list: every published record, its content and its order. That holds for any delivery that keeps each
stream's own order, with one documented exception the generators here avoid: fields the core keeps as
"latest known" rather than by time (a pod's phase and owner, the inventory's GPU models and MIG layout,
the node's labels) show what had been read when a sample was joined, which may be later than the sample.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from periscope.core.engine import (
    EngineConfig,
    NodeState,
    holdings_at,
    mark_inputs,
    new_state,
    step,
    waiting_for,
)
from periscope.core.model import Finding, GpuState, NodeInput, Output
from periscope.core.snapshot import from_parts, to_parts
from periscope.core.watermark import ALL_STREAMS, NEVER, Stream
from periscope.replay.runner import ReplayConfig, order_key, replay_events
from periscope.replay.synthetic import ClusterSpec, generate, node_name
from tests.unit.core_builders import NODE, alloc, dev, gpu, pod, pr, proc, tel, uid, xid
from tests.unit.core_builders import run as run_events
from tests.unit.core_delivery import by_stream, faust_order, feed, interleave
from tests.unit.test_core_properties import GPUS, S, state_events, with_samples

ALIGNED = EngineConfig(align=ALL_STREAMS)
UNALIGNED = EngineConfig()

# A churning node: 4 GPUs, each GPU's pod replaced (same name, new UID) every minute with a 5 s gap,
# an XID every 15 s on a rotating GPU, allocation snapshots every 5 s, telemetry every second.
CHURN = ClusterSpec(nodes=1, gpus_per_node=4, duration_ms=600_000, pod_lifetime_ms=60_000, gap_ms=5_000,
                    xid_every_ms=15_000, idle_every=0)

# Records per partition fetch. Equal counts: the sparse topics (XIDs, pods) run minutes ahead of the
# allocations. Many telemetry records per fetch (the allocation topic's records being larger, say):
# telemetry runs ahead of allocations and pods too.
EQUAL = dict.fromkeys(Stream, 20)
TELEMETRY_AHEAD = {**dict.fromkeys(Stream, 2), Stream.TELEMETRY: 60, Stream.XID: 20}


def churn_events() -> list[NodeInput]:
    return list(generate(CHURN))


def reference(events: list[NodeInput], config: EngineConfig = ALIGNED) -> tuple[NodeState, list[Output]]:
    """Event-time order, as replay feeds it."""
    result = replay_events(events, ReplayConfig(engine=config))
    [state] = result.states.values()
    return state, result.outputs


def xid_owners(outs: list[Output]) -> dict[str, tuple[str, ...]]:
    return {o.id: tuple(x.pod_uid for x in o.owners) for o in outs
            if isinstance(o, Finding) and o.kind == "xid-owner"}


def wrong_gpu_owners(outs: list[Output], truth: NodeState) -> list[GpuState]:
    """Published GPU records whose owners are not the holders at their sample time in `truth`."""
    def holders(g: GpuState) -> set[str]:
        return {h.pod_uid for h in holdings_at(truth, g.sample_ms) if h.device.gpu_uuid == g.gpu_uuid}
    return [g for g in outs if isinstance(g, GpuState) and {o.pod_uid for o in g.owners} != holders(g)]


@pytest.mark.parametrize("per_fetch", [EQUAL, TELEMETRY_AHEAD], ids=["equal-fetches", "telemetry-ahead"])
def test_without_alignment_a_lagging_delivery_names_the_previous_pod(per_fetch: dict[Stream, int]) -> None:
    """The bug, without Kafka: the same records in the order a lagging worker gets them (the scenario
    is sharp: the aligned test below would pass for nothing if this did not go wrong)."""
    events = churn_events()
    truth, ref = reference(events, UNALIGNED)
    _, outs = feed(faust_order(by_stream(events), per_fetch), UNALIGNED)
    got, want = xid_owners(outs), xid_owners(ref)
    assert got.keys() == want.keys() and len(want) == 39
    assert sum(got[k] != want[k] for k in want) >= 5
    if per_fetch is TELEMETRY_AHEAD:
        assert len(wrong_gpu_owners(outs, truth)) >= 50


@pytest.mark.parametrize("per_fetch", [EQUAL, TELEMETRY_AHEAD], ids=["equal-fetches", "telemetry-ahead"])
def test_aligned_core_gives_the_event_time_outputs_to_a_lagging_delivery(
        per_fetch: dict[Stream, int]) -> None:
    events = churn_events()
    truth, ref = reference(events)
    state, outs = feed(faust_order(by_stream(events), per_fetch), ALIGNED)
    assert xid_owners(outs) == xid_owners(ref)
    assert not wrong_gpu_owners(outs, truth)
    assert outs == ref
    assert state.counters.unaligned == 0 and state.counters.input_stalls == 0


def test_live_delivery_is_as_prompt_as_without_alignment() -> None:
    """No lag: every stream at its end, records arriving in event-time order. A sample is joined when
    its node's watermark passes it by the lateness, exactly as without alignment."""
    events = sorted(churn_events(), key=order_key)
    aligned, unaligned = new_state(node_name(0)), new_state(node_name(0))
    assert mark_inputs(aligned, ALIGNED, at_end=dict.fromkeys(Stream, True)) == []
    for ev in events:
        _, a = step(aligned, ev, ALIGNED)
        _, b = step(unaligned, ev, UNALIGNED)
        assert a == b
        assert aligned.processed_ms == unaligned.processed_ms


def test_a_stream_not_yet_read_holds_samples_and_xids_until_it_is_read_through_their_time() -> None:
    g = gpu(0)
    state = new_state(NODE)
    for ev in (pod(1, "a", 0), tel(S, dev(g, 50.0)), xid(1500, g), tel(2 * S, dev(g, 50.0)),
               tel(6 * S, dev(g, 50.0))):
        _, outs = step(state, ev, ALIGNED)
        assert outs == []  # no allocation snapshot read yet: nothing is joined
    assert [p.meta.time_ms for p in state.pending] == [S, 1500, 2 * S, 6 * S]
    assert Stream.ALLOCATIONS in waiting_for(state, ALIGNED)
    others = (Stream.PODS, Stream.XID, Stream.INVENTORY, Stream.NODES)
    assert mark_inputs(state, ALIGNED, at_end=dict.fromkeys(others, True)) == []
    assert waiting_for(state, ALIGNED) == (Stream.ALLOCATIONS,)
    # Read through 1 s: another record of that instant may still come, so the 1 s sample waits.
    assert step(state, alloc(S, pr("ml", "a", (g,))), ALIGNED)[1] == []
    _, outs = step(state, alloc(3 * S, pr("ml", "b", (g,))), ALIGNED)
    assert [p.meta.time_ms for p in state.pending] == [6 * S]
    [f] = [o for o in outs if isinstance(o, Finding) and o.kind == "xid-owner"]
    assert [o.pod_uid for o in f.owners] == [uid(1)]  # the holder at the error time, not later
    assert waiting_for(state, ALIGNED) == (Stream.ALLOCATIONS, Stream.TELEMETRY)
    # The host knows both partitions were read past 6 s (other nodes' records said so): the 6 s
    # sample now waits for the lateness only, as it would live.
    mark_inputs(state, ALIGNED, through_ms={Stream.ALLOCATIONS: 7 * S, Stream.TELEMETRY: 7 * S})
    assert waiting_for(state, ALIGNED) == ()
    assert [p.meta.time_ms for p in state.pending] == [6 * S]
    assert state.counters.unaligned == state.counters.input_stalls == 0


def test_a_silent_stream_stops_holding_after_the_limit_and_says_so() -> None:
    g = gpu(0)
    cfg = dataclasses.replace(ALIGNED, max_hold_ms=30 * S)
    state = new_state(NODE)
    mark_inputs(state, cfg, at_end=dict.fromkeys(
        (Stream.PODS, Stream.XID, Stream.INVENTORY, Stream.NODES, Stream.TELEMETRY), True))
    step(state, pod(1, "a", 0), cfg)
    step(state, alloc(S, pr("ml", "a", (g,))), cfg)
    joined = 0
    for t in range(2, 40):
        _, outs = step(state, tel(t * S, dev(g, 50.0, procs=(proc(1, uid(1), 50.0, 1.0),))), cfg)
        joined += bool(outs)
        if t * S - S <= 30 * S:
            assert state.processed_ms <= S and state.counters.input_stalls == 0
    # The allocation stream said nothing for more than 30 s of the node's event time: it no longer
    # holds the samples, which are joined with the lateness only, and counted as unaligned.
    assert state.counters.input_stalls == 1
    assert state.processed_ms == 38 * S and state.counters.unaligned == 38 - 1
    assert joined
    # It speaks again: the stall is over, and it holds again (the 45 s sample waits for it).
    step(state, alloc(40 * S, pr("ml", "a", (g,))), cfg)
    assert not state.inputs.is_stalled(Stream.ALLOCATIONS)
    step(state, tel(45 * S, dev(g, 50.0)), cfg)
    assert state.processed_ms == 39 * S and state.counters.unaligned == 37
    assert [p.meta.time_ms for p in state.pending] == [45 * S]
    assert state.counters.input_stalls == 1


# ---------------------------------------------------------------- properties over interleavings


def with_xids(events: list[NodeInput], times: list[int]) -> list[NodeInput]:
    return sorted([*events, *(xid(t, GPUS[t % len(GPUS)]) for t in times)], key=order_key)


@settings(max_examples=60, deadline=None)
@given(state_events(), st.lists(st.integers(1000, 61_000), max_size=6), st.data())
def test_any_interleaving_of_the_streams_gives_the_event_time_outputs(
        events: list[NodeInput], xid_times: list[int], data: st.DataObject) -> None:
    """Each stream in its producer's order, the streams interleaved anyhow, every stream declared at its
    end at some point after its last record: the very outputs of event-time order."""
    ordered = with_xids(with_samples(events), xid_times)
    streams = by_stream(ordered)
    choices = data.draw(st.lists(st.integers(0, 5), min_size=len(ordered), max_size=len(ordered)))
    late = data.draw(st.lists(st.integers(0, 30), max_size=6))
    _, ref = reference(ordered)
    _, outs = feed(interleave(streams, choices, late), ALIGNED)
    assert outs == ref


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([EQUAL, TELEMETRY_AHEAD, dict.fromkeys(Stream, 1), dict.fromkeys(Stream, 7)]),
       st.integers(0, 3))
def test_any_batch_size_of_a_lagging_worker_gives_the_event_time_outputs(
        per_fetch: dict[Stream, int], seed: int) -> None:
    spec = dataclasses.replace(CHURN, duration_ms=180_000, seed=seed)
    events = list(generate(spec))
    _, ref = reference(events)
    _, outs = feed(faust_order(by_stream(events), per_fetch), ALIGNED)
    assert outs == ref


def test_where_the_streams_were_read_to_survives_a_restart_but_the_hosts_word_does_not() -> None:
    g = gpu(0)
    cfg = dataclasses.replace(ALIGNED, max_hold_ms=10 * S)
    state = new_state(NODE)
    mark_inputs(state, cfg, at_end=dict.fromkeys((Stream.PODS, Stream.INVENTORY, Stream.NODES), True))
    for ev in (pod(1, "a", 0), alloc(S, pr("ml", "a", (g,)))):
        step(state, ev, cfg)
    for t in range(2, 20):
        step(state, tel(t * S, dev(g, 1.0)), cfg)
    assert state.inputs.is_stalled(Stream.XID) and state.counters.input_stalls == 2  # xid, allocations
    node_part, pod_parts = to_parts(state)
    restored = from_parts(json.loads(json.dumps(node_part)), json.loads(json.dumps(pod_parts)))
    assert restored.inputs.opened_ms == state.inputs.opened_ms
    for s in Stream:
        was, now = state.inputs, restored.inputs
        assert (now.through_ms(s), now.is_stalled(s)) == (was.through_ms(s), was.is_stalled(s))
        assert not now.is_at_end(s)  # after a restart the host says again where its partitions stand
    mark_inputs(restored, cfg, at_end=dict.fromkeys((Stream.PODS, Stream.INVENTORY, Stream.NODES), True))
    step(restored, tel(20 * S, dev(g, 1.0)), cfg)
    assert restored.counters.input_stalls == 2  # the stalls already counted are not counted again


def test_a_state_persisted_before_alignment_reads_every_stream_as_unread_since_its_watermark() -> None:
    state, _ = run_events([pod(1, "a", 0), alloc(S, pr("ml", "a", (gpu(0),))), tel(2 * S, dev(gpu(0), 1.0))])
    node_part, pod_parts = to_parts(state)
    del node_part["inputs"]
    restored = from_parts(node_part, pod_parts)
    assert restored.inputs.opened_ms == state.watermark_ms
    assert {restored.inputs.through_ms(s) for s in Stream} == {NEVER}


def test_a_late_xid_waits_for_the_allocations_too() -> None:
    """An XID older than the samples already joined (its stream was reported at its end, then the probe
    sent it late) is not joined against allocations not yet read through its time."""
    g = gpu(0)
    state = new_state(NODE)
    mark_inputs(state, ALIGNED, at_end=dict.fromkeys(ALL_STREAMS, True))
    for ev in (pod(1, "a", 0), pod(2, "b", 0), alloc(S, pr("ml", "a", (g,))),
               *(tel(t * S, dev(g, 1.0)) for t in range(2, 8))):
        step(state, ev, ALIGNED)
    assert state.processed_ms == 6 * S
    mark_inputs(state, ALIGNED, at_end={Stream.ALLOCATIONS: False})  # a backlog of allocations appeared
    _, outs = step(state, xid(4 * S, g), ALIGNED)
    assert outs == [] and [p.meta.time_ms for p in state.pending] == [4 * S, 7 * S]
    _, outs = step(state, alloc(3 * S, pr("ml", "b", (g,))), ALIGNED)
    assert outs == []  # read through 3 s only
    _, outs = step(state, alloc(5 * S, pr("ml", "b", (g,))), ALIGNED)
    [f] = [o for o in outs if isinstance(o, Finding)]
    assert [o.pod_uid for o in f.owners] == [uid(2)]  # b held the GPU from 3 s on
