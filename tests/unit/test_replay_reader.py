"""Which read events a replay feeds: independent of how far back the reading happened to start."""

from __future__ import annotations

from periscope.bus import topics as t
from periscope.core.model import NodeInput
from periscope.replay.plan import ReadPlan, select
from periscope.replay.reader import partition_for
from tests.unit.core_builders import alloc, dev, gpu, inventory, meta, pod, tel, xid

S = 1000
M = 60 * S
PLAN = ReadPlan(anchor_ms=100 * M, to_ms=130 * M, lookback_ms=60 * M)  # cut at 40 min


def times(events: list[NodeInput]) -> list[int]:
    return sorted(e.meta.time_ms for e in events)


def test_samples_only_from_the_anchor_to_the_end() -> None:
    read = [(t.TELEMETRY, tel(m * M, dev(gpu(0), 1.0))) for m in (99, 100, 130, 131)]
    read.append((t.XID, xid(115 * M, gpu(0))))
    assert times(select(read, PLAN)) == [100 * M, 115 * M, 130 * M]


def test_state_up_to_the_end_from_any_time() -> None:
    read = [(t.PODS, pod(1, "a", m * M)) for m in (0, 50, 131)]
    assert times(select(read, PLAN)) == [0, 50 * M]


def test_snapshots_in_the_lookback_and_the_last_one_before_it_when_none_covers_the_anchor() -> None:
    read = [(t.ALLOCATIONS, alloc(m * M)) for m in (10, 20, 70, 120, 140)]
    assert times(select(read, PLAN)) == [70 * M, 120 * M]  # 70 min covers the anchor
    read = [(t.ALLOCATIONS, alloc(m * M)) for m in (10, 20, 110)]
    assert times(select(read, PLAN)) == [20 * M, 110 * M]  # nothing in [cut, anchor]: keep the 20 min one
    read = [(t.INVENTORY, inventory(5 * M))]
    assert times(select(read, PLAN)) == [5 * M]


def test_the_last_snapshot_before_the_cut_is_chosen_per_node_and_topic() -> None:
    other = alloc(30 * M)
    other = type(other)(meta=meta(30 * M, node="gpu-b"), entries=())
    read: list[tuple[t.Topic, NodeInput]] = [(t.ALLOCATIONS, alloc(10 * M)), (t.ALLOCATIONS, other),
                                             (t.ALLOCATIONS, alloc(80 * M)), (t.INVENTORY, inventory(1 * M))]
    chosen = select(read, PLAN)
    assert sorted((e.meta.node, e.meta.time_ms) for e in chosen) == [
        ("gpu-a", 1 * M), ("gpu-a", 80 * M), ("gpu-b", 30 * M)]


def test_partition_for_matches_the_producer_partitioner() -> None:
    from aiokafka.partitioner import DefaultPartitioner

    parts = [0, 1, 2, 3]
    for name in ("gpu-a", "gpu-node-017", "n", ""):
        assert partition_for(name, 4) == DefaultPartitioner()(name.encode(), parts, parts)
