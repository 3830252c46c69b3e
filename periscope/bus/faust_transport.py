"""Faust's aiokafka transport, set up for the broker profile: how the joiner's Faust app reaches Kafka.

Faust builds its clients itself and offers no settings for two things the profile decides:
- its worker consumer waits up to 1.5 s per fetch (hard-coded); the profile's fetch wait is used
  instead (a broker that does not answer a waiting fetch early makes a long wait cost latency);
- its producer is idempotent only inside transactions; with a profile whose broker has idempotence,
  every producer Faust makes (outputs and changelogs) asks for it, so a retried send after a lost
  acknowledgement is not written twice. Its producers are the project's (`clients.Producer`): each
  topic written to stays in the metadata refreshes, where aiokafka's could lose a changelog batch.

Its worker consumer also differs from Faust's in eight ways, whatever the profile:
- it subscribes only once the broker's metadata lists every topic it subscribes to. A topic just
  created (the tables' changelogs, at a first start) can be missing from it for a moment, and Faust's
  assignor leaves a missing topic out of the assignment until the next metadata refresh, minutes
  later: a table whose changelog is left out is never recovered, and the worker that takes over a
  node starts it from nothing;
- after a rebalance Faust seeks each partition to its committed offset, through aiokafka, which leaves
  a partition with none (or 0) wherever its fetcher was. Faust drops records fetched for a partition
  that is paused or whose flow stopped during a rebalance, and the fetcher has moved past them: they
  would never be read. Stream partitions without a committed offset are sought to their first offset;
- the fetched records Faust drops are read again: a partition whose fetched records Faust did not hand
  on (paused meanwhile, as a rebalance's table recovery pauses the stream partitions, or after its flow
  stopped) is sought back to the first of them, unless a rebalance or a seek moved it since (`Fetched`);
- it hands fetched records to the streams with one race per fetch, not per record (see `drain`);
- records of the app's direct topics (the joiner's inputs) go from each fetch to the app in batches,
  past Faust's conductor, stream and event objects (`Direct`);
- it seeks in the consumer's thread, not the caller's (where the seek raced the fetch);
- the seek to the committed offsets after an assignment does not hand a direct topic's records over a
  second time. Faust resumes the partitions before that seek, so a worker with a backlog is handed
  records while it runs; the seek then sets the read offsets back, and Faust would hand them over
  again (each stepped twice: its dead letters written twice, the repeats counted as late samples);
- its last commit at stop waits for one in flight and then commits, where Faust's would return at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from faust.transport.consumer import CONSUMER_FETCHING
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from periscope.bus.clients import Producer
from periscope.bus.profile import BrokerProfile

log = logging.getLogger(__name__)
YIELD_EVERY = 100  # records handed over between turns given to the event loop, as Faust does
METADATA_WAIT_S = 30.0  # the longest a subscription waits for its topics to show in the metadata


def transport_class(profile: BrokerProfile) -> type[faust_aiokafka.Transport]:
    """An aiokafka Transport whose clients behave as `profile` says."""
    fetch_max_wait_ms = profile.fetch_max_wait_ms

    class ProfileThread(faust_aiokafka.AIOKafkaConsumerThread):
        # Where the last fetch left its partitions (one fetch loop runs at a time).
        fetched_at: Fetched | None = None

        async def _fetch_records(self, consumer: Any, active_partitions: Any, timeout: float | None = None,
                                 max_records: int | None = None) -> Any:
            records = await super()._fetch_records(consumer, active_partitions, timeout=timeout,
                                                   max_records=max_records)
            self.fetched_at = Fetched.of(consumer, records)  # no await since the fetch: where it left them
            return records

        async def unread(self, fetched: Fetched, offsets: Mapping[Any, int]) -> None:
            """Seek each partition of `offsets` back to its offset, where nothing moved it since `fetched`
            (no rebalance, no seek)."""
            consumer = self._ensure_consumer()

            async def seek() -> None:
                # Checked and sought in the consumer's thread, where rebalances and seeks happen.
                for tp, offset in offsets.items():
                    if fetched.holds(consumer, tp):
                        consumer.seek(tp, offset)

            await self.call_thread(seek)

        def _create_worker_consumer(self, transport: Any) -> Any:
            consumer = super()._create_worker_consumer(transport)
            # Read by AIOKafkaConsumer.start() when it builds its fetcher, which happens after this.
            consumer._fetch_max_wait_ms = fetch_max_wait_ms
            return consumer

        async def subscribe(self, topics: Iterable[str]) -> None:
            wanted = set(topics)
            client = self._ensure_consumer()._client
            missing = await self.call_thread(listed, client.fetch_all_metadata, wanted, METADATA_WAIT_S)
            if missing:
                log.warning("topic(s) %s not in the broker's metadata after %.0fs: their partitions are "
                            "left out of assignments until a metadata refresh", ", ".join(sorted(missing)),
                            METADATA_WAIT_S)
            await super().subscribe(wanted)

    class ProfileConsumer(faust_aiokafka.Consumer):
        # Where the last seek_to_committed positioned each stream partition: its committed offset, or
        # its first offset where it has none or where retention removed the committed one.
        positioned: dict[TP, int] = {}
        # The last offset of each partition handed over to the app's direct take, in this generation.
        handed: dict[TP, int] = {}
        handed_generation: int | None = None
        # The commit the fetch loop started last (`commit_aside`), while it is under way.
        commit_aside_task: asyncio.Future[None] | None = None

        async def perform_seek(self) -> None:
            await super().perform_seek()
            # Not a step of its own: no hand-over runs between the reset of the read offsets and this.
            if self.handed_generation == self.app.consumer_generation_id:
                after_seek(self._read_offset, self.handed)

        async def getmany(self, timeout: float) -> AsyncIterator[tuple[TP, Any]]:
            # Faust drops what it fetched for a partition paused after the fetch began (the stream
            # partitions are paused while a rebalance recovers the tables), and the rest of a fetch
            # once its flow stops, when aiokafka has moved the partitions' positions past them. Faust's
            # seek to the committed offsets comes after it resumes the partitions: the fetcher went on
            # from where it was meanwhile, and handed over records after a hole (a worker catching
            # up on Apache Kafka, fetching 64 KiB at a time, lost the first hundreds of records of
            # a partition that way: the progress watch restarted it).
            thread: Any = self._thread  # a ProfileThread
            thread.fetched_at = None  # (no fetch when the flow is stopped)
            handed_on: dict[TP, int] = {}
            async for tp, message in super().getmany(timeout):
                handed_on[tp] = message.offset
                yield tp, message
            fetched = thread.fetched_at
            if fetched is not None and (dropped := not_handed_on(fetched.records, handed_on)):
                await thread.unread(fetched, dropped)

        def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
            return ProfileThread(self, loop=self.loop, beacon=self.beacon)

        async def seek_to_committed(self) -> Mapping[TP, int]:
            committed = await super().seek_to_committed()
            changelogs = self.app.tables.changelog_topics  # their readers position them themselves
            streams = [tp for tp in committed if tp.topic not in changelogs]
            first = await self.earliest_offsets(*streams) if streams else {}
            positioned, to_start = {}, {}
            for tp in streams:
                start = max(0, first.get(tp) or 0)
                if not committed[tp]:
                    to_start[tp] = start
                positioned[tp] = max(committed[tp] or 0, start)
            # One call for all: the consumer thread takes calls one at a time, each after the fetch under
            # way, so a seek a partition took a worker's fetch loop up to a second each (2.7 s for the
            # 24 stream partitions of a fresh group), and the fetcher went on from where it was meanwhile.
            await self._seek_all(to_start)
            for tp, start in to_start.items():
                self._read_offset[tp] = start or None  # as Faust's seek: read from there again
            self.positioned = positioned
            return committed

        async def _seek(self, partition: TP, offset: int) -> None:
            await self._seek_all({partition: offset})

        async def _seek_all(self, offsets: Mapping[TP, int]) -> None:
            # In the consumer's own thread, as Faust makes every other call into aiokafka. Faust's seek
            # runs in the caller's: aiokafka's Fetcher.seek_to then drops the partition's fetched records
            # while the consumer thread's fetched_records reads them (a KeyError that crashed a worker's
            # fetcher right after a rebalance, when seek_to_committed positions the partitions).
            if not offsets:
                return
            thread = self._thread

            async def seek() -> None:
                for tp, offset in offsets.items():
                    thread.seek(tp, offset)

            await thread.call_thread(seek)

        async def commit_and_end_transactions(self) -> None:
            # The last commit at stop. Faust's commit() returns at once when another is in flight
            # (the periodic one, busy flushing the producer), without committing what was acknowledged
            # since that one took its offsets: a clean stop would leave the final acknowledgements
            # uncommitted, and a restart would read them again (dead letters written twice).
            while await self.maybe_wait_for_commit_to_finish():
                pass
            await super().commit_and_end_transactions()

        async def _drain_messages(self, fetcher: Any) -> None:
            await drain(self, fetcher)

    class ProfileProducer(faust_aiokafka.Producer):
        @property
        def _producer_type(self) -> type[Producer]:
            return Producer

        def _settings_extra(self) -> Any:
            extra = dict(super()._settings_extra())
            if profile.idempotent:
                extra.update(acks="all", enable_idempotence=True)
            return extra

    class ProfileTransport(faust_aiokafka.Transport):
        Consumer = ProfileConsumer
        Producer = ProfileProducer

    return ProfileTransport


async def listed(fetch: Callable[[], Awaitable[Any]], topics: set[str], limit_s: float, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> set[str]:
    """Wait until the cluster metadata `fetch` returns (aiokafka's ClusterMetadata) lists every topic of
    `topics` with its partitions, at most `limit_s`; returns those still missing then."""
    deadline, delay = clock() + limit_s, 0.05
    while True:
        cluster = await fetch()
        missing = {t for t in topics if not cluster.partitions_for_topic(t)}
        if not missing or clock() >= deadline:
            return missing
        await sleep(delay)
        delay = min(2 * delay, 1.0)


async def drain(consumer: Any, fetcher: Any) -> None:
    """The worker consumer's fetch loop (the task Faust's Fetcher runs), in place of Faust's own.

    Faust hands each fetched record to the streams raced against the flow's suspension (a rebalance):
    four tasks and an `asyncio.wait` per record, about 70 us, most of what Faust costs the joiner per
    record. Here one race covers all the records of a fetch. The race is still needed: a hand-over
    waits while a stream's buffer is full, and only the suspension ends that wait for sure.
    As Faust's fetch does, the hand-overs stop at the first record taken before the flow stopped or
    from an older consumer generation: a rebalance positions the partitions again, and what was not
    handed over is fetched again. The rest is Faust's protocol too: a record below its partition's
    read offset is not handed over again, a skipped range on an acknowledged topic is a gap to commit
    past, and with `broker_commit_every` set a commit follows that many acknowledgements (started, not
    awaited: see `commit_aside`).
    """
    suspended = consumer.suspend_flow
    try:
        while not (consumer._stopped.is_set() or fetcher._stopped.is_set()):
            consumer.diag.set_flag(CONSUMER_FETCHING)
            # Taken out of the fetch first: a cancelled hand-over must not cancel a fetch under way.
            records = [record async for record in consumer.getmany(timeout=1.0)]
            await consumer.sleep(0)  # getmany may have had records at once, every time
            if records and not consumer.should_stop:
                await consumer.wait_first(_hand_over(consumer, records), suspended.wait())
            consumer.diag.unset_flag(CONSUMER_FETCHING)
    except (*consumer.consumer_stopped_errors, asyncio.CancelledError):
        if consumer.transport.app.should_stop:
            return  # the worker is stopping: the broker or a cancel ended the fetch
        raise
    except Exception as e:
        log.exception("draining fetched records failed: %r", e)
        raise
    finally:
        consumer.diag.unset_flag(CONSUMER_FETCHING)


def commit_aside(consumer: Any) -> None:
    """Start a commit of what was acknowledged, unless the one started here before is still under way;
    the fetch loop goes on meanwhile. Faust's commit first flushes the producer, so it lasts as long as
    every record handed to the producer takes to be delivered; Faust's fetch loop awaits it. A worker
    catching up on 2,050 nodes on Apache Kafka had every node's persist in the producer at once (the
    state records of each): its input stopped for 20 s, which the progress watch took for a stall. An
    acknowledged record's effects are delivered already (a persist acknowledges its records once its
    state records and the outputs before them are), so nothing waits on this commit."""
    task = consumer.commit_aside_task
    if task is None or task.done():
        consumer.commit_aside_task = asyncio.ensure_future(_commit(consumer))


async def _commit(consumer: Any) -> None:
    try:
        await consumer.commit()
    except asyncio.CancelledError:
        raise
    except Exception as e:  # as an awaited commit's failure ended the fetch loop, and so the worker
        log.exception("committing offsets failed: %r", e)
        await consumer.crash(e)


@dataclass(frozen=True, slots=True)
class Fetched:
    """A fetch's records (aiokafka's, by partition) and where it left their partitions: the aiokafka
    assignment it was made in (a new one at every rebalance) and each partition's position after it."""

    records: Mapping[Any, list[Any]]
    assignment: Any
    positions: Mapping[Any, int]

    @staticmethod
    def assignment_of(consumer: Any) -> Any:
        subscription = consumer._subscription.subscription
        return None if subscription is None else subscription.assignment

    @classmethod
    def of(cls, consumer: Any, records: Mapping[Any, Any]) -> Fetched | None:
        assignment = cls.assignment_of(consumer)
        if assignment is None:
            return None
        positions = {}
        for tp in records:
            state = assignment.state_value(tp)
            if state is not None and state.has_valid_position:
                positions[tp] = state.position
        return cls(records, assignment, positions)

    def holds(self, consumer: Any, tp: Any) -> bool:
        """Whether `tp` is where this fetch left it: same assignment, position not sought since."""
        if self.assignment_of(consumer) is not self.assignment:
            return False  # reassigned since: the new assignment positions its partitions itself
        state = self.assignment.state_value(tp)
        return bool(state is not None and state.has_valid_position
                    and state.position == self.positions.get(tp))


def not_handed_on(fetched: Mapping[Any, list[Any]], handed_on: Mapping[Any, int]) -> dict[Any, int]:
    """Partition -> the offset of its first fetched record that was not handed on, for the partitions of
    a fetch whose records were not all handed on (`handed_on`: the last offset handed on of each)."""
    out = {}
    for tp, records in fetched.items():
        last = handed_on.get(tp)
        if records and (last is None or records[-1].offset > last):  # (the usual fetch: all handed on)
            out[tp] = next(r.offset for r in records if last is None or r.offset > last)
    return out


def after_seek(read: MutableMapping[Any, int | None], handed: Mapping[Any, int]) -> None:
    """Read offsets after the seek to the committed ones, given the records of the same generation
    already handed over: those are not handed over again (the next to hand over follows them)."""
    for tp, offset in handed.items():
        r = read.get(tp)
        if r is None or r <= offset:
            read[tp] = offset + 1


@dataclass(frozen=True, slots=True)
class Direct:
    """Records of `topics` go from the fetch straight to `take`, in batches of at most `most`, in fetch
    order, instead of through Faust's conductor, stream and event objects (about 5 us of the joiner's
    45 us of CPU per device sample on a backlog). The app takes over what the stream did for them:
    acknowledgement (`Consumer.ack` per record) and the generation check. Set as `app.direct` before the
    worker starts."""

    topics: frozenset[str]
    take: Callable[[list[Any]], Awaitable[None]]  # Faust Messages
    most: int  # records per batch at most (the joiner's TAKE_MAX)
    # Awaited before each batch is handed over: the taker's flow control (as a stream's full buffer is
    # Faust's). A rebalance that ends the wait leaves the batch not handed over: it is fetched again.
    room: Callable[[], Awaitable[None]] | None = None


async def _hand_over(consumer: Any, records: list[tuple[Any, Any]]) -> None:
    """Hand a fetch's records over, in order, while the flow runs in their generation: records of the
    app's direct topics (`Direct`) in batches, the others to the streams one by one."""
    hand_over = consumer.callback
    read = consumer._read_offset
    acking = consumer.app.topics.acks_enabled_for
    since_yield = 0
    app = consumer.app
    direct: Direct | None = getattr(app, "direct", None)
    batch: list[Any] = []
    batched: dict[Any, int] = {}  # tp -> offset of its last record in the batch

    def current(message: Any) -> bool:
        return bool(consumer.flow_active) and message.generation_id == app.consumer_generation_id

    async def take() -> bool:
        """Hand the batch over; False where the flow stopped or the generation changed while the taker
        had no room (the records are fetched again)."""
        if direct.room is not None:  # type: ignore[union-attr]
            await direct.room()  # type: ignore[union-attr]
            if not current(batch[-1]):
                return False
        taken = batch[:]
        batch.clear()
        # `take` steps every record before its first await (nothing cancels a batch half stepped):
        # they count as handed over from here.
        read.update(batched)
        generation = app.consumer_generation_id
        if consumer.handed_generation != generation:
            consumer.handed, consumer.handed_generation = {}, generation
        consumer.handed.update(batched)
        batched.clear()
        await direct.take(taken)  # type: ignore[union-attr]
        # A turn for everything else on the loop (outputs, persists, the web server, the timers): a
        # fetch can bring many batches, and `take` need not wait for anything.
        await asyncio.sleep(0)
        return True

    for tp, message in records:
        if not current(message):
            return  # (a batch not taken is read again: its partition is positioned anew)
        since_yield += 1
        if since_yield > YIELD_EVERY and not batch:
            since_yield = 0
            await asyncio.sleep(0)
        offset, last = message.offset, batched.get(tp, read[tp])
        if last is not None and offset < last:
            continue  # handed over before
        # The bookkeeping is not part of a hand-over: the race does not cancel it (as in Faust's loop).
        if last and offset > last + 1 and acking(message.topic):
            await asyncio.shield(consumer._add_gap(tp, last + 1, offset))
        every = consumer._commit_every
        if every is not None and consumer._n_acked >= every:
            consumer._n_acked = 0
            commit_aside(consumer)
        if direct is not None and message.topic in direct.topics:
            batch.append(message)
            batched[tp] = offset
            if len(batch) >= direct.most and not await take():
                return
            continue
        if batch and (not await take() or not current(message)):
            return
        try:
            await hand_over(message)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise  # this fetch's hand-over is what was cancelled: the race, or a stop
            return  # a rebalance emptied the stream's buffer, ending the wait for room: so ends the fetch
        if not current(message):
            # The hand-over outlasted the flow or its generation (it waited across a rebalance, which
            # forgot the partition's read offset): the stream skips the record, and it is read again.
            return
        read[tp] = offset
    if batch:
        await take()
