"""Consuming domain objects from the bus, with bad records dead-lettered instead of crashing: the tests'
reference consumer (the services consume through their own loops: the joiner through Faust, the API in
services.api.consumer), so it lives in the development kit.

Offsets of a consumer group are committed after each batch has been handled (not on a timer), so a
crash re-delivers rather than loses records: at-least-once, which the state-based events absorb.
Exceptions raised by the handler are bugs, not bad input, and propagate to the caller.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord
from aiokafka.protocol.group import LeaveGroupRequest

from periscope.bus import codec
from periscope.bus.clients import Kafka
from periscope.bus.deadletter import DeadLetters
from periscope.bus.topics import Topic

log = logging.getLogger(__name__)

Handler = Callable[[Topic, str | None, Any, ConsumerRecord[bytes, bytes]], Awaitable[None]]


@dataclass
class ConsumerStats:
    consumed: int = 0  # records handed to the handler
    dead_lettered: int = 0  # records that did not decode
    last_error: str = ""
    ready: asyncio.Event = field(default_factory=asyncio.Event)  # set once partitions and positions are known


async def consume(kafka: Kafka, topics: Iterable[Topic], group_id: str | None, handler: Handler, *,
                  from_beginning: bool = True, dead_letters: DeadLetters | None = None, service: str,
                  stop: asyncio.Event | None = None, stats: ConsumerStats | None = None,
                  session_timeout_ms: int = 10_000, heartbeat_interval_ms: int = 3_000,
                  poll_ms: int = 200) -> ConsumerStats:
    """Decode every record of `topics` and `await handler(topic, key, obj, record)` until `stop` is set.

    Undecodable records (bad protobuf, invalid event, non-UTF-8 key) are counted and, when
    `dead_letters` is given, published to periscope.deadletter.v1; consumption goes on.
    """
    by_name = {t.name: t for t in topics}
    stats = stats if stats is not None else ConsumerStats()
    stop = stop if stop is not None else asyncio.Event()
    consumer = kafka.consumer(*by_name, client_id=service, group_id=group_id, from_beginning=from_beginning,
                              session_timeout_ms=session_timeout_ms,
                              heartbeat_interval_ms=heartbeat_interval_ms)
    await consumer.start()
    try:
        # Resolve the offset reset now, so `ready` means "records produced from here on will be seen".
        for tp in consumer.assignment():
            await consumer.position(tp)
        stats.ready.set()
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=poll_ms)
            for records in batches.values():
                for record in records:
                    await _handle(record, by_name[record.topic], handler, stats, dead_letters, service)
            if batches and group_id is not None:
                await consumer.commit()
    finally:
        if kafka.profile.leave_generation_zero:
            await _leave_generation_zero(consumer)
        await consumer.stop()
    return stats


async def _leave_generation_zero(consumer: AIOKafkaConsumer) -> None:
    """Send the LeaveGroup that aiokafka skips for generation 0 (brokers whose profile numbers a
    group's first generation 0, see periscope.bus.profile): without it, the next member of the group
    waits for this one's session to expire."""
    coordinator = getattr(consumer, "_coordinator", None)
    if coordinator is None or getattr(coordinator, "generation", None) != 0 or not coordinator.member_id:
        return
    try:
        await coordinator._send_req(LeaveGroupRequest(coordinator.group_id, coordinator.member_id))
    except Exception as e:  # best effort, like aiokafka's own leave
        log.debug("LeaveGroup for generation 0 failed: %s", e)


async def _handle(record: ConsumerRecord[bytes, bytes], topic: Topic, handler: Handler, stats: ConsumerStats,
                  dead_letters: DeadLetters | None, service: str) -> None:
    try:
        key = None if record.key is None else record.key.decode("utf-8")
        obj = codec.decode(topic, record.value or b"")
    except (codec.DecodeError, UnicodeDecodeError) as e:
        error = str(e) if isinstance(e, codec.DecodeError) else f"key is not UTF-8: {e}"
        stats.dead_lettered += 1
        stats.last_error = error
        log.warning("dead letter %s[%d]@%d: %s", record.topic, record.partition, record.offset, error)
        if dead_letters is not None:
            await dead_letters.send(record.topic, record.partition, record.offset, record.key,
                                    record.value or b"", error)
        return
    stats.consumed += 1
    await handler(topic, key, obj, record)
