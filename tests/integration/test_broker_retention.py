"""Retention on each broker, and how the development kit bounds the embedded one's memory.

Apache Kafka deletes records past a topic's `retention.ms` (segment by segment). The embedded broker
(Tansu, memory storage) stores the setting and echoes it back, but never deletes anything, and has no
DeleteRecords (it panics and drops the connection): these tests pin that down, so that the profile's
`retention_applied` flag, and `periscope up`'s renewal of the broker, stay true to it. Renewal is what
frees the memory: a fresh, empty broker at the same address.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import NewTopic, RecordsToDelete
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaConnectionError, KafkaError

from periscope.bus.clients import Kafka
from periscope.bus.profile import EMBEDDED, KAFKA
from periscope.devkit.brokers import LocalBroker


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


async def _produce(kafka: Kafka, topic: str, count: int, size: int = 1000) -> None:
    producer = kafka.producer("retention-test", linger_ms=5, max_batch_bytes=64 * 1024)
    await producer.start()
    try:
        for i in range(count):
            await producer.send(topic, b"x" * size, key=str(i % 7).encode())
        await producer.flush()
    finally:
        await producer.stop()


async def _first_offset(kafka: Kafka, topic: str) -> int | None:
    """The offset of the first record a reader from the beginning gets (None: none at all)."""
    consumer = kafka.consumer(client_id="retention-test")
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        got = await consumer.getmany(tp, timeout_ms=3000, max_records=1)
        records = got.get(tp, [])
        return records[0].offset if records else None
    finally:
        await consumer.stop()


async def _create(kafka: Kafka, topic: str, configs: dict[str, str]) -> dict[str, str]:
    """Create `topic` with `configs`; the configs the broker then describes for it."""
    admin = kafka.admin("retention-test")
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1, topic_configs=configs)])
        described: dict[str, str] = {}
        for _ in range(50):  # a new topic's configs may take a moment to be described
            responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
            described = {e[0]: e[1] for r in responses for res in r.resources for e in res[4]}
            if described:
                break
            await asyncio.sleep(0.1)
        return described
    finally:
        await admin.close()


def test_the_profiles_say_which_broker_applies_retention() -> None:
    assert KAFKA.retention_applied and not EMBEDDED.retention_applied


async def test_both_brokers_take_the_settings_up_creates_topics_with(local_broker: LocalBroker,
                                                                    unique: str) -> None:
    configs = {"cleanup.policy": "delete", "retention.ms": "600000", "segment.ms": "150000"}
    described = await _create(local_broker.client(), f"retention-{unique}", configs)
    assert {k: described.get(k) for k in configs} == configs


async def test_the_embedded_broker_keeps_records_past_their_retention(broker: Kafka, unique: str) -> None:
    topic = f"kept-{unique}"
    configs = {"retention.ms": "1000", "segment.ms": "1000", "segment.bytes": "65536",
               "retention.bytes": "10000"}
    await _create(broker, topic, configs)
    await _produce(broker, topic, 500)
    await asyncio.sleep(4)  # four retention periods
    await _produce(broker, topic, 1)  # a segment roll, were there segments
    assert await _first_offset(broker, topic) == 0  # nothing was deleted


async def test_the_embedded_broker_has_no_delete_records(tmp_path: Path, unique: str) -> None:
    private = LocalBroker("embedded", tmp_path)  # it panics on the call: not on the shared broker
    private.start()
    try:
        topic, kafka = f"trim-{unique}", private.client()
        await _create(kafka, topic, {})
        await _produce(kafka, topic, 10)
        admin = kafka.admin("retention-test")
        await admin.start()
        try:
            with pytest.raises((KafkaConnectionError, KafkaError)):
                await admin.delete_records({TopicPartition(topic, 0): RecordsToDelete(before_offset=5)},
                                           timeout_ms=5000)
        finally:
            await admin.close()
        assert await _first_offset(kafka, topic) == 0
        assert "not yet implemented" in (private.log_path.read_text() if private.log_path else "")
    finally:
        private.stop()


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "mutual-tls"])
async def test_renewing_the_embedded_broker_frees_its_memory_at_the_same_address(
        tmp_path: Path, unique: str, secure: bool) -> None:
    local = LocalBroker("embedded", tmp_path, secure=secure)
    local.start()
    try:
        inner = local._mtls.broker if local._mtls is not None else local._embedded
        assert inner is not None and inner.pid is not None
        before_bootstrap, first_pid = local.bootstrap, inner.pid
        topic, kafka = f"big-{unique}", local.client()
        await _create(kafka, topic, {})
        started = _rss_mib(first_pid)
        await _produce(kafka, topic, 30_000)  # 30 MB of records
        grown = _rss_mib(first_pid)
        assert grown > started + 20, (started, grown)
        local.renew()
        assert local.bootstrap == before_bootstrap  # clients reconnect where they were
        assert inner.pid is not None and inner.pid != first_pid
        assert _rss_mib(inner.pid) < started + 10, (started, _rss_mib(inner.pid))
        await _create(kafka, topic, {})  # the topic went with the old broker: made again
        assert await _first_offset(kafka, topic) is None
    finally:
        local.stop()


def test_apache_kafka_is_never_renewed(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="applies retention"):
        LocalBroker("kafka", tmp_path).renew()
