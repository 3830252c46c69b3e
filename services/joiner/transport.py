"""Whole-batch sends of the joiner's outputs and changelog records through Faust's producer."""

from __future__ import annotations

from typing import Any

MAX_CACHED_KEYS = 200_000  # per output topic; the cache starts over beyond it (pods come and go)


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
