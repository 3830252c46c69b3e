"""Faust's aiokafka transport with a shorter consumer fetch wait, and whole-batch sends of outputs.

Faust creates its worker consumer with `fetch_max_wait_ms=1500` and no setting to change it. The
embedded broker does not answer a waiting fetch as soon as a record arrives, so each hop into the
joiner could sit for a good part of that wait; a sample's way from probe to API is dominated by it.
A shorter wait costs an idle worker a few more empty fetches per second.
"""

from __future__ import annotations

from typing import Any

from faust.transport.drivers import aiokafka as faust_aiokafka

MAX_CACHED_KEYS = 200_000  # per output topic; the cache starts over beyond it (pods come and go)


def transport_class(fetch_max_wait_ms: int) -> type[faust_aiokafka.Transport]:
    """An aiokafka Transport whose worker consumer waits at most `fetch_max_wait_ms` per fetch."""

    class ShortWaitThread(faust_aiokafka.AIOKafkaConsumerThread):
        def _create_worker_consumer(self, transport: Any) -> Any:
            consumer = super()._create_worker_consumer(transport)
            # Read by AIOKafkaConsumer.start() when it builds its fetcher, which happens after this.
            consumer._fetch_max_wait_ms = fetch_max_wait_ms
            return consumer

    class ShortWaitConsumer(faust_aiokafka.Consumer):
        def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
            return ShortWaitThread(self, loop=self.loop, beacon=self.beacon)

    class ShortWaitTransport(faust_aiokafka.Transport):
        Consumer = ShortWaitConsumer

    return ShortWaitTransport


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
        # repeat every tick, and the partitioner's hash is pure Python.
        self._partitions: dict[str, tuple[int, dict[bytes, int]]] = {}

    def _partition(self, topic: str, count: int, key: bytes) -> int:
        known = self._partitions.get(topic)
        if known is None or known[0] != count or len(known[1]) > MAX_CACHED_KEYS:
            known = self._partitions[topic] = (count, {})
        partition = known[1].get(key)
        if partition is None:
            partition = known[1][key] = self._producer.key_partition(topic, key).partition
        return partition

    async def send(self, records: list[tuple[str, bytes, bytes]]) -> list[Any]:
        aio = self._producer._ensure_producer()  # Faust exposes no batch API of its own
        # Known metadata answers at once; the partitioner needs it, and its count keys the cache.
        counts = {topic: len(await aio.partitions_for(topic)) for topic in {r[0] for r in records}}
        placed = [(topic, self._partition(topic, counts[topic], key), key, value)
                  for topic, key, value in records]
        return [fut for _, fut in await self.send_to(placed)]

    async def send_to(self, records: list[tuple[str, int, bytes, bytes]]) -> list[tuple[int, Any]]:
        """Send (topic, partition, key, value) records, in order per partition; returns each record
        batch's partition and delivery future."""
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
