"""Delivery of the joiner's outputs: ordered publication, each batch only after its high-water mark is
durable, handed to the producer as whole record batches.

A batch carries the future of its node's mark write (the newest output time it contains, kept in a
changelogged table). Publishing waits for that write and then for a fence record appended to the same
changelog partition, so after any crash the recovered mark is at least as new as anything a consumer
has seen, and reprocessing never publishes an older state over a newer one. The fence is there for
brokers whose profile says a recovering worker may read a changelog only up to the first record of its
last producer batch (periscope.bus.profile): a record followed by a later, separately sent one is
always read. Elsewhere a fence is nothing to wait for. `barrier()` lets a persist wait until every
batch submitted before it was delivered.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from periscope.bus import codec
from periscope.bus.topics import ATTRIBUTION, FINDINGS, GPUS
from periscope.core.model import GpuState, Output, PodAttribution

log = logging.getLogger(__name__)

Record = tuple[str, bytes, bytes]  # topic name, key, value
# Hands records to the producer in order (per key order kept); the awaitables it returns complete when
# the broker has all of them.
SendFn = Callable[[list[Record]], Awaitable[list[Awaitable[Any]]]]
MAX_BATCHES = 500  # batches published behind one round of mark and fence writes
MAX_CACHED_KEYS = 200_000  # per output topic; the cache starts over beyond it (pods come and go)
# Output records submitted and not yet delivered beyond which the worker takes no more input (`room`).
# Live, a worker of 2,000 nodes has a few thousand on their way; catching up on them, the persists that
# start with it publish faster than the broker takes them, and the queue held 180,000 records (a third
# of the worker's memory at its peak, left fragmented after) for the minute the broker took.
MAX_UNDELIVERED = 20_000


def record_of(o: Output) -> Record:
    if isinstance(o, PodAttribution):
        return ATTRIBUTION.name, o.pod_uid.encode(), codec.encode(o)
    if isinstance(o, GpuState):
        return GPUS.name, o.gpu_uuid.encode(), codec.encode(o)
    return FINDINGS.name, o.key.encode(), codec.encode(o)


@dataclass(slots=True)
class _Batch:
    mark: Awaitable[Any] | None
    partition: int
    records: list[Record]
    done: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class OutputSender:
    def __init__(self, send: SendFn, fence: Callable[[int], Awaitable[Any]],
                 on_sent: Callable[[str, int], None],  # topic, records handed to the producer
                 on_error: Callable[[BaseException], Awaitable[None]],
                 max_undelivered: int = MAX_UNDELIVERED) -> None:
        self._send = send
        self.max_undelivered = max_undelivered
        self._records = 0  # records of the undelivered batches
        self._room = asyncio.Event()
        self._room.set()
        self._fence = fence
        self._on_sent = on_sent
        self._on_error = on_error
        self._queue: asyncio.Queue[_Batch] = asyncio.Queue()
        self._watching: set[asyncio.Future[None]] = set()
        # Batches are numbered as submitted. A barrier waits for a number, not on every batch before
        # it: every node's persist waits for one, and a worker that caught up on thousands of nodes
        # has thousands of persists behind thousands of batches (a wait on each batch per barrier was
        # quadratic, gigabytes of callbacks).
        self._submitted = 0
        self._undelivered = 0
        self._open: deque[tuple[int, asyncio.Future[None]]] = deque()  # oldest first; the first is not done
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()  # barriers, by the batch awaited

    def submit(self, mark: Awaitable[Any] | None, partition: int, records: list[Record]) -> None:
        """Publish `records` once `mark` (a write to the marks changelog `partition`) is durable."""
        batch = _Batch(mark, partition, records)
        self._submitted += 1
        self._undelivered += 1
        self._open.append((self._submitted, batch.done))
        self._records += len(records)
        if self._records > self.max_undelivered:
            self._room.clear()
        batch.done.add_done_callback(partial(self._settled, self._submitted, len(records)))
        self._queue.put_nowait(batch)

    @property
    def backlog(self) -> int:
        return self._undelivered

    @property
    def held_up(self) -> bool:
        """Whether input waits for room now."""
        return not self._room.is_set()

    async def room(self) -> None:
        """Wait while more than `max_undelivered` output records are on their way: input taken now would
        only add to them (flow control between the input and a broker that takes outputs more slowly)."""
        await self._room.wait()

    async def barrier(self) -> None:
        """Wait until every batch submitted so far has been delivered (raises if one of them failed)."""
        if not self._open:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((self._submitted, waiter))
        await waiter

    def _settled(self, number: int, records: int, done: asyncio.Future[None]) -> None:
        self._undelivered -= 1
        self._records -= records
        if self._records <= self.max_undelivered:
            self._room.set()
        if done.cancelled() or done.exception() is not None:
            # The barriers waiting for this batch end as a wait on it would: with its error.
            kept: deque[tuple[int, asyncio.Future[None]]] = deque()
            for upto, waiter in self._waiters:
                if upto < number:
                    kept.append((upto, waiter))
                elif not waiter.done():
                    if done.cancelled():
                        waiter.cancel()
                    else:
                        waiter.set_exception(done.exception())  # type: ignore[arg-type]
            self._waiters = kept
        while self._open and self._open[0][1].done():
            self._open.popleft()
        first_open = self._open[0][0] if self._open else self._submitted + 1
        while self._waiters and self._waiters[0][0] < first_open:
            _, waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    async def run(self) -> None:
        while True:
            batches = [await self._queue.get()]
            while not self._queue.empty() and len(batches) < MAX_BATCHES:
                batches.append(self._queue.get_nowait())
            try:
                await self._publish(batches)
            except asyncio.CancelledError:
                for b in batches:
                    b.done.cancel()
                raise
            except Exception as e:
                log.error("publishing outputs failed: %r", e)
                for b in batches:
                    if not b.done.done():
                        b.done.set_exception(e)
                await self._on_error(e)

    async def _publish(self, batches: list[_Batch]) -> None:
        marked = [b for b in batches if b.mark is not None]
        if marked:
            await asyncio.gather(*(b.mark for b in marked if b.mark is not None))
            await asyncio.gather(*(self._fence(p) for p in sorted({b.partition for b in marked})))
        # One hand-over for the whole round: the producer gets whole record batches, not a future per
        # record (per-record sends were most of the worker's producer time). A batch of this round
        # counts as delivered once the round is, which is what barrier() needs.
        records = [r for b in batches for r in b.records]
        futures = await self._send(records)
        sent: dict[str, int] = {}
        for topic, _, _ in records:
            sent[topic] = sent.get(topic, 0) + 1
        for topic, n in sent.items():
            self._on_sent(topic, n)
        task = asyncio.ensure_future(self._delivered(futures, [b.done for b in batches]))
        self._watching.add(task)
        task.add_done_callback(self._watching.discard)

    async def _delivered(self, futures: list[Awaitable[Any]], done: list[asyncio.Future[None]]) -> None:
        try:
            await asyncio.gather(*futures)
        except Exception as e:
            log.error("the broker did not take outputs: %r", e)
            for d in done:
                if not d.done():
                    d.set_exception(e)
            await self._on_error(e)
        else:
            for d in done:
                if not d.done():
                    d.set_result(None)


class RecordBatches:
    """Sends records through the app's producer as whole record batches, one per topic-partition.

    A record sent alone costs aiokafka a partitioner call, an accumulator lookup and a delivery future;
    at one PodAttribution and one GpuState per device sample that was most of a worker's producer time.
    Partitions come from the producer's own partitioner (as a plain send would choose them), and the
    batches of a partition are handed over in order, so per-key order is what it was.
    """

    def __init__(self, producer: Any) -> None:
        self._producer = producer  # Faust's aiokafka Producer
        # (topic, key) -> partition under the topic's partition count: keys (pod UIDs, GPU UUIDs)
        # repeat every tick, and the partitioner's hash is pure Python. Keyed by the interned text of
        # the key: the very string the core's state holds for that pod or GPU, where the bytes would
        # be a copy kept per key (some 140 bytes a pod-device row).
        self._partitions: dict[str, tuple[int, dict[str, int]]] = {}

    def _partition(self, topic: str, count: int, key: bytes) -> int:
        known = self._partitions.get(topic)
        if known is None or known[0] != count or len(known[1]) > MAX_CACHED_KEYS:
            known = self._partitions[topic] = (count, {})
        text = key.decode("utf-8", "surrogateescape")
        partition = known[1].get(text)
        if partition is None:
            partition = known[1][sys.intern(text)] = self._producer.key_partition(topic, key).partition
        return partition

    async def send(self, records: list[tuple[str, bytes, bytes]]) -> list[Any]:
        aio = self._producer._ensure_producer()  # Faust exposes no batch API of its own
        # Known metadata answers at once; the partitioner needs it, and its count keys the cache.
        counts = {topic: len(await aio.partitions_for(topic)) for topic in {r[0] for r in records}}
        placed = [(topic, self._partition(topic, counts[topic], key), key, value)
                  for topic, key, value in records]
        return [fut for _, fut in await self.send_to(placed)]

    async def send_to(self, records: Sequence[tuple[str, int, bytes, bytes | None]]) -> list[tuple[int, Any]]:
        """Send (topic, partition, key, value) records (value None: a tombstone), in order per
        partition; returns each record batch's partition and delivery future."""
        aio = self._producer._ensure_producer()
        futures: list[tuple[int, Any]] = []
        open_: dict[tuple[str, int], Any] = {}
        for topic, partition, key, value in records:
            builder = open_.get((topic, partition))
            if builder is None:
                builder = open_[(topic, partition)] = aio.create_batch()
            if builder.append(timestamp=None, key=key, value=value) is None:  # full: send, start anew
                futures.append((partition, await aio.send_batch(builder, topic, partition=partition)))
                builder = open_[(topic, partition)] = aio.create_batch()
                builder.append(timestamp=None, key=key, value=value)  # the first record always fits
        for (topic, partition), builder in open_.items():
            futures.append((partition, await aio.send_batch(builder, topic, partition=partition)))
        return futures
