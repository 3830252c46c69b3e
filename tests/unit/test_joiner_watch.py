"""The joiner's progress watch: a partition that has records but whose position does not move for the
stall limit restarts the worker, whether its end is known from fetch responses or, on brokers whose end
offsets are exact, from asking for them (a partition that is never fetched has no fetched end)."""

from __future__ import annotations

from typing import Any

from faust.types import TP

from services.joiner.progress import ProgressWatch

TELEMETRY = TP("periscope.node.telemetry.v1", 0)


class Consumer:
    def __init__(self, fetched: int | None, end: int) -> None:
        self.fetched, self.end = fetched, end

    def assignment(self) -> set[TP]:
        return {TELEMETRY}

    def highwater(self, tp: TP) -> int | None:
        return self.fetched

    async def highwaters(self, *tps: TP) -> dict[TP, int]:
        return {tp: self.end for tp in tps}


class App:
    rebalancing = False

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer


def _watch(fetched: int | None, end: int, ask_ends: bool) -> tuple[ProgressWatch, list[str]]:
    stalls: list[str] = []
    app: Any = App(Consumer(fetched, end))
    watch = ProgressWatch(app, {}, 20.0, lambda: stalls.append("stall"), ask_ends=ask_ends)
    watch.start = {TELEMETRY: 5}
    return watch, stalls


async def test_a_partition_never_fetched_is_seen_stalled_where_end_offsets_are_asked() -> None:
    watch, stalls = _watch(None, 40, ask_ends=True)
    await watch.refresh_ends()
    watch.check(100.0)
    watch.check(121.0)
    assert stalls == ["stall"]


async def test_without_asking_a_never_fetched_partition_looks_empty() -> None:
    watch, stalls = _watch(None, 40, ask_ends=False)
    await watch.refresh_ends()
    watch.check(100.0)
    watch.check(121.0)
    assert stalls == [] and watch.ends == {}


async def test_a_partition_at_its_end_is_not_stalled() -> None:
    watch, stalls = _watch(None, 5, ask_ends=True)
    await watch.refresh_ends()
    watch.check(100.0)
    watch.check(200.0)
    assert stalls == []
    assert list(watch.lag()) == [(TELEMETRY.topic, 0, 0)]
