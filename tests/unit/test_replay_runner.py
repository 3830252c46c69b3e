"""replay_events: per-node event-time ordering, range limits, filters, and one bad event not ending it."""

from __future__ import annotations

import dataclasses
import random

from periscope.core.engine import EngineConfig, output_key
from periscope.core.model import Finding, GpuState, NodeInput, PodAttribution, PodEvent
from periscope.core.watermark import ALL_STREAMS
from periscope.replay.runner import (
    ReplayConfig,
    by_node,
    node_of,
    output_filter,
    output_time,
    replay_events,
)
from tests.unit.core_builders import NODE, gpu, node_labels, pod, uid
from tests.unit.test_replay_owners import reuse_scenario

S = 1000


def keyed(outputs: list[object]) -> list[tuple[str, int]]:
    return [(output_key(o), output_time(o)) for o in outputs]  # type: ignore[arg-type]


def test_arrival_order_does_not_change_the_outputs() -> None:
    events = reuse_scenario()
    in_order = replay_events(events)
    shuffled = list(events)
    random.Random(7).shuffle(shuffled)
    assert replay_events(shuffled).outputs == in_order.outputs
    assert in_order.outputs  # the scenario produces attribution, GPU states and findings
    kinds = {type(o) for o in in_order.outputs}
    assert kinds == {PodAttribution, GpuState, Finding}


def test_counts_what_it_fed_and_processed() -> None:
    result = replay_events(reuse_scenario())
    assert result.events == len(reuse_scenario())
    assert result.samples == 24 and result.device_samples == 48  # 24 ticks x 2 GPUs
    assert result.emitted == len(result.outputs) and result.failed == 0
    assert result.seconds > 0 and result.device_samples_per_s > 0
    assert list(result) == result.outputs and len(result) == len(result.outputs)


def test_from_keeps_later_outputs_only_but_state_is_warmed_by_earlier_events() -> None:
    full = replay_events(reuse_scenario())
    late = replay_events(reuse_scenario(), ReplayConfig(from_ms=70 * S))
    assert late.outputs and all(output_time(o) >= 70 * S for o in late.outputs)
    assert late.outputs == [o for o in full.outputs if output_time(o) >= 70 * S]


def test_to_stops_feeding_events() -> None:
    result = replay_events(reuse_scenario(), ReplayConfig(to_ms=40 * S))
    assert max(output_time(o) for o in result.outputs) <= 40 * S
    assert result.states[NODE].processed_ms <= 40 * S
    assert not [o for o in result.outputs if isinstance(o, PodAttribution) and o.pod_uid == uid(2)]


def test_latest_only_keeps_one_output_per_key_the_newest() -> None:
    full = replay_events(reuse_scenario())
    latest = replay_events(reuse_scenario(), ReplayConfig(latest_only=True))
    keys = [output_key(o) for o in latest.outputs]
    assert len(keys) == len(set(keys))
    newest = {output_key(o): o for o in full.outputs}
    assert sorted(keys) == sorted(newest) and all(newest[output_key(o)] == o for o in latest.outputs)


def test_filters_by_pod_gpu_and_node() -> None:
    outs = replay_events(reuse_scenario()).outputs
    mine = [o for o in outs if output_filter(pod_uid=uid(1))(o)]
    assert {type(o) for o in mine} == {PodAttribution, Finding}
    assert all(o.pod_uid == uid(1) or any(x.pod_uid == uid(1) for x in o.owners)  # type: ignore[union-attr]
               for o in mine)
    on_gpu1 = [o for o in outs if output_filter(gpu_uuid=gpu(1))(o)]
    assert {o.pod_uid for o in on_gpu1 if isinstance(o, PodAttribution)} == {uid(3)}
    assert {o.gpu_uuid for o in on_gpu1 if isinstance(o, GpuState)} == {gpu(1)}
    assert not [o for o in on_gpu1 if isinstance(o, Finding)]  # the XIDs were all on GPU0
    assert [o for o in outs if output_filter(node=NODE)(o)] == outs
    assert not [o for o in outs if output_filter(node="other")(o)]
    both = output_filter(pod_uid=uid(3), gpu_uuid=gpu(0))
    assert not [o for o in outs if both(o)]


def test_nodes_are_replayed_separately_and_unscheduled_pods_are_dropped() -> None:
    p = pod(9, "pending", 0)
    unscheduled = dataclasses.replace(p, meta=dataclasses.replace(p.meta, node=""),
                                      pod=dataclasses.replace(p.pod, node=""))
    groups = by_node([*reuse_scenario("b"), *reuse_scenario("a"), unscheduled])
    assert sorted(groups) == ["a", "b"]
    times = [e.meta.time_ms for e in groups["a"]]
    assert times == sorted(times)
    assert node_of(node_labels(0)) == NODE


def test_state_events_come_before_samples_of_the_same_instant() -> None:
    events = reuse_scenario()
    same = [e for e in by_node(events)[NODE] if e.meta.time_ms == 0]
    assert isinstance(same[0], PodEvent)


def test_an_event_the_core_cannot_take_is_skipped_and_counted() -> None:
    broken: NodeInput = dataclasses.replace(pod(5, "x", 3 * S), pod=None)  # type: ignore[arg-type]
    seen: list[str] = []
    result = replay_events([*reuse_scenario(), broken], on_error=lambda ev, e: seen.append(type(e).__name__))
    assert result.failed == 1 and len(seen) == 1
    assert result.outputs == replay_events(reuse_scenario()).outputs


def test_progress_is_told_every_event() -> None:
    told: list[int] = []
    replay_events(reuse_scenario(), progress=told.append)
    assert sum(told) == len(reuse_scenario())


def test_replay_with_the_cores_input_alignment_on_gives_the_same_outputs() -> None:
    """Replay feeds each node in event-time order: every stream is read through the event fed, so
    alignment holds nothing back (no stall, nothing counted as unaligned) and changes no output."""
    events = reuse_scenario()
    aligned = replay_events(events, ReplayConfig(engine=EngineConfig(align=ALL_STREAMS, max_hold_ms=1)))
    assert aligned.outputs == replay_events(events).outputs
    [state] = aligned.states.values()
    assert state.counters.input_stalls == state.counters.unaligned == 0
