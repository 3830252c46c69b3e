"""A worker catching up on a node gathers its outputs across batches and publishes them once it caught
up, or before the node's next persist: only the newest attribution and GPU state per key, those that
close windows, and every finding: a subsequence of what the core computes. Whatever the batches,
subscribers end with what the pure core computed: the same newest output per key, every closed window as
computed, the same findings in the same order. A live worker (a tick of each node per batch, no backlog)
publishes every output with its batch."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from periscope.bus import codec
from periscope.bus import topics as T
from periscope.core.changes import ChangeConfig, without_windows
from periscope.core.engine import EngineConfig, apply, new_state, output_key
from periscope.core.model import (
    AllocationSnapshot,
    DeviceInventory,
    Finding,
    GpuState,
    NodeInput,
    NodeTelemetry,
    Output,
    PodAttribution,
    PodEvent,
    WindowStat,
)
from periscope.core.rows import RowConfig
from periscope.core.watermark import ALL_STREAMS
from services.joiner.delivery import OutputSender
from services.joiner.metrics import JoinerMetrics
from services.joiner.positions import Positions
from services.joiner.worker import Hooks, Joiner
from tests.unit.core_builders import NODE, alloc, ck, dev, gpu, inventory, pod, pr, proc, tel, uid, xid
from tests.unit.joiner_io import Event, Msg, Table, done, read

S = 1000
# Short windows and no heartbeat, so a few dozen ticks close several windows and change every output.
CONFIG = EngineConfig(rows=RowConfig(window_ms=10 * S, window_keep_ms=60 * S),
                      changes=ChangeConfig(heartbeat_ms=0))


def _feed(ticks: int = 40) -> list[NodeInput]:
    g0, g1 = gpu(0), gpu(1)
    events: list[NodeInput] = [
        inventory(), pod(1, "train-0", 0), pod(2, "serve-0", 0),
        alloc(1, pr("ml", "train-0", (g0,)), ck(uid(1), (g0,)),
              pr("ml", "serve-0", (g1,)), ck(uid(2), (g1,))),
    ]
    for k in range(1, ticks + 1):
        t = k * S
        events.append(tel(t, dev(g0, 20.0 + k % 7, procs=(proc(10, uid(1), 20.0 + k % 7, 500.0),)),
                          dev(g1, 60.0 - k % 5, procs=(proc(11, uid(2), 60.0 - k % 5, 700.0),), index=1)))
        if k == 17:
            events.append(xid(t + 1, g0))
    return events


def _topic(ev: NodeInput) -> T.Topic:
    if isinstance(ev, NodeTelemetry):
        return T.TELEMETRY
    if isinstance(ev, PodEvent):
        return T.PODS
    if isinstance(ev, AllocationSnapshot):
        return T.ALLOCATIONS
    if isinstance(ev, DeviceInventory):
        return T.INVENTORY
    return T.XID


def _events(feed: list[NodeInput]) -> list[Event]:
    offsets: dict[str, int] = {}
    out = []
    for ev in feed:
        topic = _topic(ev).name
        offsets[topic] = offsets.get(topic, -1) + 1
        out.append(Event(Msg(topic, 0, offsets[topic], NODE.encode(), codec.encode(ev))))
    return out


async def _published(batches: list[list[Event]], config: EngineConfig,
                     ends: dict[str, int] | None = None, lagging: bool = True,
                     persist_interval_s: float = 3600.0, clock: Any = lambda: 100.0,
                     caught_up_after: int | None = None, waited_s: float | None = None,
                     quiet_s: float | None = None,
                     after_batch: Callable[[Joiner], None] | None = None) -> list[list[Output]]:
    """What a worker publishes for each batch, decoded, and last what its shutdown publishes; `lagging`:
    while catching up (the broker holds far more telemetry than the batches; only for the first
    `caught_up_after` batches where given), else `ends` are the partitions' end offsets. `waited_s`: how
    long each record waited on the broker; `quiet_s`: the clock then moves on this much and the worker's
    timer ticks (what that publishes is the element before the stop's). `after_batch` sees the worker
    after each batch."""
    sent: list[list[Output]] = []
    taken = 0  # batches handed to the worker so far

    async def send(records: list[tuple[str, bytes, bytes]]) -> list[Any]:
        sent.append([codec.decode(T.BY_NAME[topic], value) for topic, _, value in records])
        return []

    async def fail(e: BaseException) -> None:
        raise AssertionError(f"unexpected error: {e!r}")

    async def dead_letter(msg: Any, error: str) -> None:
        raise AssertionError(f"dead-lettered: {error}")

    sender = OutputSender(send, lambda p: done(), lambda topic, n: None, fail)
    def end_of(topic: str, partition: int) -> int | None:
        if lagging and topic == T.TELEMETRY.name and (caught_up_after is None or taken <= caught_up_after):
            return 1_000_000  # far more telemetry on the broker than these batches: catching up
        if ends is None:
            return None
        return ends.get(topic, 0)  # a topic the feed has no record of: an empty partition

    wall = 1_800_000_000.0
    if waited_s is not None:
        for ev in (e for batch in batches for e in batch):
            ev.message.timestamp = wall - waited_s
    moved = 0.0
    hooks = Hooks(dead_letter=dead_letter, on_error=fail, clock=lambda: clock() + moved, end_of=end_of,
                  wall=lambda: wall)
    positions = Positions()  # every input partition positioned at its start
    partitions = {0} | {ev.message.partition for batch in batches for ev in batch}
    positions.start = {(t.name, p): 0 for t in T.NODE_INPUTS for p in partitions}
    joiner = Joiner(config=config, persist_interval_s=persist_interval_s, metrics=JoinerMetrics(),
                    nodes=Table(), pods=Table(), marks=Table(), sender=sender, hooks=hooks,
                    positions=positions)
    running = asyncio.ensure_future(sender.run())
    per_batch: list[list[Output]] = []
    try:
        for batch in batches:
            taken += 1
            await joiner.handle_batch(read(batch))
            await joiner.settle()  # as a running worker does between batches: persists complete
            if after_batch is not None:
                after_batch(joiner)
            per_batch.append([o for records in sent for o in records])
            sent.clear()
        if quiet_s is not None:
            moved = quiet_s
            joiner.tick()
            await joiner.settle()
            per_batch.append([o for records in sent for o in records])
            sent.clear()
        await joiner.shutdown()
        await sender.barrier()
        per_batch.append([o for records in sent for o in records])
    finally:
        running.cancel()
    return per_batch


def _core(feed: list[NodeInput], config: EngineConfig) -> list[Output]:
    state, outs = new_state(NODE), []
    for ev in feed:
        o = apply(state, ev, config)
        outs.extend(o)
    return outs


def _core_per_batch(batches: list[list[Event]], config: EngineConfig) -> list[list[Output]]:
    state, out = new_state(NODE), []
    for batch in batches:
        out.append([o for ev in batch for o in apply(state, codec.decode(T.BY_NAME[ev.message.topic],
                                                                          ev.message.value), config)])
    return out


def _windows(outs: list[Output]) -> dict[tuple[str, str, str], list[WindowStat]]:
    """Every closed window published, per pod row, merged by window start."""
    got: dict[tuple[str, str, str], dict[int, WindowStat]] = {}
    for o in outs:
        if isinstance(o, PodAttribution):
            for r in o.rows:
                for w in r.windows:
                    got.setdefault((o.pod_uid, r.container, r.device_id), {})[w.start_ms] = w
    return {k: [v[s] for s in sorted(v)] for k, v in got.items()}


def _latest(outs: list[Output]) -> dict[str, Output]:
    return {output_key(o): o for o in outs}


def _bare(outs: list[Output]) -> list[Output]:
    """The outputs without their windows (compared on their own, by `_windows`)."""
    return [without_windows(o) for o in outs]


def _same_as_the_core(published: list[Output], core: list[Output]) -> None:
    # Nothing made up: each attribution and GPU state is one the core computed (catching up, the core
    # builds only the newest of a key, with every window that closed since its last publication on it),
    # and the findings come in the core's order.
    computed = _bare(core)
    assert all(o in computed for o in _bare(published) if not isinstance(o, Finding))
    assert _latest(_bare(published)) == _latest(computed)
    assert _windows(published) == _windows(core)
    assert [o for o in published if isinstance(o, Finding)] == [o for o in core if isinstance(o, Finding)]


async def test_a_batch_of_many_ticks_publishes_each_key_once_with_every_closed_window() -> None:
    feed = _feed()
    core = _core(feed, CONFIG)
    assert len({output_key(o) for o in core if not isinstance(o, Finding)}) < len(core) / 10  # many per key
    assert any(isinstance(o, Finding) and o.kind == "xid-owner" for o in core)
    # (Published with the batch: its allocation is persisted at once, and what was gathered goes first.)
    published = [o for b in await _published([_events(feed)], CONFIG) for o in b]
    keys = [output_key(o) for o in published if not isinstance(o, Finding)]
    closing = [o for o in published if isinstance(o, PodAttribution) and any(r.windows for r in o.rows)]
    assert len(set(keys)) == 4  # two pods, two GPUs
    newest = [o for o in _latest(published).values() if not isinstance(o, Finding)]
    # The newest of each key, and the outputs that closed windows: nothing else.
    assert len(keys) == len(newest) + len([c for c in closing if c not in newest])
    assert len(closing) >= 6  # 40 s of 10 s windows, two pods
    _same_as_the_core(published, core)


async def test_aligned_catch_up_in_one_batch_publishes_what_the_core_computes_in_event_time_order() -> None:
    feed = _feed()
    config = replace(CONFIG, align=ALL_STREAMS)
    events = _events(feed)
    ends = {t.name: 0 for t in T.NODE_INPUTS}  # no record at all: at its end from the start
    for ev in events:
        ends[ev.message.topic] = ev.message.offset + 1  # at its end after this batch (not telemetry)
    published = [o for b in await _published([events], config, ends) for o in b]
    assert len([o for o in published if isinstance(o, GpuState)]) == 2  # one per GPU
    _same_as_the_core(published, _core(feed, CONFIG))


def _live(events: list[Event]) -> list[list[Event]]:
    """The batches of a live worker: a tick of the node each (with what arrived since the last tick)."""
    batches: list[list[Event]] = [[]]
    for ev in events:
        if ev.message.topic == T.TELEMETRY.name and any(e.message.topic == T.TELEMETRY.name
                                                         for e in batches[-1]):
            batches.append([])
        batches[-1].append(ev)
    return batches


def _read_to_the_end() -> tuple[list[NodeInput], dict[str, int], list[list[Event]]]:
    """The feed, the partitions' end offsets once every record of it is written, and its live batches."""
    feed = _feed()
    events = _events(feed)
    return feed, {ev.message.topic: ev.message.offset + 1 for ev in events}, _live(events)


async def test_a_live_worker_publishes_every_output_the_core_computes() -> None:
    feed, ends, batches = _read_to_the_end()  # no backlog on the broker
    assert len(batches) == 40
    published = await _published(batches, CONFIG, ends, lagging=False)
    assert published[-1] == []  # each batch's outputs went out with it: nothing left for the stop
    assert [o for batch in published for o in batch] == _core(feed, CONFIG)


async def test_a_batch_that_reads_its_partition_to_the_end_but_holds_many_ticks_is_catching_up() -> None:
    # Seen in the benchmark: with 12 partitions a batch of 2,000 records read a partition's whole backlog
    # of 1,040 telemetry records, so the backlog left after it was small, and every tick's outputs of the
    # batch were published: 167,000 records for 100,000 device samples instead of 3,000.
    feed = _feed()
    events = _events(feed)
    ends = {ev.message.topic: ev.message.offset + 1 for ev in events}  # the batch reaches every end
    published = [o for b in await _published([events], CONFIG, ends, lagging=False) for o in b]
    core = _core(feed, CONFIG)
    assert len(published) < len(core) / 4
    _same_as_the_core(published, core)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=60), min_size=1, max_size=30))
def test_any_split_into_batches_ends_with_what_the_core_computes(sizes: list[int]) -> None:
    feed = _feed()
    events = _events(feed)
    batches, i = [], 0
    for n in sizes:
        if i < len(events):
            batches.append(events[i:i + n])
            i += n
    if i < len(events):
        batches.append(events[i:])
    published = asyncio.run(_published(batches, CONFIG))
    for batch_out in published:
        gpus = [o.gpu_uuid for o in batch_out if isinstance(o, GpuState)]
        assert len(gpus) == len(set(gpus))  # within a batch, each GPU once
    _same_as_the_core([o for b in published for o in b], _core(feed, CONFIG))


def _small(events: list[Event], n: int = 3) -> list[list[Event]]:
    return [events[i:i + n] for i in range(0, len(events), n)]


async def test_catching_up_in_small_batches_gathers_across_them() -> None:
    # Seen in the benchmark: Faust's stream hands the worker a few dozen records of a dozen partitions at
    # a time, so a batch rarely holds two ticks of one node, and reducing each batch on its own dropped
    # almost nothing (187,000 records published for 100,000 device samples).
    feed = _feed()
    batches = _small(_events(feed))
    published = await _published(batches, CONFIG)
    # Published when a persist is due: the second batch's allocation is persisted at once, then the stop.
    assert [i for i, batch in enumerate(published) if batch] == [1, len(batches)]
    assert len([o for o in published[-1] if isinstance(o, GpuState)]) == 2
    _same_as_the_core(published[-1], _core(feed, CONFIG))


async def test_a_persist_publishes_what_was_gathered_before_it() -> None:
    # The persisted state may not be ahead of what was published: a crash after it would lose the
    # gathered outputs (their records are committed and never read again).
    feed = _feed()
    batches = _small(_events(feed))
    ticks = iter(range(10_000))
    published = await _published(batches, CONFIG, persist_interval_s=3.0, clock=lambda: float(next(ticks)))
    flushes = [i for i, batch in enumerate(published[:-1]) if batch]
    assert len(flushes) >= 2  # outputs went out before the stop, each time a persist was due
    for batch in published:
        gpus = [o.gpu_uuid for o in batch if isinstance(o, GpuState)]
        assert len(gpus) == len(set(gpus))
    _same_as_the_core([o for b in published for o in b], _core(feed, CONFIG))


async def test_a_node_caught_up_publishes_what_it_gathered_then_the_batch() -> None:
    feed, ends, batches = _read_to_the_end()
    published = await _published(batches, CONFIG, ends, caught_up_after=20)
    assert all(batch == [] for batch in published[:20])
    per_batch = _core_per_batch(batches, CONFIG)
    # The first batch taken with no backlog publishes what was gathered and its own outputs, reduced
    # together: its own GPU states are each GPU's newest.
    first = published[20]
    gpus = [o for o in first if isinstance(o, GpuState)]
    assert gpus == [o for o in per_batch[20] if isinstance(o, GpuState)]
    assert len(first) < len([o for b in per_batch[1:21] for o in b]) / 4
    assert published[21:-1] == per_batch[21:]  # live from then on: each batch's outputs with it
    assert published[-1] == []
    _same_as_the_core([o for b in published for o in b], _core(feed, CONFIG))


async def test_records_that_waited_on_the_broker_are_caught_up_on_even_a_tick_at_a_time() -> None:
    # A batch of one tick of a node, with no backlog left behind it on the broker, but read 10 s after
    # it was written (a worker back from a pause, a probe's buffered records): catching up.
    feed, ends, batches = _read_to_the_end()
    published = await _published(batches, CONFIG, ends, lagging=False, waited_s=10.0)
    # Gathered until the batch that reads the partition to its end: caught up. (The first batch's
    # allocation is persisted at once, and what was gathered goes out before.)
    *during, last, at_stop = published
    assert all(batch == [] for batch in during[1:]) and at_stop == []
    assert len([o for o in last if isinstance(o, GpuState)]) == 2
    _same_as_the_core([o for b in published for o in b], _core(feed, CONFIG))
    # Read a moment after they were written, the same batches are live: each publishes its outputs.
    live = await _published(_read_to_the_end()[2], CONFIG, ends, lagging=False, waited_s=0.2)
    assert live[-1] == [] and [o for b in live for o in b] == _core(feed, CONFIG)


async def test_what_was_gathered_goes_out_once_the_nodes_records_stop_coming() -> None:
    # Where the partition's end is not known (here: far ahead), no batch says the worker caught up.
    feed, ends, batches = _read_to_the_end()
    published = await _published(batches, CONFIG, ends, waited_s=10.0, quiet_s=1.5)
    *during, at_tick, at_stop = published
    assert all(batch == [] for batch in during[1:])
    assert len([o for o in at_tick if isinstance(o, GpuState)]) == 2 and at_stop == []
    _same_as_the_core([o for b in published for o in b], _core(feed, CONFIG))


async def test_an_end_offset_behind_the_worker_counts_as_caught_up() -> None:
    # The partitions' end offsets are refreshed every few seconds, so a worker reads past the last one
    # it was told: a backlog below zero, which is caught up, not catching up (the outputs waited for
    # the next refresh).
    feed, ends, batches = _read_to_the_end()
    stale = {**ends, T.TELEMETRY.name: ends[T.TELEMETRY.name] - 10}
    published = await _published(batches, CONFIG, stale, lagging=False, waited_s=10.0)
    *during, at_stop = published
    # Gathered until the batch that reads through the stale end; each batch after it is published.
    reached = next(i for i, b in enumerate(batches)
                   if any(e.message.topic == T.TELEMETRY.name
                          and e.message.offset + 1 == stale[T.TELEMETRY.name] for e in b))
    assert all(batch == [] for batch in during[1:reached])
    assert all(batch for batch in during[reached:]) and at_stop == []
    _same_as_the_core([o for b in published for o in b], _core(feed, CONFIG))


async def test_telemetry_read_to_its_end_is_not_caught_up_while_an_allocation_stream_is_behind() -> None:
    # Seen in the benchmark: a batch read a partition's telemetry to its end while its allocations were
    # still on the broker; alignment held the samples, and the worker counted the node as caught up, so
    # the core built the views of each sample it released afterwards (a fifth of the backlog's samples)
    # only for the newest per key to be published.
    feed = _feed()
    events = _events(feed)
    ends = {ev.message.topic: ev.message.offset + 1 for ev in events}
    allocations = [e for e in events if e.message.topic == T.ALLOCATIONS.name]
    rest = [e for e in events if e.message.topic != T.ALLOCATIONS.name]
    config = replace(CONFIG, align=ALL_STREAMS)
    paused: list[bool] = []
    published = await _published([rest, allocations], config, ends, lagging=False, waited_s=10.0,
                                  after_batch=lambda j: paused.append(j.slots[NODE].state.views_paused))
    assert paused == [True, False]  # catching up until every stream of the partition was read
    first, second, at_stop = published
    assert first == [] and at_stop == []  # the samples waited for the allocations
    assert len([o for o in second if isinstance(o, GpuState)]) == 2  # the newest of each GPU, once
    _same_as_the_core(second, _core(feed, CONFIG))  # as in event-time order
