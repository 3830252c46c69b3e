"""Periodic persists are spread over the interval by node: nodes that started together do not all
persist (and hold up every output behind them) in the same batch; and a node persists at most once per
interval of its own event time, so a worker catching up on many nodes does not persist each more often
per sample the slower it goes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from periscope.bus import codec
from periscope.bus.topics import TELEMETRY
from periscope.core.engine import EngineConfig, new_state
from services.joiner.acks import Held
from services.joiner.catchup import CATCH_UP_WAIT_S
from services.joiner.delivery import OutputSender
from services.joiner.metrics import JoinerMetrics
from services.joiner.slots import CATCH_UP_SPACING, EVENT_TIME_WAIT, Slot, next_persist, periodic_due
from services.joiner.worker import SLOW_PERSIST_S, Hooks, Joiner
from tests.unit.core_builders import dev, gpu, meta, tel
from tests.unit.joiner_io import Event, Msg, Table

NODES = [f"gpu-node-{i:05d}" for i in range(100)]


@pytest.mark.parametrize("now", [0.0, 3.25, 1_000_000.5])
@pytest.mark.parametrize("interval", [1.0, 5.0, 60.0])
def test_the_next_persist_is_within_the_interval_on_the_node_s_own_grid(now: float, interval: float) -> None:
    for node in NODES:
        due = next_persist(node, now, interval)
        assert now < due <= now + interval
        # On a grid: a persist at the due time or a little after it keeps the node's phase (no drift).
        assert next_persist(node, due, interval) == pytest.approx(due + interval)
        assert next_persist(node, due + interval / 10, interval) == pytest.approx(due + interval)


def test_nodes_that_start_together_fall_due_in_every_second_of_the_interval() -> None:
    seconds = Counter(int(next_persist(node, 100.0, 5.0) - 100.0) for node in NODES)
    assert set(seconds) == {0, 1, 2, 3, 4}
    assert min(seconds.values()) >= 10  # of 100: roughly a fifth each


def test_no_interval_persists_at_once() -> None:
    assert next_persist("gpu-a", 42.0, 0.0) == 42.0


def _slot(processed_ms: int, persisted_ms: int, persist_started: float, persist_due: float,
          catching: bool = False) -> Slot:
    state = new_state("gpu-a")
    state.processed_ms = processed_ms
    return Slot(node="gpu-a", partition=0, state=state, held=Held(0), seq=1, versions={}, mark_ms=0,
                replay_until_ms=0, recovered_ms=0, persisted_ms=persisted_ms, persist_started=persist_started,
                persist_due=persist_due, catching=catching)


@pytest.mark.parametrize(("now", "moved_ms", "due"), [
    (104.9, 10_000, False),  # not yet due on the clock
    (105.0, 5_000, True),  # due on both clocks: live
    (105.0, 4_999, False),  # the node's samples moved less than the interval: it waits for them
    (129.9, 0, False),
    (130.0, 0, True),  # its event time stood still for EVENT_TIME_WAIT intervals on the clock
])
def test_a_periodic_persist_waits_for_the_interval_on_the_clock_and_in_event_time(
        now: float, moved_ms: int, due: bool) -> None:
    assert EVENT_TIME_WAIT * 5.0 == 30.0  # (the cases' last persist started at 100.0)
    slot = _slot(1_000_000 + moved_ms, 1_000_000, persist_started=100.0, persist_due=105.0)
    assert periodic_due(slot, now, 5.0) is due


@pytest.mark.parametrize(("now", "moved_ms", "due"), [
    (105.0, 5_000, False),  # live it would be due: catching up, it waits for CATCH_UP_SPACING intervals
    (105.0, 29_999, False),
    (105.0, 30_000, True),
    (129.9, 0, False),
    (130.0, 0, False),  # nor does a node whose event time stands still persist after 6 intervals then
    (279.9, 0, False),
    (280.0, 0, True),  # but after 6 times as long
])
def test_a_node_being_caught_up_on_persists_catch_up_spacing_times_less_often(
        now: float, moved_ms: int, due: bool) -> None:
    assert CATCH_UP_SPACING * 5.0 == 30.0
    slot = _slot(1_000_000 + moved_ms, 1_000_000, persist_started=100.0, persist_due=105.0, catching=True)
    assert periodic_due(slot, now, 5.0) is due


def test_a_node_with_nothing_processed_at_its_last_persist_counts_its_event_time_from_its_first_record(
        ) -> None:
    # Not from zero: the samples the event-time alignment releases after a new node's first persist would
    # make it due again at once (a second persist of every node a worker catches up on).
    slot = _slot(1_790_000_004_999, 0, persist_started=100.0, persist_due=105.0)
    slot.state.inputs.opened_ms = 1_790_000_000_000
    assert not periodic_due(slot, 105.0, 5.0)
    slot.state.processed_ms += 1
    assert periodic_due(slot, 105.0, 5.0)


def test_without_an_interval_every_batch_persists() -> None:
    assert periodic_due(_slot(1_000_000, 1_000_000, persist_started=100.0, persist_due=100.0), 100.0, 0.0)


def _record(node: str, t_ms: int, offset: int, waited_s: float | None = None) -> Event:
    """A telemetry record of `node`; `waited_s`: how long ago the broker stamped it (None: no stamp)."""
    ev = replace(tel(t_ms, dev(gpu(0), 50.0)), meta=meta(t_ms, node=node, source=f"probe/{node}"))
    stamped = None if waited_s is None else time.time() - waited_s
    return Event(Msg(TELEMETRY.name, 0, offset, node.encode(), codec.encode(ev), timestamp=stamped))


def _joiner(nodes: Table, clock: list[float], persist_interval_s: float,
            ends: dict[str, int] | None = None) -> tuple[Joiner, OutputSender]:
    """A worker over in-memory tables whose outputs go nowhere; any error or dead letter fails the test."""
    async def send(records: list[Any]) -> list[Any]:
        return []

    async def fail(e: BaseException) -> None:
        raise AssertionError(f"unexpected error: {e!r}")

    async def no_dead_letter(msg: Any, error: str) -> None:
        raise AssertionError(error)

    marks = Table()
    sender = OutputSender(send, marks.fence, lambda topic, n: None, fail)
    joiner = Joiner(config=EngineConfig(), persist_interval_s=persist_interval_s, metrics=JoinerMetrics(),
                    nodes=nodes, pods=Table(), marks=marks, sender=sender,
                    hooks=Hooks(dead_letter=no_dead_letter, on_error=fail, clock=lambda: clock[0],
                                end_of=lambda topic, partition: (ends or {}).get(topic)))
    return joiner, sender


@contextlib.asynccontextmanager
async def _running(interval_s: float, ends: dict[str, int] | None = None
                   ) -> AsyncIterator[tuple[Joiner, Table, list[float]]]:
    """A worker as `_joiner` makes it, its sender running; its clock starts at 100 s. `ends`: the input
    partitions' end offsets by topic (else not known)."""
    nodes, clock = Table(), [100.0]
    joiner, sender = _joiner(nodes, clock, interval_s, ends)
    running = asyncio.ensure_future(sender.run())
    try:
        yield joiner, nodes, clock
    finally:
        running.cancel()


async def _at(second: int, joiner: Joiner, clock: list[float], batch: list[Event]) -> None:
    """Hand `batch` over `second` seconds after the start, and wait for the persists it started."""
    clock[0] = 100.0 + second
    await joiner.handle_batch(batch)
    await joiner.settle()


async def test_a_hundred_nodes_started_together_persist_a_few_per_batch() -> None:
    async with _running(5.0) as (joiner, nodes, clock):
        offset, per_batch = 0, []
        for second in range(11):  # every node sends a sample a second, all in one batch
            batch = []
            for node in NODES:
                batch.append(_record(node, 1_000_000 + second * 1000, offset))
                offset += 1
            before = len(nodes.writes)
            await _at(second, joiner, clock, batch)
            per_batch.append(len(nodes.writes) - before)
        # Every node persisted about every 5 s, but never all of them in the same batch.
        assert sum(per_batch) >= 2 * len(NODES)
        assert max(per_batch) <= len(NODES) // 3, per_batch


async def test_a_node_behind_the_clock_persists_once_per_interval_of_its_samples() -> None:
    """Catching up on many nodes, each node's samples come at a fifth of the clock's pace: it persists
    once per 5 s of samples (and at its first), not once per 5 s of the clock."""
    async with _running(5.0) as (joiner, nodes, clock):
        for second in range(100):  # 100 s on the clock, 20 s of the node's samples
            await _at(second, joiner, clock, [_record("gpu-a", 1_000_000 + second * 200, second)])
        assert 4 <= len(nodes.writes) <= 5, len(nodes.writes)  # by the clock alone: 20
        # Live, the same node persists once per 5 s of both.
        for second in range(100, 120):
            await _at(second, joiner, clock, [_record("gpu-a", 1_000_000 + second * 1000, second)])
        assert 8 <= len(nodes.writes) <= 10, len(nodes.writes)


async def test_a_node_the_worker_catches_up_on_persists_once_per_catch_up_spacing_intervals_of_samples(
        ) -> None:
    """Its records waited on the broker: the worker is catching up on it, and persists it once per 30 s
    of its samples (5 s intervals), counted from its first; once its records come as they are written,
    every 5 s again."""
    async with _running(5.0) as (joiner, nodes, clock):
        for second in range(130):  # 130 s on the clock, 78 s of the node's samples, all read late
            await _at(second, joiner, clock,
                      [_record("gpu-a", 1_000_000 + second * 600, second, waited_s=10 * CATCH_UP_WAIT_S)])
        assert joiner.slots["gpu-a"].catching
        assert len(nodes.writes) == 2  # after 30 and 60 s of its samples; live, 15
        for second in range(130, 150):
            await _at(second, joiner, clock,
                      [_record("gpu-a", 1_078_000 + (second - 130) * 1000, second, waited_s=0.1)])
        assert not joiner.slots["gpu-a"].catching
        assert 5 <= len(nodes.writes) <= 6, len(nodes.writes)


async def test_the_worker_tells_once_when_it_caught_up_on_every_node_it_was_behind_on() -> None:
    """The moment its backlog's peak of memory is over (app.py gives freed memory back then)."""
    async with _running(5.0) as (joiner, _, clock):
        await _at(0, joiner, clock, [_record("gpu-a", 1_000_000, 0)])
        assert not joiner.caught_up_again()  # live from the start: nothing to catch up on
        for second in range(1, 4):
            await _at(second, joiner, clock, [
                _record("gpu-a", 1_000_000 + second * 1000, 2 * second, waited_s=10 * CATCH_UP_WAIT_S),
                _record("gpu-b", 1_000_000 + second * 1000, 2 * second + 1)])
            assert not joiner.caught_up_again()  # gpu-a is still behind
        await _at(4, joiner, clock, [_record("gpu-a", 1_004_000, 8, waited_s=0.1)])
        assert not joiner.slots["gpu-a"].catching
        assert joiner.caught_up_again()
        assert not joiner.caught_up_again()  # once
        await _at(5, joiner, clock, [_record("gpu-b", 1_005_000, 9, waited_s=10 * CATCH_UP_WAIT_S)])
        assert not joiner.caught_up_again()
        await _at(6, joiner, clock, [_record("gpu-b", 1_006_000, 10, waited_s=0.1)])
        assert joiner.caught_up_again()  # and again after the next backlog


async def test_a_node_is_no_longer_caught_up_on_once_it_is_quiet_and_its_partition_read_to_its_end() -> None:
    ends = {TELEMETRY.name: 10_000}
    async with _running(5.0, ends) as (joiner, _, clock):
        for second in range(3):
            await _at(second, joiner, clock, [_record("gpu-a", 1_000_000 + second * 1000, second,
                                                      waited_s=10 * CATCH_UP_WAIT_S)])
        slot = joiner.slots["gpu-a"]
        assert slot.catching
        clock[0] += 10.0  # no record of it for a while, but its partition holds more: still behind
        joiner.tick()
        assert slot.catching
        ends[TELEMETRY.name] = 3  # read to the end
        joiner.tick()
        assert not slot.catching


async def test_a_node_whose_samples_stop_persists_what_it_holds_after_event_time_wait_intervals() -> None:
    async with _running(5.0) as (joiner, nodes, clock):
        for second in range(8):
            await _at(second, joiner, clock, [_record("gpu-a", 1_000_000 + second * 1000, second)])
        slot = joiner.slots["gpu-a"]
        persisted, started = len(nodes.writes), slot.persist_started
        assert slot.held  # the samples since its last persist, not acknowledged yet
        for second in range(8, 60):  # its samples stop; the worker ticks every second
            clock[0] = 100.0 + second
            joiner.tick()
            await joiner.settle()
            if len(nodes.writes) > persisted:
                break
        assert len(nodes.writes) == persisted + 1 and not slot.held
        assert clock[0] == started + EVENT_TIME_WAIT * 5.0


class StuckNodes(Table):
    """A nodes table whose writes the broker never confirms."""

    def put(self, key: bytes, value: bytes, partition: int) -> asyncio.Future[None]:
        super().put(key, value, partition)
        return asyncio.get_running_loop().create_future()


async def test_a_persist_that_does_not_end_is_named_once_with_what_it_waits_for(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = [100.0]
    joiner, sender = _joiner(StuckNodes(), clock, 0.0)
    running = asyncio.ensure_future(sender.run())
    try:
        await joiner.handle_batch([_record("gpu-a", 1_000_000, 0)])
        for _ in range(5):
            await asyncio.sleep(0)  # the persist runs up to the node record's write
        assert joiner.slow_persists(SLOW_PERSIST_S) == []
        clock[0] += SLOW_PERSIST_S
        with caplog.at_level(logging.WARNING, logger="services.joiner.worker"):
            joiner.tick()
            joiner.tick()
        warned = [r.getMessage() for r in caplog.records]
        assert len(warned) == 1, warned
        assert warned[0].startswith("node gpu-a: persist 1 under way for 10 s, waiting for its node record")
        # At a stop, every persist under way is named, warned of before or not.
        named = [line.split(",")[0] for line in joiner.slow_persists(0.0)]
        assert named == ["node gpu-a: persist 1 under way for 10 s"]
    finally:
        running.cancel()
        for task in list(joiner._tasks):
            task.cancel()


async def test_a_stop_that_gives_up_on_a_persist_starts_no_other() -> None:
    clock = [100.0]
    joiner, sender = _joiner(StuckNodes(), clock, 0.0)
    running = asyncio.ensure_future(sender.run())
    try:
        await joiner.handle_batch([_record("gpu-a", 1_000_000, 0)])
        await joiner.handle_batch([_record("gpu-a", 1_001_000, 1)])  # due again behind the first
        for _ in range(5):
            await asyncio.sleep(0)
        slot = joiner.slots["gpu-a"]
        assert slot.persisting and slot.seq == 1 and len(joiner._tasks) == 1
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(joiner.shutdown(), 0.05)  # as the app's stop does, bounded
        for _ in range(5):
            await asyncio.sleep(0)
        # Nothing under way after the stop gave up: a persist started now would write after the
        # producer stopped.
        assert not joiner._tasks and slot.seq == 1
    finally:
        running.cancel()
        for task in list(joiner._tasks):
            task.cancel()


def test_the_setting_s_description_says_how_long_a_node_whose_samples_stand_still_waits() -> None:
    from periscope.settings.joiner import JoinerSettings

    described = JoinerSettings.model_fields["state_persist_interval"].description or ""
    assert f"persists after {EVENT_TIME_WAIT} intervals" in described
    assert f"{CATCH_UP_SPACING} times as far apart while the worker catches up on the node" in described
