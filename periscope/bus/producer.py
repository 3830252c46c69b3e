"""Publishing domain objects to the bus.

Keys are UTF-8 strings (node name, pod UID, GPU UUID) and aiokafka's default partitioner (murmur2,
the same as the Java client and Faust) maps them to partitions, so every producer of a node-keyed
topic lands a node on the same partition. The idempotent producer stays off: the embedded broker
does not implement InitProducerId. acks="all" is honoured by both brokers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from types import TracebackType

from aiokafka import AIOKafkaProducer

from periscope.bus import codec
from periscope.bus.topics import Topic


class Publisher:
    def __init__(self, bootstrap: str, client_id: str, *, acks: int | str = "all", linger_ms: int = 5,
                 request_timeout_ms: int = 30_000) -> None:
        self.bootstrap = bootstrap
        self.client_id = client_id
        self.sent = 0
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, client_id=client_id, acks=acks, enable_idempotence=False,
            linger_ms=linger_ms, request_timeout_ms=request_timeout_ms)

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

    async def send_many(self, topic: Topic, items: Iterable[tuple[str, object]]) -> None:
        """Publish many objects in one round of batches; returns once all are acknowledged."""
        pending = [await self._producer.send(topic.name, codec.encode(v), key=k.encode()) for k, v in items]
        await asyncio.gather(*pending)
        self.sent += len(pending)

    async def __aenter__(self) -> Publisher:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()
