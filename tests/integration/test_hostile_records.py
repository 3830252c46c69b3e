"""Red-team cases against every consumer: records at, just below and just above each size limit.

The limits, and what each one bounds:
- MAX_LETTER_BYTES (256 KiB, ours): a dead letter larger than this keeps a prefix of the record;
- PRODUCER_LIMIT (1 MiB, aiokafka's `max_request_size`, which every producer of ours keeps): the
  largest record our own producers send, dead letters included;
- KAFKA_BATCH_LIMIT (Apache Kafka's `message.max.bytes`, 1 MiB + 12 by default): the largest record
  batch the broker accepts; a record whose batch is larger is refused, so only the embedded broker
  (which has no limit) delivers records above it;
- FETCH_LIMIT (1 MiB, the consumers' `max_partition_fetch_bytes`; the joiner's on Apache Kafka and
  replay's probe read 64 KiB): a larger first record is still delivered whole by both brokers (KIP-74),
  which these tests rely on.

A hostile producer (its own `max_request_size` raised) writes undecodable records of each size; every
consumer must dead-letter each one, with a letter that fits, and go on: the joiner, the API's view
consumer, periscope.devkit.consumer.consume, and the replay reader (which skips and counts them).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import MessageSizeTooLargeError

from periscope.bus import codec
from periscope.bus import topics as T
from periscope.bus.clients import Kafka
from periscope.bus.codec import DeadLetter
from periscope.bus.deadletter import MAX_LETTER_BYTES, DeadLetters
from periscope.bus.producer import Publisher
from periscope.core.model import Meta, XidEvent
from periscope.devkit.consumer import ConsumerStats, consume
from periscope.replay.plan import ReadPlan
from periscope.replay.reader import read_inputs
from periscope.settings.api import ApiSettings
from services.api.server import ApiServer
from tests.integration.test_joiner import (
    NodeScript,
    OutputLog,
    Worker,
    caught_up,
    fresh_broker,
    publish_samples,
    publish_state,
    workers,
)
from tests.kafka_tier import settings_of
from tests.unit.test_api_samples import pod

MiB = 1 << 20
PRODUCER_LIMIT = MiB
KAFKA_BATCH_LIMIT = MiB + 12
# Value sizes (with a key of about 40 bytes): just below, at and above each limit. Apache Kafka's batch
# adds about 75 bytes to the value: 1048476 is the largest here it takes, 1048516 the smallest it refuses.
SIZES = {
    "letter limit - 1 KiB": MAX_LETTER_BYTES - 1024,
    "letter limit": MAX_LETTER_BYTES,
    "letter limit + 1": MAX_LETTER_BYTES + 1,
    "producer limit - 200": PRODUCER_LIMIT - 200,
    "Kafka batch limit, just below": PRODUCER_LIMIT - 100,
    "Kafka batch limit, just above": PRODUCER_LIMIT - 60,
    "producer limit": PRODUCER_LIMIT,
    "producer limit + 1": PRODUCER_LIMIT + 1,
    "2 MiB": 2 * MiB,
}


PARTITION: dict[bytes, int] = {}  # key -> the partition its hostile records went to


def garbage(size: int) -> bytes:
    return b"\xff" * size  # tag 31 of wire type 7: no protobuf parser takes it


async def hostile_records(kafka: Kafka, topic: str, key: bytes) -> dict[int, int]:
    """Write a garbage record of each size with a producer whose own limit is raised; the sizes the
    broker took (size -> offset). Apache Kafka must refuse exactly those above its batch limit."""
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, max_request_size=8 * MiB, acks="all",
                                max_batch_size=1, **kafka.security.aiokafka_kwargs())
    await producer.start()
    taken: dict[int, int] = {}
    try:
        for size in SIZES.values():
            try:
                md = await producer.send_and_wait(topic, garbage(size), key=key)
            except MessageSizeTooLargeError:
                assert kafka.profile.name == "kafka", f"the embedded broker refused {size} bytes"
                assert size > PRODUCER_LIMIT - 100, f"Apache Kafka refused {size} bytes"
                continue
            taken[size] = md.offset
            PARTITION[key] = md.partition
    finally:
        await producer.stop()
    if kafka.profile.name == "kafka":
        assert max(taken) == PRODUCER_LIMIT - 100  # the batch limit is where it is said to be
    else:
        assert len(taken) == len(SIZES)
    return taken


async def letters(kafka: Kafka, key: bytes, count: int, timeout_s: float = 60) -> list[DeadLetter]:
    """The dead letters keyed `key`, once there are `count` (read from the beginning)."""
    consumer = kafka.consumer(T.DEADLETTER.name, client_id="test-letters")
    await consumer.start()
    found: list[DeadLetter] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(found) < count:
            assert time.monotonic() < deadline, f"{len(found)} of {count} dead letters"
            for recs in (await consumer.getmany(timeout_ms=300)).values():
                for r in recs:
                    assert len(r.value or b"") <= MAX_LETTER_BYTES
                    if r.key == key:
                        found.append(codec.decode_dead_letter(r.value or b""))
    finally:
        await consumer.stop()
    return found


def check_letters(found: list[DeadLetter], taken: dict[int, int], topic: str, service: str) -> None:
    assert sorted(x.offset for x in found) == sorted(taken.values())
    by_offset = {x.offset: x for x in found}
    for size, offset in taken.items():
        x = by_offset[offset]
        assert x.topic == topic and x.service == service and x.error
        assert x.value_size == size and x.value_sha256 == hashlib.sha256(garbage(size)).digest()
        assert x.truncated == (len(x.value) < size) and garbage(size).startswith(x.value)
        assert x.truncated == (size > MAX_LETTER_BYTES - 1024), size  # whole when it fits


async def eventually(probe: Callable[[], Awaitable[Any]], timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (result := await probe()):
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.1)
    return result


# ---------------------------------------------------------------- periscope.devkit.consumer.consume


async def test_consume_dead_letters_every_size_and_goes_on(any_broker: Kafka, unique: str) -> None:
    node = f"node-{unique}"
    key = node.encode()
    taken = await hostile_records(any_broker, T.XID.name, key)
    sentinel = XidEvent(Meta(node, f"probe/{node}", 1, 1, 1_790_000_000_000), f"GPU-{unique}", 79)
    async with Publisher(any_broker, "test-probe") as pub:
        await pub.send(T.XID, node, sentinel)
    stop, seen = asyncio.Event(), []
    group = f"test-consume-{unique}"

    async def handler(topic: T.Topic, k: str | None, obj: Any, rec: Any) -> None:
        if k == node:
            seen.append(obj)
            stop.set()

    dead = DeadLetters(any_broker, f"test-dl-{unique}", "test")
    try:
        stats = await asyncio.wait_for(
            consume(any_broker, [T.XID], group, handler, dead_letters=dead, service="test", stop=stop,
                    stats=ConsumerStats()), 120)
    finally:
        await dead.stop()
    assert seen == [sentinel] and stats.dead_lettered >= len(taken)
    check_letters(await letters(any_broker, key, len(taken)), taken, T.XID.name, "test")
    # Acknowledged: the group's committed offsets moved past every hostile record.
    probe = AIOKafkaConsumer(bootstrap_servers=any_broker.bootstrap, group_id=group, enable_auto_commit=False,
                             **any_broker.security.aiokafka_kwargs())
    await probe.start()
    try:
        committed = await probe.committed(TopicPartition(T.XID.name, PARTITION[key]))
        assert (committed or 0) > max(taken.values())
    finally:
        await probe.stop()


# ---------------------------------------------------------------- the API's view consumer


async def test_the_api_dead_letters_every_size_and_goes_on(any_broker: Kafka, unique: str) -> None:
    uid = f"uid-{unique}"
    key = uid.encode()
    taken = await hostile_records(any_broker, T.ATTRIBUTION.name, key)
    async with Publisher(any_broker, "test-joiner") as pub:
        await pub.send(T.ATTRIBUTION, uid, pod(uid, f"ns-{unique}", "after-the-garbage", f"node-{unique}"))
    settings = ApiSettings(api_port=0, **settings_of(any_broker), api_group_prefix=f"test-api-{unique}-",
                           log_level="warning")
    server = ApiServer(settings)
    url = await server.start()
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:

            async def there() -> bool:
                return (await c.get(f"/v1/pods/{uid}")).status_code == 200

            await eventually(there, 120)
    finally:
        await server.stop()
    check_letters(await letters(any_broker, key, len(taken)), taken, T.ATTRIBUTION.name, "api")


# ---------------------------------------------------------------- the replay reader


async def test_replay_skips_and_counts_every_size(any_broker: Kafka, unique: str) -> None:
    node = f"node-{unique}"
    now = int(time.time() * 1000)
    taken = await hostile_records(any_broker, T.TELEMETRY.name, node.encode())
    warnings: list[str] = []
    plan = ReadPlan(anchor_ms=now - 60_000, to_ms=now + 60_000, node=node, late_slack_ms=1000)
    events, stats = await asyncio.wait_for(read_inputs(any_broker, plan, warn=warnings.append), 120)
    assert stats.bad_by_topic.get(T.TELEMETRY.name) == len(taken)
    assert len(warnings) == len(taken) and all(len(w) < 1000 for w in warnings)
    assert not [e for e in events if getattr(getattr(e, "meta", None), "node", None) == node]


# ---------------------------------------------------------------- the joiner


async def test_the_joiner_dead_letters_every_size_commits_past_it_and_goes_on(
        broker_kind: str, tmp_path: Path) -> None:
    node = NodeScript(f"gpu-{uuid.uuid4().hex[:6]}", 9)
    async with fresh_broker(broker_kind, tmp_path) as kafka:
        app_id = f"joiner-sizes-{broker_kind}"
        async with Publisher(kafka, "test-probe") as pub, OutputLog(kafka) as log:
            with workers(Worker(kafka, app_id, tmp_path, "w")) as (w,):
                await w.ready()
                await publish_state(pub, [node])
                await asyncio.sleep(0.5)
                await publish_samples([pub], [node], range(3))
                taken = await hostile_records(kafka, T.TELEMETRY.name, node.name.encode())
                await publish_samples([pub], [node], range(3, 8))
                await log.wait_for("samples after the garbage", caught_up([node], 7), timeout=60)
                await log.wait_for("dead letters", lambda lg: len(lg.dead_letters()) >= len(taken),
                                   timeout=30)
                metrics = w.metrics()
                assert w.stop() == 0
            # Acknowledged: a restart reads none of them again.
            with workers(Worker(kafka, app_id, tmp_path, "again")) as (again,):
                await again.ready()
                await publish_samples([pub], [node], range(8, 11))
                await log.wait_for("samples after the restart", caught_up([node], 10), timeout=60)
                after = again.metrics()
                assert again.stop() == 0
    check_letters(log.dead_letters(), taken, T.TELEMETRY.name, "joiner")
    assert metrics['periscope_joiner_dead_letters_total{topic="periscope.node.telemetry.v1"}'] == len(taken)
    assert after['periscope_joiner_events_in_total{topic="periscope.node.telemetry.v1"}'] == 3
    assert not any(k.startswith("periscope_joiner_dead_letters_total") for k in after)
