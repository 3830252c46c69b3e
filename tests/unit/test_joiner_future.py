"""Hostile input records against the joiner: one record stamped years ahead of its broker timestamp must
not move its node's event time (every real sample after it would look late, for good); it is
dead-lettered with the reason and counted, and the node goes on. A node whose records arrive while its
event time stands still is listed as stalled."""

from __future__ import annotations

from typing import Any

from periscope.bus import codec
from periscope.bus import topics as T
from periscope.clock import ScaledClock
from periscope.core.engine import EngineConfig
from periscope.core.model import DeviceSample, Meta, NodeTelemetry
from services.joiner.delivery import OutputSender
from services.joiner.metrics import JoinerMetrics
from services.joiner.worker import Hooks, Joiner
from tests.unit.joiner_io import Event, Msg, Table, done

YEAR_MS = 365 * 86_400_000
NOW_MS = 1_790_000_100_000


def _telemetry(t_ms: int, seq: int) -> NodeTelemetry:
    return NodeTelemetry(Meta("gpu-a", "probe/gpu-a", 1, seq, t_ms),
                         (DeviceSample("GPU-1", index=0, util_pct=50.0),))


async def _joiner(**kw: Any) -> tuple[Joiner, list[tuple[str, str]], JoinerMetrics]:
    letters: list[tuple[str, str]] = []
    metrics = JoinerMetrics()

    async def send(records: Any) -> list[Any]:
        return []

    sender = OutputSender(send, lambda p: done(), lambda topic, n: None, lambda e: done())

    async def dead_letter(msg: Any, error: str) -> None:
        letters.append((msg.topic, error))

    hooks = {k: kw.pop(k) for k in ("clock", "event_ms_of") if k in kw}
    j = Joiner(config=EngineConfig(), persist_interval_s=60, metrics=metrics, nodes=Table(), pods=Table(),
               marks=Table(), sender=sender,
               hooks=Hooks(dead_letter=dead_letter, on_error=lambda e: done(), **hooks), **kw)
    return j, letters, metrics


def _event(ev: NodeTelemetry, offset: int, broker_ms: float | None) -> Event:
    return Event(Msg(T.TELEMETRY.name, 0, offset, b"gpu-a", codec.encode(ev),
                     timestamp=None if broker_ms is None else broker_ms / 1000))


async def test_a_record_stamped_years_ahead_is_dead_lettered_and_the_node_goes_on() -> None:
    j, letters, metrics = await _joiner()
    await j.handle_batch([_event(_telemetry(NOW_MS, 1), 0, NOW_MS)])
    await j.handle_batch([_event(_telemetry(NOW_MS + 10 * YEAR_MS, 2), 1, NOW_MS + 1000)])
    for k in range(3, 8):
        await j.handle_batch([_event(_telemetry(NOW_MS + k * 1000, k), k, NOW_MS + k * 1000)])
    state = j.slots["gpu-a"].state
    assert state.watermark_ms == NOW_MS + 7000  # the forged time never became the node's
    assert state.counters.late_dropped == 0
    assert len(letters) == 1 and letters[0][0] == T.TELEMETRY.name
    assert "ahead of the record's broker time" in letters[0][1] and "PERISCOPE_FUTURE_SKEW" in letters[0][1]
    assert metrics.future_records._value.get() == 1


async def test_the_skew_is_judged_on_the_simulated_clock_under_periscope_up() -> None:
    # At speed 10, event time runs ten times faster than the broker's wall-clock stamps.
    clock = ScaledClock(NOW_MS, 10)
    j, letters, _ = await _joiner(event_ms_of=clock.event_ms, future_skew_ms=60_000)
    wall = NOW_MS + 100_000  # 100 s of wall time after the origin: 1000 s of event time
    await j.handle_batch([_event(_telemetry(NOW_MS + 1_000_000, 1), 0, wall)])
    assert letters == [] and j.slots["gpu-a"].state.watermark_ms == NOW_MS + 1_000_000


async def test_records_without_a_broker_timestamp_are_not_judged() -> None:
    j, letters, _ = await _joiner()
    await j.handle_batch([_event(_telemetry(NOW_MS + YEAR_MS, 1), 0, None)])
    assert letters == []


async def test_a_node_whose_records_arrive_but_whose_time_stands_still_is_stalled() -> None:
    clock = [1000.0]
    j, _, _ = await _joiner(clock=lambda: clock[0], stalled_after_s=30.0)
    await j.handle_batch([_event(_telemetry(NOW_MS, 1), 0, NOW_MS)])
    for k in range(1, 50):  # the same (or older) sample again and again: nothing moves
        clock[0] += 1.0
        await j.handle_batch([_event(_telemetry(NOW_MS - k, k + 1), k, NOW_MS)])
    assert j.stalled() == ["gpu-a"]
    clock[0] += 1.0
    await j.handle_batch([_event(_telemetry(NOW_MS + 1000, 99), 99, NOW_MS + 1000)])
    assert j.stalled() == []
