"""The joiner's worker: decode, call the pure core, encode. No join logic lives here.

One `Joiner` per worker keeps an in-memory `NodeState` per node of its assigned partitions, rebuilt
from the changelogged tables after a start or a rebalance. Delivery is at-least-once with three rules:

* an input record is acknowledged (so its offset may be committed) only after a persist that includes
  it is durable, and only once every record read before it on its partition is acknowledged (see
  acks.py: Faust's commit can pass one unacknowledged record), so a restarted worker re-reads
  everything its recovered state lacks;
* a persist's node record is written only after every output computed before it was delivered, so the
  recovered state never hides an output that was never published;
* outputs are published only after their node's high-water mark is durable; after recovery, outputs
  at or before the mark are held back and only the newest per key is published once reprocessing has
  passed the mark, so no subscriber ever sees an output older than one it already got (carrying the
  windows of the held-back ones: a closed window is in one publication only).

At a revocation the worker steps nothing more until the next assignment and waits (bounded) for the
persists and outputs under way, so none of its writes lands after the next owner read the changelogs;
the marks it wrote are remembered across rebalances, since a recovery misses one still on its way.

Input records arrive in batches. The core steps each record in order; the rules above then apply per
node of the batch: one mark (the newest output time of the node's outputs in the batch) is written, the
marks of all nodes of the batch in one hand-over to the producer, and the outputs are submitted to wait
for their mark; every record of the batch waits, unacknowledged, for the next persist of its node, and
those persists start only after the outputs were submitted (nothing is awaited in between). No log
line or metric update is made per record: they are counted per batch. While the worker catches up on a
node (catchup.catching_up: its records waited seconds on the broker, or a backlog stands behind them),
the core builds no views for its samples and its outputs are gathered, then published once it caught up
(a batch after which every input stream of its partition is read to its end, or one not catching up, or
no record of the node for GATHERED_QUIET_S) or before its next persist, whichever comes first, after the
views its samples ended with: the newest attribution and GPU state per key, every closed window and
every finding, which leave every subscriber where all the outputs would. The persist rule holds: a
persist publishes what was gathered, and the views, before it writes the state that computed them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from periscope.bus import codec
from periscope.bus.codec import DecodeError
from periscope.bus.topics import ALLOCATIONS, BY_NAME, INVENTORY, NODE_INPUTS, NODES, PODS, TELEMETRY, XID
from periscope.core.changes import carry_windows
from periscope.core.engine import (
    Counters,
    EngineConfig,
    advance,
    apply,
    mark_inputs,
    output_key,
    pause_views,
    refresh_views,
    resume_views,
)
from periscope.core.model import (
    AllocationSnapshot,
    DeviceInventory,
    NodeEvent,
    NodeInput,
    NodeTelemetry,
    Output,
    PodEvent,
)
from periscope.core.watermark import Stream
from services.joiner.acks import Ack, Held, OrderedAcks
from services.joiner.catchup import catching_up, is_one_shot, time_of
from services.joiner.changelog import StateError, TableIO, decode_mark, encode_mark, plan_persist, restore
from services.joiner.delivery import OutputSender, record_of
from services.joiner.metrics import JoinerMetrics
from services.joiner.positions import Positions
from services.joiner.slots import Message, Rejected, Slot, next_persist, node_of, periodic_due, state_mark

log = logging.getLogger(__name__)

INPUT_TOPICS = {t.name: t for t in NODE_INPUTS}
STREAM_OF_TOPIC: dict[str, Stream] = {
    ALLOCATIONS.name: Stream.ALLOCATIONS, TELEMETRY.name: Stream.TELEMETRY, XID.name: Stream.XID,
    INVENTORY.name: Stream.INVENTORY, PODS.name: Stream.PODS, NODES.name: Stream.NODES,
}
Flags = tuple[tuple[Stream, bool], ...]
ADOPT_YIELD_EVERY = 50  # nodes rebuilt between two yields to the event loop after a rebalance
# Outputs gathered while catching up on a node go out once no record of it came for this long.
GATHERED_QUIET_S = 1.0
# A persist takes milliseconds (a second or two for hundreds of nodes at once); one under way this long
# is waiting on the broker, and is named in the log.
SLOW_PERSIST_S = 10.0


@dataclass(slots=True)
class _Touched:
    """What one batch did to one node, applied once the whole batch is stepped."""

    slot: Slot
    before: Counters  # the node's engine counters when last counted into the metrics
    outs: list[Output] = field(default_factory=list)
    probe: bool = False  # a probe record arrived (the node is not quiet)
    persist: bool = False  # a state-based input changed the state: persist at once
    watermark_ms: int = 0  # the node's event time before the batch
    stamped: float = float("inf")  # the oldest broker timestamp (Unix s) of the node's records in the batch


async def _no_ack(topic: str, partition: int, offset: int) -> None:
    """Where nothing acknowledges input records (a worker fed by hand)."""


@dataclass(frozen=True, slots=True)
class Hooks:
    """Everything the worker calls outside itself at run time, given once at construction (the Faust
    app supplies them; tests give their own)."""

    dead_letter: Callable[[Message, str], Awaitable[None]]  # park a bad record with the reason
    on_error: Callable[[BaseException], Awaitable[None]]  # a failed write: crash the worker
    ack: Ack = _no_ack  # the input record at (topic, partition, offset) may be committed
    rebalancing: Callable[[], bool] = lambda: False
    # False for a record fetched before the latest rebalance (Faust's generation check).
    current: Callable[[Message], bool] = lambda msg: True
    # Told the first offset read from each input partition after a start or a rebalance.
    first_offset: Callable[[str, int, int], None] = lambda topic, partition, offset: None
    # Where an input partition ends on the broker (None: not known); with the worker's positions, whether
    # each of a partition's streams is at its end, which the core's event-time alignment needs
    # (core/watermark.py).
    end_of: Callable[[str, int], int | None] = lambda topic, partition: None
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time  # against records' broker timestamps (Unix s)
    # A record's broker timestamp (ms) -> event time: the identity, or a simulated clock's.
    event_ms_of: Callable[[float], int] = int


class Joiner:
    def __init__(self, *, config: EngineConfig, persist_interval_s: float, metrics: JoinerMetrics,
                 nodes: TableIO, pods: TableIO, marks: TableIO, sender: OutputSender, hooks: Hooks,
                 future_skew_ms: int = 600_000, stalled_after_s: float = 30.0,
                 positions: Positions | None = None) -> None:
        self.config = config
        # A record's event time may be at most this far ahead of the broker's time of it.
        self.future_skew_ms = future_skew_ms
        self.stalled_after_s = stalled_after_s
        self.persist_interval_s = persist_interval_s
        self.metrics = metrics
        self.nodes, self.pods, self.marks = nodes, pods, marks
        self.sender = sender
        self.hooks = hooks
        self._clock = hooks.clock
        self.slots: dict[str, Slot] = {}
        self.epoch = 0  # bumps on every rebalance: persists started before it are abandoned
        self.stopping = False
        self.revoked = False  # from a revocation to the next assignment
        # (topic, partition) -> last offset handled; shared with whoever watches the worker's progress.
        self.positions = Positions() if positions is None else positions
        self.processed = self.positions.processed  # (topic, partition) -> last offset handled
        self._flags: dict[int, Flags] = {}  # partition -> the at-end flags last told its nodes
        self._tasks: set[asyncio.Future[None]] = set()
        self._acks = OrderedAcks(hooks.ack)
        # node -> the newest mark this worker wrote. Kept across rebalances: a table recovery reads the
        # changelog only up to where it ended then, and a mark still on its way lands after that while
        # the outputs waiting for it are published. Holding back too much costs intermediate outputs
        # only (the newest per key is published at the end of the replay); too little, a key going back.
        self._marks_sent: dict[str, int] = {}
        self._was_catching = False  # at the last look, some node was being caught up on

    # ------------------------------------------------------------------ events

    async def handle(self, event: Any) -> None:
        await self.handle_batch([event])

    async def handle_batch(self, events: Sequence[Any]) -> None:
        """Apply a batch of input records in order. The core steps every record, but the bookkeeping
        (outputs and their mark, the persist decision, metrics) is done once per node of the batch."""
        if self.stopping or self.revoked:
            # Not acknowledged: read again after the restart, or by the partition's owner after the
            # rebalance (a batch taken before the revocation may reach here while it runs).
            return
        touched: dict[str, _Touched] = {}
        counts: dict[str, int] = {}
        # Dead letters and acks of records with nothing to join are sent after the batch: nothing is
        # awaited until its outputs are submitted, so no tick, persist or shutdown sees a node whose
        # records are stepped but whose outputs are not yet submitted.
        rejected: list[tuple[Message, str]] = []
        finished = self._acks.held()  # records done at once: nothing to join, or dead-lettered
        skipped = 0
        taken_at: dict[int, int] = {}  # partition -> offset of the batch's first telemetry record of it
        for event in events:
            msg: Message = event.message
            counts[msg.topic] = counts.get(msg.topic, 0) + 1
            if not self.hooks.current(msg):
                continue  # a record fetched before a rebalance: its partition's next owner reads it
            if msg.topic == TELEMETRY.name and msg.partition not in taken_at:
                taken_at[msg.partition] = msg.offset
            where = (msg.topic, msg.partition)
            if where not in self.processed:
                self.hooks.first_offset(msg.topic, msg.partition, msg.offset)
            self.processed[where] = msg.offset
            topic = INPUT_TOPICS.get(msg.topic) or BY_NAME.get(msg.topic)
            try:
                if topic is None:
                    raise DecodeError(f"topic {msg.topic} is not a joiner input")
                if msg.value is None:
                    raise DecodeError("record has no value")
                obj: NodeInput = codec.decode(topic, msg.value)
                node = node_of(msg.key, obj)
                self._plausible(obj, msg)
            except (DecodeError, Rejected) as e:
                rejected.append((msg, str(e)))
                self._acks.read(finished, msg.topic, msg.partition, msg.offset)
                continue
            if node is None:
                self._acks.read(finished, msg.topic, msg.partition, msg.offset)
                skipped += 1
                continue
            t = touched.get(node)
            if t is None:
                slot = self._slot(node, msg.partition)
                t = touched[node] = _Touched(slot, replace(slot.state.counters),
                                             watermark_ms=slot.state.watermark_ms)
                t.outs.extend(self._tell(slot, self._flags.get(slot.partition)))
            slot = t.slot
            state_input = isinstance(obj, (PodEvent, NodeEvent, AllocationSnapshot, DeviceInventory))
            mark = state_mark(slot.state) if state_input else None
            telemetry = obj if isinstance(obj, NodeTelemetry) else None
            # Older than the recovered state: a redelivery, whose drop is not a late sample (rare, so
            # counted on its own).
            redelivered = telemetry is not None and telemetry.meta.time_ms <= slot.recovered_ms
            if redelivered:
                self.metrics.count_engine(t.before, slot.state.counters, redelivered=False)
                t.before = replace(slot.state.counters)
            try:
                outs = apply(slot.state, obj, self.config)
            except Exception as e:  # a bug in the core must not stop every other node's attribution
                log.exception("node %s: the core failed on a %s record", node, msg.topic)
                rejected.append((msg, f"core error: {type(e).__name__}: {e}"))
                self._acks.read(finished, msg.topic, msg.partition, msg.offset)
                continue
            if redelivered:
                self.metrics.count_engine(t.before, slot.state.counters, redelivered=True)
                t.before = replace(slot.state.counters)
            if not isinstance(obj, (PodEvent, NodeEvent)):
                t.probe = True
                stamped = getattr(msg, "timestamp", None)
                if stamped and stamped < t.stamped:
                    t.stamped = stamped
            # Its position waits for the node's persist, for its acknowledgement (the record goes now).
            self._acks.read(slot.held, msg.topic, msg.partition, msg.offset)
            t.outs.extend(outs)
            if state_input and state_mark(slot.state) != mark:
                t.persist = True  # state-based inputs are persisted at once
        self._mark_partitions({t.slot.partition for t in touched.values()}, touched)
        self.metrics.batches.inc()
        for topic_name, n in counts.items():
            self.metrics.events_in.labels(topic_name).inc(n)
        now, wall = self._clock(), self.hooks.wall()
        live = list(touched.values())
        publish: list[tuple[Slot, list[Output], bool]] = []  # slot, outputs, whether its mark moved
        marks: list[tuple[bytes, bytes, int]] = []
        ends: dict[int, bool] = {}  # partition -> every input stream of it read to its end
        for t in live:
            slot = t.slot
            self.metrics.count_engine(t.before, slot.state.counters, redelivered=False)
            if t.probe:
                slot.last_probe = now
                if slot.state.watermark_ms > t.watermark_ms or not slot.advanced_at:
                    slot.advanced_at = now
            fresh = self._fresh(slot, t.outs)
            taken = self.backlog(slot.partition, taken_at.get(slot.partition))
            behind = catching_up(fresh, taken, wall - t.stamped)
            catching = not fresh or behind
            # Caught up once every input stream of the node's partition is read to its end (asked only
            # where the node is catching up): telemetry at its end is not enough, since alignment holds
            # samples until the allocation and pod streams are read, and releases them after.
            caught_up = catching and self._read_to_end(slot.partition, ends)
            if fresh or t.probe or taken is not None:  # (else the batch tells nothing of it)
                slot.catching = behind and not caught_up
            # Catching up, only the newest views of a key would go out: the core builds none until then.
            if slot.catching:
                pause_views(slot.state)
            elif slot.state.views_paused:
                fresh += self._fresh(slot, resume_views(slot.state, self.config))
                catching = behind
            fresh = self._outgoing(slot, fresh, catching, caught_up)
            if fresh:
                newest = max((time_of(o) for o in fresh if not is_one_shot(o)), default=0)
                moved = newest > slot.mark_ms
                if moved:
                    slot.mark_ms = self._marks_sent[slot.node] = newest
                    marks.append((slot.node.encode(), encode_mark(newest), slot.partition))
                publish.append((slot, fresh, moved))
        # Nothing was awaited since the first record was stepped, and nothing is until the outputs are
        # submitted: no timer tick, persist or shutdown runs in between.
        written = self.marks.put_many(marks) if marks else {}  # all nodes' marks in one hand-over
        for slot, fresh, moved in publish:
            self.sender.submit(written[slot.partition] if moved else None, slot.partition,
                               [record_of(o) for o in fresh])
        # Only now: a persist waits for every output submitted before it (see _complete).
        for t in live:
            slot = t.slot
            if t.persist or periodic_due(slot, now, self.persist_interval_s):
                self._persist(slot)
            else:
                slot.dirty = True
        if skipped:
            self.metrics.skipped.inc(skipped)
        for msg, error in rejected:
            await self.hooks.dead_letter(msg, error)
            self.metrics.dead_letters.labels(msg.topic).inc()
        # Done, but acknowledged only behind the records read before them (held for their persists).
        await self._acks.done(finished)

    def _slot(self, node: str, partition: int) -> Slot:
        slot = self.slots.get(node)
        if slot is not None:
            if slot.partition != partition:
                log.warning("node %s arrives on partition %d and %d: are the input topics co-partitioned?",
                            node, slot.partition, partition)
            return slot
        return self._take(self._restore(node, partition))

    def _restore(self, node: str, partition: int) -> Slot:
        key = node.encode()
        got = restore(node, self.nodes.get(key), lambda uid: self.pods.get(uid.encode()))
        mark = max(decode_mark(self.marks.get(key)), self._marks_sent.get(node, 0))
        return Slot(node=node, partition=partition, state=got.state, held=self._acks.held(), seq=got.seq,
                    versions=got.versions,
                    mark_ms=mark, replay_until_ms=mark if mark > got.state.processed_ms else 0,
                    recovered_ms=got.state.processed_ms, persisted_ms=got.state.processed_ms,
                    last_probe=self._clock(),
                    persist_due=next_persist(node, self._clock(), self.persist_interval_s))

    def _take(self, slot: Slot) -> Slot:
        if slot.seq:
            self.metrics.recoveries.inc()
            log.info("node %s: state recovered (persist %d, processed up to %d, outputs up to %d)",
                     slot.node, slot.seq, slot.state.processed_ms, slot.mark_ms)
        else:
            log.info("node %s: no stored state, starting afresh (partition %d)", slot.node, slot.partition)
        self.slots[slot.node] = slot
        self.metrics.nodes.set(len(self.slots))
        return slot

    async def adopt(self, partitions: Collection[int]) -> int:
        """After a rebalance: rebuild every stored node of `partitions` that no record brought back yet.
        Every record of a node may be committed already, and one that holds samples for the lateness or
        outputs held back after a crash waits on the worker, not on a record: the tick releases them
        once it is quiet. Returns how many were taken up."""
        epoch, taken = self.epoch, 0
        for i, (key, partition) in enumerate(self.nodes.keys_on(partitions)):
            if i and i % ADOPT_YIELD_EVERY == 0:
                await asyncio.sleep(0)  # a large assignment must not hold up the loop
                if epoch != self.epoch or self.stopping:
                    break  # another rebalance: it adopts anew
            node = key.decode("utf-8", "replace")
            if node in self.slots:
                continue  # a record of it came first
            try:
                slot = self._restore(node, partition)
            except StateError as e:
                log.error("node %s: stored state not readable (%s); it starts over with its next record",
                          node, e)
                continue
            self._take(slot)
            taken += 1
        return taken

    def _plausible(self, obj: NodeInput, msg: Message) -> None:
        """Reject a record stamped further ahead of the broker's time of it than the allowed skew."""
        stamped = getattr(msg, "timestamp", None)
        if not stamped or self.future_skew_ms <= 0:
            return
        ahead = obj.meta.time_ms - self.hooks.event_ms_of(stamped * 1000.0)
        if ahead > self.future_skew_ms:
            self.metrics.future_records.inc()
            raise Rejected(f"event time {obj.meta.time_ms} is {ahead / 1000:.0f}s ahead of the record's "
                           f"broker time (at most {self.future_skew_ms / 1000:.0f}s: PERISCOPE_FUTURE_SKEW)")

    def backlog(self, partition: int, since: int | None = None) -> int | None:
        """Telemetry records of `partition` on the broker from `since` (the batch's first offset of it,
        where given: a batch can read a partition to its end), else from the worker's position; None
        where the end or the position is not known."""
        end = self.hooks.end_of(TELEMETRY.name, partition)
        if since is None:
            since = self.positions.next(TELEMETRY.name, partition)
        return None if end is None or since is None else end - since

    def stalled(self) -> list[str]:
        """Nodes whose probe records keep arriving while their event time does not move."""
        now = self._clock()
        return sorted(s.node for s in self.slots.values()
                      if s.advanced_at and s.last_probe - s.advanced_at > self.stalled_after_s
                      and now - s.last_probe < self.stalled_after_s)

    # ------------------------------------------------------------------ input alignment

    def flags(self, partition: int) -> Flags:
        """Whether each input stream of `partition` is at its end: every record up to the broker's end
        offset handled (unknown ends count as not at the end, so a stream holds until told)."""
        out = []
        for topic, stream in STREAM_OF_TOPIC.items():
            end = self.hooks.end_of(topic, partition)
            position = self.positions.next(topic, partition)
            out.append((stream, end is not None and position is not None and position >= end))
        return tuple(out)

    def _read_to_end(self, partition: int, known: dict[int, bool]) -> bool:
        """Whether every input stream of `partition` is read to its end (memoized in `known`)."""
        done = known.get(partition)
        if done is None:
            done = known[partition] = all(at_end for _, at_end in self.flags(partition))
        return done

    def _tell(self, slot: Slot, flags: Flags | None) -> list[Output]:
        if not self.config.align or flags is None:
            return []
        return mark_inputs(slot.state, self.config, at_end=dict(flags))

    def _mark_partitions(self, partitions: Iterable[int], touched: dict[str, _Touched] | None = None
                         ) -> None:
        """Tell the nodes of `partitions` where their streams stand, when that changed; the outputs the
        core releases go with the batch's (`touched`) or out at once."""
        if not self.config.align:
            return
        changed = {}
        for p in partitions:
            flags = self.flags(p)
            if flags != self._flags.get(p):
                self._flags[p] = changed[p] = flags
        if not changed:
            return
        for slot in list(self.slots.values()):
            told = changed.get(slot.partition)
            if told is None:
                continue
            t = touched.get(slot.node) if touched is not None else None
            before = slot.state.counters if t is not None else replace(slot.state.counters)
            outs = self._tell(slot, told)
            if t is not None:
                t.outs.extend(outs)
            elif outs or before != slot.state.counters:
                slot.dirty = True
                self.metrics.count_engine(before, slot.state.counters, redelivered=False)
                self._emit(slot, outs)

    # ------------------------------------------------------------------ outputs

    def _fresh(self, slot: Slot, outs: Iterable[Output]) -> list[Output]:
        """The outputs to publish now; those at or before a recovered mark are held back instead, and
        a replay that passed the mark ends (its held-back outputs are submitted first)."""
        fresh: list[Output] = []
        for o in outs:
            if not is_one_shot(o) and time_of(o) <= slot.replay_until_ms:
                # Published before the crash (perhaps): keep the newest per key, with every window the
                # held-back ones closed, since each window is in one publication only.
                key = output_key(o)
                slot.stash[key] = carry_windows(slot.stash.get(key), o)
            else:
                fresh.append(o)
        if slot.replay_until_ms and slot.state.processed_ms >= slot.replay_until_ms:
            self._end_replay(slot)
        return fresh

    def _outgoing(self, slot: Slot, fresh: list[Output], catching: bool, caught_up: bool = True
                  ) -> list[Output]:
        """What to publish now of `fresh`: while catching up on the node (`catching`), nothing (they are
        gathered, see catchup.py) until the worker read the node's partition to its end (`caught_up`),
        then what was gathered and them, newest per key; live, what was gathered before them and them."""
        if catching and not caught_up:
            slot.gathered.add(fresh)
            return []
        if catching or slot.gathered:
            slot.gathered.add(fresh)
            return slot.gathered.take()
        return fresh

    def _emit(self, slot: Slot, outs: Iterable[Output]) -> None:
        """Publish `outs` of a node now, after whatever it gathered while catching up."""
        fresh = self._outgoing(slot, self._fresh(slot, outs), catching=False)
        if not fresh:
            return
        newest = max((time_of(o) for o in fresh if not is_one_shot(o)), default=0)
        mark = None
        if newest > slot.mark_ms:
            slot.mark_ms = self._marks_sent[slot.node] = newest
            # The same path as a batch's marks, so the marks changelog gets them in order.
            mark = self.marks.put_many([(slot.node.encode(), encode_mark(newest), slot.partition)])[
                slot.partition]
        self.sender.submit(mark, slot.partition, [record_of(o) for o in fresh])

    def _end_replay(self, slot: Slot) -> None:
        """Reprocessing has passed the mark: publish the newest held-back output of each key."""
        slot.replay_until_ms = 0
        if slot.stash:
            held = sorted(slot.stash.values(), key=time_of)
            slot.stash = {}
            self.sender.submit(None, slot.partition, [record_of(o) for o in held])

    # ------------------------------------------------------------------ timer

    def tick(self) -> None:
        """Release the samples of nodes that went quiet, end replays, persist what is due."""
        for line in self.slow_persists(SLOW_PERSIST_S, warn=True):
            log.warning("%s; its records are not acknowledged until it ends", line)
        if self.stopping or self.hooks.rebalancing():
            return
        self._mark_partitions({slot.partition for slot in self.slots.values()})
        now = self._clock()
        quiet_after = 2 * self.config.lateness_ms / 1000.0
        waits: dict[int, bool] = {}
        for slot in list(self.slots.values()):
            state = slot.state
            # Quiet: its probe, not this worker, stopped. A worker that lags (a takeover, a stall, a busy
            # machine) has the node's next samples waiting on the broker; releasing its held samples up to
            # their time plus the lateness would turn those into late samples, and drop them.
            quiet = now - slot.last_probe > quiet_after
            if quiet:
                if slot.partition not in waits:
                    # Telemetry of the partition may be on the broker, not handled yet: its end is not
                    # known since the assignment, or the worker is before it.
                    left = self.backlog(slot.partition)
                    waits[slot.partition] = left is None or left > 0
                quiet = not waits[slot.partition]
                if quiet:
                    slot.catching = False  # nothing of its partition waits: caught up on it
                    if state.views_paused:
                        self._emit(slot, resume_views(state, self.config))
            if quiet and state.pending:
                upto = max(p.meta.time_ms for p in state.pending) + self.config.lateness_ms
                before = replace(state.counters)
                slot.dirty = True
                try:
                    outs = advance(state, upto, self.config)
                except Exception:  # as in handle(): one node's failure must not stop the others
                    log.exception("node %s: the core failed releasing quiet samples", slot.node)
                    continue
                self.metrics.count_engine(before, state.counters, redelivered=False)
                self._emit(slot, outs)
            if slot.replay_until_ms and quiet:
                self._end_replay(slot)
            if slot.unpublished and now - slot.last_probe >= GATHERED_QUIET_S:
                # Its records stopped coming (where the partition's end is not known).
                self._emit(slot, refresh_views(state, self.config))
            if (slot.dirty or slot.held) and periodic_due(slot, now, self.persist_interval_s):
                self._persist(slot)

    def caught_up_again(self) -> bool:
        """True once each time the worker went from catching up on some node to catching up on none:
        the backlog's peak of memory (batches decoded ahead, outputs gathered) is over."""
        catching = any(slot.catching for slot in self.slots.values())
        was, self._was_catching = self._was_catching, catching
        return was and not catching

    # ------------------------------------------------------------------ persistence

    def _persist(self, slot: Slot) -> None:
        if self.stopping and not slot.held and not slot.dirty and not slot.unpublished:
            return
        if slot.persisting:
            slot.again = True
            return
        if slot.unpublished:  # the state persisted must not be ahead of what was published
            self._emit(slot, refresh_views(slot.state, self.config))
        slot.seq += 1
        plan = plan_persist(slot.state, slot.seq, slot.versions)
        held, slot.held = slot.held, self._acks.held()
        slot.dirty, slot.persisting = False, True
        slot.persist_started, slot.persist_warned = self._clock(), False
        slot.persisted_ms = slot.state.processed_ms
        slot.persist_due = next_persist(slot.node, self._clock(), self.persist_interval_s)
        pods = [(uid.encode(), rec, slot.partition) for uid, rec in plan.pods.items()]
        writes = list(self.pods.put_many(pods).values()) if pods else []  # one hand-over
        task = asyncio.ensure_future(
            self._complete(slot, plan.node, plan.removed, writes, held, self.epoch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _complete(self, slot: Slot, node_record: bytes, removed: list[str],
                        writes: list[Awaitable[Any]], held: Held, epoch: int) -> None:
        try:
            slot.waiting_for = "its pod records"
            await asyncio.gather(*writes)
            # A reader may stop at the first record of the last batch in a changelog partition: a
            # fence sent after the pod records guarantees that whoever sees this node record sees them.
            await self.pods.fence(slot.partition)
            slot.waiting_for = "the outputs submitted before it"
            await self.sender.barrier()
            if epoch != self.epoch:
                return  # a rebalance came in between: the next owner re-reads these events
            slot.waiting_for = "its node record"
            await self.nodes.put(slot.node.encode(), node_record, slot.partition)
            await self.nodes.fence(slot.partition)  # likewise: committed offsets imply this record is read
            for uid in removed:
                self.pods.delete(uid.encode(), slot.partition)
            slot.waiting_for = "the acknowledgement of its records"
            await self._acks.done(held)  # nothing, if a rebalance came since: they are read again
            self.metrics.persists.inc()
        except asyncio.CancelledError:
            # A stop or revocation that stopped waiting for it: no persist follows (at a stop, one
            # started now would write after the producer is gone, and fail the app as it ends).
            slot.again = False
            raise
        except Exception as e:
            log.error("node %s: persisting state failed: %r", slot.node, e)
            await self.hooks.on_error(e)
        finally:
            slot.persisting, slot.waiting_for = False, ""
            if slot.again and epoch == self.epoch and self.slots.get(slot.node) is slot:
                slot.again = False
                self._persist(slot)

    # ------------------------------------------------------------------ lifecycle

    def on_rebalance(self) -> None:
        """Partitions were revoked or assigned: forget every node; they are rebuilt from the tables."""
        self.epoch += 1
        self._acks.reset()
        self.slots.clear()
        self.processed.clear()
        self._flags.clear()
        self.metrics.nodes.set(0)

    def on_assigned(self) -> None:
        self.revoked = False
        self.on_rebalance()

    async def on_revoked(self, timeout_s: float) -> None:
        """Forget every node, and let outputs already promised reach the broker before the partitions
        move, so the next owner's outputs cannot overtake them."""
        self.revoked = True
        self.on_rebalance()
        try:
            await asyncio.wait_for(self.settle(), timeout_s)
        except Exception as e:  # a timeout, or a failed send (which crashes the app anyway)
            log.warning("outputs or state writes still pending at revocation: %r", e)

    def slow_persists(self, after_s: float, *, warn: bool = False) -> list[str]:
        """The persists under way for `after_s` or longer (with `warn`: each only once), and what each
        waits for: a persist that never ends holds its node's records unacknowledged."""
        now, out = self._clock(), []
        for slot in self.slots.values():
            took = now - slot.persist_started
            if slot.persisting and took >= after_s and not (warn and slot.persist_warned):
                if warn:
                    slot.persist_warned = True
                out.append(f"node {slot.node}: persist {slot.seq} under way for {took:.0f} s, "
                           f"waiting for {slot.waiting_for or 'its start'} "
                           f"({self.sender.backlog} output batch(es) undelivered)")
        return out

    async def settle(self) -> None:
        """Wait for the persists and outputs under way."""
        # Persists under way end at their epoch check (the rebalance), but the pod records they wrote
        # before it must reach the changelog before the next owner reads it: one landing after that
        # would be taken, at a later recovery, for the rows of that owner's persist of the same number.
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self.sender.barrier()

    async def shutdown(self) -> None:
        """Persist every node and wait, so the final offset commit covers all processed input."""
        if self.stopping:
            return
        self.stopping = True
        for slot in list(self.slots.values()):
            if slot.held or slot.dirty:
                if slot.persisting:
                    slot.again = True
                else:
                    self._persist(slot)
        await self.settle()
