"""Publishing domain objects to the bus.

Keys are UTF-8 strings (node name, pod UID, GPU UUID) and aiokafka's default partitioner (murmur2,
the same as the Java client and Faust) maps them to partitions, so every producer of a node-keyed
topic lands a node on the same partition. The idempotent producer stays off: the embedded broker
does not implement InitProducerId. acks="all" is honoured by both brokers. Records carry the send
time as their timestamp, as a live probe's do; `send_many(..., event_time=True)` stamps each with its
event's own time instead, for publishing recorded or synthetic history. `max_batch_size=1` keeps
send_many's records in batches of one, as `send` produces them (see the embedded broker's end offsets
in broker.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from types import TracebackType

from aiokafka import AIOKafkaProducer

from periscope.bus import codec
from periscope.bus.security import PLAINTEXT, KafkaSecurity
from periscope.bus.topics import Topic


class Publisher:
    def __init__(self, bootstrap: str, client_id: str, *, acks: int | str = "all", linger_ms: int = 5,
                 request_timeout_ms: int = 30_000, max_batch_size: int = 16384,
                 security: KafkaSecurity = PLAINTEXT) -> None:
        self.bootstrap = bootstrap
        self.client_id = client_id
        self.security = security
        self.sent = 0
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, client_id=client_id, acks=acks, enable_idempotence=False,
            linger_ms=linger_ms, request_timeout_ms=request_timeout_ms, max_batch_size=max_batch_size,
            **security.aiokafka_kwargs())

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
