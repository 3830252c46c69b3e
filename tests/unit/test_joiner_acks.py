"""Acknowledgements of one input partition go to Faust in offset order.

Faust commits the longest run of acknowledged offsets, but its gap check (`Consumer._new_offset`) lets
a run that starts one past the committed offset through: with offset C committed and C unacknowledged,
acknowledging C+1 commits C+2. The worker acknowledges a record once its node's persist is durable, so
nodes of one partition (or a dead-lettered record) finish out of order; in offset order, a commit never
passes a record whose state is not yet in the changelog. These tests feed the worker's acks to Faust's
own bookkeeping and take the partition over from what is durable at that moment."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import replace
from typing import Any

from faust.transport.consumer import Consumer
from intervaltree import IntervalTree

from periscope.bus import codec
from periscope.bus.topics import TELEMETRY
from periscope.core.engine import EngineConfig
from services.joiner.delivery import OutputSender
from services.joiner.metrics import JoinerMetrics
from services.joiner.worker import Hooks, Joiner
from tests.unit.core_builders import dev, gpu, meta, tel
from tests.unit.joiner_io import Event, Msg, Table

TP = (TELEMETRY.name, 0)


def telemetry(node: str, t: int, offset: int) -> Event:
    ev = replace(tel(t, dev(gpu(0), 50.0)), meta=meta(t, node=node, source=f"probe/{node}"))
    return Event(Msg(TELEMETRY.name, 0, offset, node.encode(), codec.encode(ev)))


class FaustOffsets:
    """Faust's commit bookkeeping for one consumer (its Consumer.ack test and its own _new_offset),
    positioned at a committed offset as after a rebalance."""

    def __init__(self, committed: int) -> None:
        self._acked: defaultdict[Any, list[int]] = defaultdict(list)
        self._acked_index: defaultdict[Any, set[int]] = defaultdict(set)
        self._gap: defaultdict[Any, IntervalTree] = defaultdict(IntervalTree)
        self._committed_offset: defaultdict[Any, int | None] = defaultdict(lambda: None)
        self._committed_offset[TP] = committed

    def ack(self, topic: str, partition: int, offset: int) -> None:
        tp = (topic, partition)
        committed = self._committed_offset[tp]
        if (committed is None or offset >= committed) and offset not in self._acked_index[tp]:
            self._acked_index[tp].add(offset)
            self._acked[tp].append(offset)

    def commit(self) -> int | None:
        offset = Consumer._new_offset(self, TP)  # type: ignore[arg-type]
        committed = self._committed_offset[TP]
        if offset is not None and (committed is None or offset > committed):
            self._committed_offset[TP] = offset
        return self._committed_offset[TP]


class SlowNodes(Table):
    """The nodes table, whose writes for `slow` keys reach the broker only when released."""

    def __init__(self, slow: bytes) -> None:
        super().__init__()
        self.slow = slow
        self.durable: dict[bytes, bytes] = {}
        self.release: asyncio.Future[None] | None = None

    def put(self, key: bytes, value: bytes, partition: int) -> asyncio.Future[None]:
        written = super().put(key, value, partition)
        if key != self.slow:
            self.durable[key] = value
            return written
        self.release = asyncio.get_running_loop().create_future()

        def landed(_: Any) -> None:
            self.durable[key] = value
        self.release.add_done_callback(landed)
        return self.release


def worker(nodes: Table, pods: Table, acked: list[Any], faust: FaustOffsets | None = None,
           persist_interval_s: float = 0.0) -> tuple[Joiner, OutputSender]:
    async def send(records: list[tuple[str, bytes, bytes]]) -> list[Any]:
        return []

    async def fail(e: BaseException) -> None:
        raise AssertionError(f"unexpected error: {e!r}")

    async def dead_letter(msg: Any, error: str) -> None:
        pass

    async def ack(topic: str, partition: int, offset: int) -> None:
        acked.append(offset)
        if faust is not None:
            faust.ack(topic, partition, offset)

    marks = Table()
    sender = OutputSender(send, marks.fence, lambda topic, n: None, fail)
    hooks = Hooks(dead_letter=dead_letter, on_error=fail, ack=ack, clock=lambda: 100.0)
    joiner = Joiner(config=EngineConfig(), persist_interval_s=persist_interval_s, metrics=JoinerMetrics(),
                    nodes=nodes, pods=pods, marks=marks, sender=sender, hooks=hooks)
    return joiner, sender


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_commit_never_passes_a_record_whose_node_is_not_yet_persisted() -> None:
    nodes, pods, faust, acked = SlowNodes(slow=b"gpu-a"), Table(), FaustOffsets(committed=0), []
    joiner, sender = worker(nodes, pods, acked, faust)
    running = asyncio.ensure_future(sender.run())
    try:
        # One partition, two nodes: gpu-a's sample first. Both persist at once; gpu-b's persist lands,
        # gpu-a's node record is still on its way to the broker.
        await joiner.handle_batch([telemetry("gpu-a", 1000, offset=0), telemetry("gpu-b", 1000, offset=1),
                                   telemetry("gpu-b", 2000, offset=2)])
        await settle()
        assert nodes.release is not None and not nodes.release.done()
        assert b"gpu-a" not in nodes.durable and b"gpu-b" in nodes.durable
        committed = faust.commit()
        # Taken over now (the worker killed), the partition resumes at `committed` on the durable state.
        restored = Table()
        restored.data = dict(nodes.durable)
        heir, heir_sender = worker(restored, pods, [])
        heir_running = asyncio.ensure_future(heir_sender.run())
        try:
            replay = [e for e in (telemetry("gpu-a", 1000, 0), telemetry("gpu-b", 1000, 1),
                                  telemetry("gpu-b", 2000, 2)) if e.message.offset >= (committed or 0)]
            await heir.handle_batch(replay)
            lost = f"gpu-a's sample (offset 0) is lost: committed {committed}, acked {acked}"
            assert heir.slots.get("gpu-a") is not None, lost
        finally:
            heir_running.cancel()
        assert committed == 0

        nodes.release.set_result(None)  # gpu-a's state is durable: everything may be committed
        await settle()
        assert sorted(acked) == [0, 1, 2] and faust.commit() == 3
    finally:
        running.cancel()


async def test_a_dead_lettered_record_is_acknowledged_after_the_held_records_before_it() -> None:
    nodes, pods, acked = Table(), Table(), []
    joiner, sender = worker(nodes, pods, acked, persist_interval_s=3600.0)
    running = asyncio.ensure_future(sender.run())
    try:
        garbage = Event(Msg(TELEMETRY.name, 0, 1, b"gpu-a", b"\xff not protobuf"))
        await joiner.handle_batch([telemetry("gpu-a", 1000, offset=0), garbage,
                                   telemetry("gpu-a", 2000, offset=2)])
        assert acked == []  # offset 0 waits for its persist, and offset 1 behind it
        await joiner.shutdown()
        assert acked == [0, 1, 2]
    finally:
        running.cancel()


async def test_a_persist_that_lands_after_a_rebalance_acknowledges_nothing() -> None:
    nodes, pods, acked = SlowNodes(slow=b"gpu-a"), Table(), []
    joiner, sender = worker(nodes, pods, acked)
    running = asyncio.ensure_future(sender.run())
    try:
        await joiner.handle_batch([telemetry("gpu-a", 1000, offset=0)])
        await settle()
        assert nodes.release is not None
        joiner.on_rebalance()  # the partition is re-read from its committed offset by whoever owns it now
        nodes.release.set_result(None)
        await settle()
        assert acked == []  # acks of the old assignment would mix with the new one's in Faust's bookkeeping
    finally:
        running.cancel()


async def test_a_node_is_not_quiet_while_its_telemetry_waits_on_the_broker() -> None:
    """A worker that lags (just took the node over, or stalled) has not seen the node's samples for a
    while, but they are on the broker: releasing the held ones would make those late, and drop them."""
    now, end = [100.0], [10]  # telemetry's end on the broker: records wait beyond what was read

    async def send(records: list[tuple[str, bytes, bytes]]) -> list[Any]:
        return []

    async def fail(e: BaseException) -> None:
        raise AssertionError(f"unexpected error: {e!r}")

    async def dead_letter(msg: Any, error: str) -> None:
        pass

    marks = Table()
    sender = OutputSender(send, marks.fence, lambda topic, n: None, fail)
    hooks = Hooks(dead_letter=dead_letter, on_error=fail, clock=lambda: now[0],
                  end_of=lambda topic, partition: end[0] if topic == TELEMETRY.name else None)
    joiner = Joiner(config=EngineConfig(), persist_interval_s=3600.0, metrics=JoinerMetrics(), nodes=Table(),
                    pods=Table(), marks=marks, sender=sender, hooks=hooks)
    running = asyncio.ensure_future(sender.run())
    try:
        await joiner.handle_batch([telemetry("gpu-a", 1000, offset=0)])
        state = joiner.slots["gpu-a"].state
        assert state.pending  # held for the lateness
        now[0] += 60.0  # a minute without a sample of gpu-a reaching this worker
        joiner.tick()
        assert state.pending, "released while gpu-a's next samples wait on the broker"
        await joiner.handle_batch([telemetry("gpu-a", 1500, offset=1)])
        assert state.counters.late_dropped == 0
        end[0] = 2  # read through (offsets 0 and 1): now gpu-a is quiet, and its samples are released
        now[0] += 60.0
        joiner.tick()
        assert not state.pending and state.counters.device_samples == 2
    finally:
        running.cancel()


class SlowFence(Table):
    """The pods table, whose fences reach the broker only when released."""

    def __init__(self) -> None:
        super().__init__()
        self.release: asyncio.Future[None] | None = None

    def fence(self, partition: int) -> asyncio.Future[None]:
        self.release = asyncio.get_running_loop().create_future()
        return self.release


async def test_a_revocation_waits_for_the_state_writes_under_way() -> None:
    """Pod records written by a persist under way must reach the changelog before the partition's next
    owner reads it; the persist itself ends at its epoch check, acknowledging nothing."""
    nodes, pods, acked = Table(), SlowFence(), []
    joiner, sender = worker(nodes, pods, acked)
    running = asyncio.ensure_future(sender.run())
    try:
        await joiner.handle_batch([telemetry("gpu-a", 1000, offset=0)])
        await settle()
        assert pods.release is not None
        revoked = asyncio.ensure_future(joiner.on_revoked(timeout_s=30.0))
        await settle()
        assert not revoked.done(), "revocation went on while a persist was writing"
        pods.release.set_result(None)
        await asyncio.wait_for(revoked, 5.0)
        assert acked == [] and b"gpu-a" not in nodes.data
    finally:
        running.cancel()


async def test_a_batch_that_arrives_during_a_revocation_is_left_for_the_partition_owner() -> None:
    nodes, pods, acked = Table(), Table(), []
    joiner, _ = worker(nodes, pods, acked)
    await joiner.on_revoked(timeout_s=1.0)
    await joiner.handle_batch([telemetry("gpu-a", 1000, offset=0)])  # taken before the revocation
    await settle()
    assert joiner.slots == {} and joiner.processed == {} and acked == [] and nodes.writes == []
    joiner.on_assigned()  # what comes now was fetched for the new assignment
    await joiner.handle_batch([telemetry("gpu-a", 1000, offset=0)])
    assert "gpu-a" in joiner.slots and joiner.processed == {TP: 0}
