"""Read the input topics for a replay range: read-only, never committing, bounded by what exists now.

What the core needs to answer for [from, to] (the "anchor" is the first instant whose samples matter):
- pods and nodes: state-based and small, read from the beginning of their topics;
- allocation snapshots and inventory: from `anchor - lookback`, and further back until each node's
  last snapshot at or before the anchor is found;
- telemetry and XIDs: from the anchor to `to`.
Every partition is assigned by hand (no group id, so nothing is committed and no rebalance happens)
and read up to the end offset seen at start. Where the broker profile says `offsets_for_times` is
right, it gives the start; it finds record timestamps, not event times, so it is checked against the
event times of the records on either side (a producer clock that ran ahead would mislead it) and
otherwise, or where the profile says it is wrong, the start is found by searching on event time
(periscope.replay.seek: one probe where the range begins before the partition's records).
Records that do not decode are skipped, counted and reported through `warn`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.partitioner import murmur2

from periscope.bus import codec
from periscope.bus import topics as t
from periscope.bus.admin import partition_counts
from periscope.bus.clients import Kafka
from periscope.bus.diagnosis import check_connection
from periscope.bus.security import KafkaSecurityError
from periscope.core.model import NodeInput
from periscope.replay.plan import SAMPLES, SNAPSHOTS, STATE, ReadPlan, nodes_needing_snapshots, select
from periscope.replay.runner import Pending, ReplayInput, node_of
from periscope.replay.seek import first_at_or_after

_PROBE_FETCH_BYTES = 64 * 1024
_FETCH_BYTES = 8 * 1024 * 1024  # per partition and fetch: few round trips for a long range
_BATCH_RECORDS = 20_000
_IDLE_LIMIT_S = 30.0


class ReadError(RuntimeError):
    """The broker could not be read (unreachable, or it stopped answering)."""


@dataclass(slots=True)
class ReadStats:
    records: int = 0  # records read
    events: int = 0  # events handed on
    bad: int = 0  # records skipped because they did not decode
    probes: int = 0  # single-record reads spent locating start offsets
    extended: int = 0  # records read further back to find a node's last snapshot
    seconds: float = 0.0  # wall time of the whole read (connecting, fetching, decoding, selecting)
    bad_by_topic: dict[str, int] = field(default_factory=dict)


Warn = Callable[[str], None]
Progress = Callable[[int, int], None]  # (records just read, total records planned so far)


def partition_for(key: str, partitions: int) -> int:
    """The partition the default (murmur2) partitioner gives a key, as every producer of ours uses."""
    h: int = murmur2(key.encode())
    return (h & 0x7FFFFFFF) % partitions


def _record_time(topic: t.Topic, rec: ConsumerRecord[bytes, bytes]) -> int:
    try:
        ev: NodeInput = codec.decode(topic, rec.value or b"")
        return ev.meta.time_ms
    except codec.DecodeError:
        return int(rec.timestamp)


class _Reader:
    def __init__(self, kafka: Kafka, plan: ReadPlan, warn: Warn | None, progress: Progress | None,
                 lazy: bool = False) -> None:
        self.plan, self.warn, self.progress, self.lazy = plan, warn, progress, lazy
        self.kafka = kafka
        self.stats = ReadStats()
        self.main = self._main_consumer()
        self._retired: list[AIOKafkaConsumer] = []
        self.tps: list[TopicPartition] = []
        self.probe = self._consumer(max_partition_fetch_bytes=_PROBE_FETCH_BYTES)
        self.begin: dict[TopicPartition, int] = {}
        self.end: dict[TopicPartition, int] = {}
        self.parts: dict[str, int] = {}  # partition count per topic
        self.total = 0
        self.events: list[tuple[t.Topic, ReplayInput]] = []
        # per snapshot topic, the nodes with a record at or before the anchor
        self.anchored: dict[str, set[str]] = {topic.name: set() for topic in SNAPSHOTS}

    def _consumer(self, **options: Any) -> AIOKafkaConsumer:
        # No group: nothing is committed. If retention removes records while they are read, carry on
        # from the oldest that is left rather than from the end.
        return self.kafka.consumer(client_id="periscope-replay", **options)

    def _main_consumer(self) -> AIOKafkaConsumer:
        return self._consumer(max_partition_fetch_bytes=_FETCH_BYTES, fetch_max_bytes=4 * _FETCH_BYTES)

    async def fresh_main(self) -> None:
        """A new consumer for the next phase of reading. The last fetch of the previous phase waits at
        the end of its partitions for up to fetch_max_wait_ms (500 ms), and aiokafka sends nothing more
        to that broker until it returns; a new consumer has its own connection."""
        # The old one is stopped with the others at the end (all its partitions are paused; stopping
        # it right away can trip over its own just-started tasks).
        self._retired.append(self.main)
        self.main = self._main_consumer()
        await self.main.start()
        if self.tps:
            self.main.assign(self.tps)
            self.main.pause(*self.tps)

    async def __aenter__(self) -> _Reader:
        try:
            await self.main.start()
            await self.probe.start()
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        # Stopping a consumer whose start failed is safe, and keeps it from warning when collected.
        await self.probe.stop()
        await self.main.stop()
        for consumer in self._retired:
            await consumer.stop()

    # ------------------------------------------------------------------ layout

    async def layout(self) -> list[TopicPartition]:
        names = (topic.name for topic in t.NODE_INPUTS)
        counts = await partition_counts(self.kafka, names, "periscope-replay")
        tps: list[TopicPartition] = []
        for topic in t.NODE_INPUTS:
            parts = list(range(counts.get(topic.name, 0)))
            self.parts[topic.name] = len(parts)
            if self.plan.node is not None and parts:
                parts = [parts[partition_for(self.plan.node, len(parts))]]
            tps += [TopicPartition(topic.name, p) for p in parts]
        if not tps:
            return []
        self.begin = await self.main.beginning_offsets(tps)
        self.end = await self.main.end_offsets(tps)
        self.tps = tps
        self.main.assign(tps)
        self.main.pause(*tps)
        self.probe.assign(tps)
        self.probe.pause(*tps)
        return tps

    # ------------------------------------------------------------------ finding a start offset

    async def _time_at(self, tp: TopicPartition, offset: int) -> int | None:
        """Event time of the first record at or after `offset` (None past the end seen at start)."""
        self.stats.probes += 1
        self.probe.seek(tp, offset)
        self.probe.resume(tp)
        try:
            for _ in range(20):
                got = await self.probe.getmany(tp, timeout_ms=500, max_records=1)
                for rec in got.get(tp, []):
                    if rec.offset >= self.end[tp]:
                        return None
                    return _record_time(t.BY_NAME[tp.topic], rec)
                if await self.probe.position(tp) >= self.end[tp]:
                    return None
            raise ReadError(f"no answer from the broker reading {tp.topic}[{tp.partition}]@{offset}")
        finally:
            self.probe.pause(tp)
            # Seeking drops the rest of the fetched batch: records left unconsumed in a paused
            # partition hold back the next fetch from the same broker by aiokafka's prefetch backoff
            # (100 ms), which would cost every later probe that much.
            self.probe.seek(tp, offset)

    async def start_offsets(self, tps: list[TopicPartition], target_ms: int) -> dict[TopicPartition, int]:
        """Per partition, the first offset whose record is at or after target_ms in event time."""
        live = [tp for tp in tps if self.begin[tp] < self.end[tp]]
        hints: dict[TopicPartition, Any] = {}
        if live and self.kafka.profile.offsets_for_times_exact:
            try:
                # Asked of the probe consumer: the main one's connection may be held by a fetch
                # waiting at the end of a partition (up to fetch_max_wait_ms, 500 ms), and a broker
                # may answer the next request on that connection only after it.
                hints = await self.probe.offsets_for_times({tp: max(0, target_ms) for tp in live})
            except Exception:  # unsupported by the broker: search without a hint
                hints = {}
        out = {tp: self.end[tp] for tp in tps}
        for tp in live:
            hint = hints.get(tp)
            out[tp] = await first_at_or_after(partial(self._time_at, tp), self.begin[tp], self.end[tp],
                                              target_ms, None if hint is None else int(hint.offset))
        return out

    # ------------------------------------------------------------------ reading

    def _keep(self, topic: t.Topic, rec: ConsumerRecord[bytes, bytes]) -> ReplayInput | None:
        if self.plan.node is not None and rec.key is not None and rec.key != self.plan.node.encode():
            return None  # another node's record, skipped before decoding
        try:
            ev: ReplayInput
            if self.lazy and topic not in STATE:
                # Checked now (a bad record is reported while reading), converted when replayed.
                ev = Pending(codec.decode_meta(topic, rec.value or b""), rec.value or b"", topic)
            else:
                ev = codec.decode(topic, rec.value or b"")
        except codec.DecodeError as e:
            self.stats.bad += 1
            self.stats.bad_by_topic[topic.name] = self.stats.bad_by_topic.get(topic.name, 0) + 1
            if self.warn is not None:
                self.warn(f"skipping bad record {rec.topic}[{rec.partition}]@{rec.offset}: {e}")
            return None
        if self.plan.node is not None and node_of(ev) != self.plan.node:
            return None
        return ev

    def _planned(self, n: int) -> None:
        self.total += n
        if self.progress is not None:
            self.progress(0, self.total)

    async def read(self, ranges: dict[TopicPartition, tuple[int, int]], *, stop_after_ms: int | None) -> None:
        """Read [start, stop) of each partition; a time-ranged one (stop_after_ms set) also ends at the
        first record later than stop_after_ms."""
        active: set[TopicPartition] = set()
        for tp, (start, stop) in ranges.items():
            if start < stop:
                self.main.seek(tp, start)
                active.add(tp)
        self._planned(sum(stop - start for start, stop in ranges.values() if start < stop))
        if not active:
            return
        self.main.resume(*active)
        idle_since = asyncio.get_running_loop().time()
        while active:
            got = await self.main.getmany(*sorted(active), timeout_ms=500, max_records=_BATCH_RECORDS)
            # Let the fetcher send its next request before decoding this batch, so the broker reads
            # the next one while this process decodes.
            for _ in range(3):
                await asyncio.sleep(0)
            now = asyncio.get_running_loop().time()
            for tp, recs in got.items():
                if tp not in active:
                    continue
                topic, stop = t.BY_NAME[tp.topic], ranges[tp][1]
                done, n = False, 0
                for rec in recs:
                    if rec.offset >= stop:
                        done = True
                        break
                    n += 1
                    ev = self._keep(topic, rec)
                    if ev is not None:
                        self.events.append((topic, ev))
                        if topic in SNAPSHOTS and ev.meta.time_ms <= self.plan.anchor_ms:
                            self.anchored[topic.name].add(node_of(ev))
                        if stop_after_ms is not None and ev.meta.time_ms > stop_after_ms:
                            done = True
                            break
                self.stats.records += n
                if self.progress is not None and n:
                    self.progress(n, self.total)
                if done or (recs and recs[-1].offset + 1 >= stop):
                    self._finish(tp, active, stop)
                idle_since = now
            for tp in [tp for tp in sorted(active) if not got.get(tp)]:
                if await self.main.position(tp) >= ranges[tp][1]:
                    # a gap (deleted records, markers) up to the stop offset
                    self._finish(tp, active, ranges[tp][1])
            if active and now - idle_since > _IDLE_LIMIT_S:
                raise ReadError(f"the broker sent nothing for {_IDLE_LIMIT_S:.0f}s while records remain")

    def _finish(self, tp: TopicPartition, active: set[TopicPartition], stop: int) -> None:
        active.discard(tp)
        self.main.pause(tp)
        self.main.seek(tp, stop)  # drops fetched records past the stop (see _time_at)


async def _extend(r: _Reader, topic: t.Topic, starts: dict[TopicPartition, int], need: set[str]) -> None:
    """Read further back in `topic` until every node in `need` has a record at or before the anchor."""
    count = r.parts.get(topic.name, 0)
    for tp in [tp for tp in starts if tp.topic == topic.name]:
        mine = {n for n in need if r.plan.node is not None or partition_for(n, count) == tp.partition}
        lo, chunk = starts[tp], 256
        while mine - r.anchored[topic.name] and lo > r.begin[tp]:
            new_lo = max(r.begin[tp], lo - chunk)
            before = r.stats.records
            await r.read({tp: (new_lo, lo)}, stop_after_ms=None)
            r.stats.extended += r.stats.records - before
            lo, chunk = new_lo, chunk * 2


async def _extend_all(r: _Reader, starts: dict[TopicPartition, int], need: set[str]) -> bool:
    """Read the snapshot topics further back (from `starts`) until every node in `need` has its
    allocations and inventory at or before the anchor; whether any were missing."""
    if not (need - r.anchored[t.ALLOCATIONS.name] or need - r.anchored[t.INVENTORY.name]):
        return False
    await r.fresh_main()  # records further back are needed
    for topic in SNAPSHOTS:
        await _extend(r, topic, starts, need)
    return True


class _Handover:
    """The nodes whose inputs are all read, selected for the replay and handed to `complete`, partition
    by partition. Every record read is indexed by its node; a node is handed over once the partition
    its key maps to is read, and again (its whole list) if a record of it turns up later elsewhere."""

    def __init__(self, r: _Reader, complete: Complete) -> None:
        self.r, self.complete = r, complete
        self.by_node: dict[str, list[tuple[t.Topic, ReplayInput]]] = {}
        self.selected: dict[str, int] = {}  # events handed over per node, the last time
        self._indexed = 0

    def _index(self) -> set[str]:
        """Index the records read since the last call; the nodes they belong to."""
        touched: set[str] = set()
        for topic, ev in self.r.events[self._indexed:]:
            node = node_of(ev)
            self.by_node.setdefault(node, []).append((topic, ev))
            touched.add(node)
        self._indexed = len(self.r.events)
        return touched

    async def partition_read(self, p: int, count: int, snap_starts: dict[TopicPartition, int]) -> None:
        """Partition `p` of the samples is read: its nodes (and any node whose partition came before
        and that has a record read since) get their snapshots extended where needed and are handed over."""
        r, plan = self.r, self.r.plan
        touched = self._index()
        home = {n: partition_for(n, count) for n in self.by_node if n}
        nodes = {n for n, q in home.items() if q == p} | {n for n in touched if n and home[n] < p}
        seen = [e for n in (*nodes, "") for e in self.by_node.get(n, ())]
        need = nodes_needing_snapshots(seen, plan) & nodes
        parts = {home[n] for n in need}
        if await _extend_all(r, {tp: s for tp, s in snap_starts.items() if tp.partition in parts}, need):
            nodes |= {n for n in self._index() if n and partition_for(n, count) <= p}
        self._hand(nodes)

    def _hand(self, nodes: set[str]) -> None:
        events: list[ReplayInput] = []
        for node in sorted(nodes):
            chosen = select(self.by_node[node], self.r.plan)
            self.selected[node] = len(chosen)
            events += chosen
        if events:
            self.complete(events)


async def _read_samples(r: _Reader, tps: list[TopicPartition], snap_starts: dict[TopicPartition, int],
                        complete: Complete | None) -> _Handover | None:
    """Read telemetry and XIDs for the range; with `complete`, partition by partition where the sample
    and snapshot topics are partitioned alike (a node's records then share one partition number),
    handing each partition's nodes over as soon as it is read (they replay while the rest is read)."""
    plan = r.plan
    sample_tps = [tp for tp in tps if t.BY_NAME[tp.topic] in SAMPLES]
    starts = await r.start_offsets(sample_tps, plan.anchor_ms)
    counts = {r.parts.get(topic.name, 0) for topic in (*SAMPLES, *SNAPSHOTS)}
    stop_after = plan.to_ms + plan.late_slack_ms
    if complete is None or plan.node is not None or len(counts) != 1:
        await r.fresh_main()
        await r.read({tp: (starts[tp], r.end[tp]) for tp in sample_tps}, stop_after_ms=stop_after)
        return None
    count = counts.pop()
    handover = _Handover(r, complete)
    for p in range(count):
        # A new consumer each time: the last fetch of a partition may wait at its end (see fresh_main).
        await r.fresh_main()
        await r.read({tp: (starts[tp], r.end[tp]) for tp in sample_tps if tp.partition == p},
                     stop_after_ms=stop_after)
        await handover.partition_read(p, count, snap_starts)
    return handover


Complete = Callable[[list[ReplayInput]], None]


async def read_inputs(
    kafka: Kafka, plan: ReadPlan, *, warn: Warn | None = None, progress: Progress | None = None,
    lazy: bool = False, complete: Complete | None = None,
) -> tuple[list[ReplayInput], ReadStats]:
    """Every input event the replay of `plan` needs, unordered (the runner orders them per node).
    With `lazy`, every record but pods and nodes comes as Pending (checked, converted when replayed):
    the bulk of a long range then stays about as small as it was on the wire until its node is replayed.
    With `complete`, nodes whose inputs are all read may be handed to it (every event of those nodes at
    once, maybe before the reading ends; a node handed over again is handed all its events again) and
    are then not among the events returned."""
    started = time.perf_counter()
    handover: _Handover | None = None
    try:
        await check_connection(kafka.bootstrap, kafka.security)  # a certificate or credential problem
        async with _Reader(kafka, plan, warn, progress, lazy) as r:
            tps = await r.layout()
            ranges = {tp: (r.begin[tp], r.end[tp]) for tp in tps if t.BY_NAME[tp.topic] in STATE}
            await r.read(ranges, stop_after_ms=None)
            snap_tps = [tp for tp in tps if t.BY_NAME[tp.topic] in SNAPSHOTS]
            snap_starts = await r.start_offsets(snap_tps, plan.cut_ms)
            await r.fresh_main()
            await r.read({tp: (snap_starts[tp], r.end[tp]) for tp in snap_tps},
                         stop_after_ms=plan.to_ms + plan.late_slack_ms)
            if plan.samples:
                handover = await _read_samples(r, tps, snap_starts, complete)
            if handover is None:
                await _extend_all(r, snap_starts, nodes_needing_snapshots(r.events, plan))
    except ReadError:
        raise
    except KafkaSecurityError as e:
        raise ReadError(f"cannot read from the broker at {kafka.bootstrap}: {e}") from None
    except Exception as e:  # aiokafka's connection and protocol errors
        why = str(e) or type(e).__name__
        raise ReadError(f"cannot read from the broker at {kafka.bootstrap}: {why}") from e
    if handover is not None:  # every node with a partition was handed over; what is left has none
        selected = select(handover.by_node.get("", []), plan)
        r.stats.events = sum(handover.selected.values()) + len(selected)
    else:
        selected = select(r.events, plan)
        r.stats.events = len(selected)
    r.stats.seconds = time.perf_counter() - started
    return selected, r.stats
