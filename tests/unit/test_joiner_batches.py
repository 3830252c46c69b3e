"""A batch of input records: stepped one by one, but its bookkeeping done once per node, and nothing
acknowledged before the persist that includes it (nor before the records read before it)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from dataclasses import replace
from typing import Any

from periscope.bus import codec
from periscope.bus.topics import TELEMETRY
from periscope.core.engine import EngineConfig
from services.joiner.delivery import OutputSender
from services.joiner.metrics import JoinerMetrics
from services.joiner.worker import Hooks, Joiner
from tests.unit.core_builders import dev, gpu, meta, tel
from tests.unit.joiner_io import Event, Msg, Table


def telemetry(node: str, t: int, offset: int, generation: int = 1) -> Event:
    ev = replace(tel(t, dev(gpu(0), 50.0), dev(gpu(1), 10.0)),
                 meta=meta(t, node=node, source=f"probe/{node}"))
    return Event(Msg(TELEMETRY.name, 0, offset, node.encode(), codec.encode(ev), generation))


async def test_a_batch_marks_once_per_node_and_acks_only_after_the_persist() -> None:
    nodes, pods, marks = Table(), Table(), Table()
    published: list[tuple[str, bytes, bytes]] = []
    acked: list[int] = []
    dead: list[str] = []

    async def send(records: list[tuple[str, bytes, bytes]]) -> list[Any]:
        published.extend(records)
        return []

    async def fail(e: BaseException) -> None:
        raise AssertionError(f"unexpected error: {e!r}")

    async def dead_letter(msg: Any, error: str) -> None:
        dead.append(error)

    async def ack(topic: str, partition: int, offset: int) -> None:
        acked.append(offset)

    sender = OutputSender(send, marks.fence, lambda topic, n: None, fail)
    metrics = JoinerMetrics()
    hooks = Hooks(dead_letter=dead_letter, on_error=fail, ack=ack, clock=lambda: 100.0,
                  current=lambda msg: getattr(msg, "generation_id", None) == 1)
    joiner = Joiner(config=EngineConfig(), persist_interval_s=3600.0, metrics=metrics, nodes=nodes, pods=pods,
                    marks=marks, sender=sender, hooks=hooks)
    running = asyncio.ensure_future(sender.run())
    try:
        batch = [telemetry(node, t, offset=i) for i, (t, node) in enumerate(
            (t, node) for t in (1000, 2000, 3000, 4000) for node in ("gpu-a", "gpu-b"))]
        stale = telemetry("gpu-a", 5000, offset=len(batch), generation=0)  # fetched before a rebalance
        garbage = Event(Msg(TELEMETRY.name, 0, 99, b"gpu-a", b"\xff not protobuf"))
        await joiner.handle_batch([*batch[:3], garbage, *batch[3:], stale])

        assert marks.writes == [b"gpu-a", b"gpu-b"]  # one mark per node of the batch, not per record
        # The bad record is dead-lettered and the others go on; it is acknowledged only behind the
        # records read before it on its partition, which wait for their persists.
        assert len(dead) == 1 and acked == []
        assert nodes.writes == []  # nothing acknowledged before a persist
        # Device samples joined: each node's newest tick still waits for the lateness.
        assert metrics.device_samples._value.get() == (len(batch) - 2) * 2  # type: ignore[attr-defined]
        assert joiner.processed == {(TELEMETRY.name, 0): len(batch) - 1}  # the stale record was skipped
        assert all(s.dirty and len(s.held) == 4 for s in joiner.slots.values())
        # What waits for a persist is each record's position, not the record (a worker catching up
        # holds hundreds of thousands of them): none is kept once the batch is done.
        gone = [weakref.ref(e) for e in (*batch, garbage, stale)]
        del batch[:], garbage, stale
        gc.collect()
        assert [r for r in gone if r() is not None] == []

        await joiner.shutdown()
        # Every applied record after its node's persist, and all in the order they were read.
        assert acked == [*range(3), 99, *range(3, 8)]
        assert sorted(nodes.writes) == [b"gpu-a", b"gpu-b"]
        assert published and len(dead) == 1
    finally:
        running.cancel()
