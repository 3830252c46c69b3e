"""Publishing domain objects to the bus.

Keys are UTF-8 strings (node name, pod UID, GPU UUID) and aiokafka's default partitioner (murmur2,
the same as the Java client and Faust) maps them to partitions, so every producer of a node-keyed
topic lands a node on the same partition. How records are batched, compressed and made idempotent is
the broker profile's business (periscope.bus.clients). Records carry the send time as their timestamp,
as a live probe's do; `send_many(..., event_time=True)` stamps each with its event's own time
instead, for publishing recorded or synthetic history.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from types import TracebackType

from periscope.bus import codec
from periscope.bus.clients import REQUEST_TIMEOUT_MS, Kafka
from periscope.bus.topics import Topic


class Publisher:
    def __init__(self, kafka: Kafka, client_id: str, *, linger_ms: int | None = None,
                 request_timeout_ms: int = REQUEST_TIMEOUT_MS, max_batch_bytes: int | None = None) -> None:
        self.kafka = kafka
        self.client_id = client_id
        self.sent = 0
        self._producer = kafka.producer(client_id, linger_ms=linger_ms, max_batch_bytes=max_batch_bytes,
                                        request_timeout_ms=request_timeout_ms)

    @property
    def bootstrap(self) -> str:
        return self.kafka.bootstrap

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def send(self, topic: Topic, key: str, value: object) -> None:
        """Encode and publish one object; returns once the broker acknowledged it."""
        await self.send_raw(topic.name, key.encode(), codec.encode(value))

    async def send_raw(self, topic_name: str, key: bytes | None, value: bytes) -> None:
        await self._producer.send_and_wait(topic_name, value, key=key)
        self.sent += 1

    async def send_many(self, topic: Topic, items: Iterable[tuple[str, object]], *,
                        event_time: bool = False) -> None:
        """Publish many objects in one round of batches; returns once all are acknowledged.

        With event_time, each record's timestamp is its object's `meta.time_ms` (events only)."""
        pending = [await self._producer.send(topic.name, codec.encode(v), key=k.encode(),
                                             timestamp_ms=_event_time(v) if event_time else None)
                   for k, v in items]
        await asyncio.gather(*pending)
        self.sent += len(pending)

    async def __aenter__(self) -> Publisher:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()


def _event_time(value: object) -> int:
    meta = getattr(value, "meta", None)
    if meta is None:
        raise TypeError(f"{type(value).__name__} has no event time (meta.time_ms)")
    ms: int = meta.time_ms
    return ms
