"""Readiness counts every joiner output as fresh data: with publication on change plus a heartbeat, a quiet
cluster may send nothing but GPU states or findings for a while, and is still live."""

from __future__ import annotations

from typing import Any

from aiokafka import ConsumerRecord

from periscope.bus import codec
from periscope.bus import topics as t
from periscope.bus.clients import Kafka
from periscope.core.model import DeviceInventory, Finding, GpuInfo, NodeEvent
from services.api.consumer import ViewConsumer
from services.api.view import View
from tests.unit.test_api_samples import GPU_A0, T0, gpu, meta, pod


def _record(topic: t.Topic, obj: object, offset: int = 0) -> ConsumerRecord[Any, Any]:
    value = codec.encode(obj)
    return ConsumerRecord(topic.name, 0, offset, 0, 0, b"k", value, None, 1, len(value), ())


def consumer() -> ViewConsumer:
    """A consumer that has read the probe's inventory (the API believes GPU states of reported GPUs only)."""
    c = ViewConsumer(View(), Kafka("127.0.0.1:1"), dead_letters=False)
    inventory = DeviceInventory(meta(T0 - 60_000, "gpu-a"), (GpuInfo(GPU_A0, 0),))
    c.evidence.learn(inventory)
    return c


async def _freshened(topic: t.Topic, obj: object) -> bool:
    c = consumer()
    await c._handle(_record(topic, obj))
    return c.status.newest_at is not None


async def test_each_kind_of_joiner_output_counts_as_fresh() -> None:
    finding = Finding(kind="source-health", key="n", node="gpu-a", at_ms=T0, id="source-health/n")
    assert await _freshened(t.ATTRIBUTION, pod("u1"))
    assert await _freshened(t.GPUS, gpu(GPU_A0))
    assert await _freshened(t.FINDINGS, finding)


async def test_a_repeat_is_not_news() -> None:
    c = consumer()
    await c._handle(_record(t.GPUS, gpu(GPU_A0)))
    c.status.newest_at = None
    await c._handle(_record(t.GPUS, gpu(GPU_A0), 1))  # the same state delivered again
    assert c.status.newest_at is None
    await c._handle(_record(t.GPUS, gpu(GPU_A0, as_of=T0 + 5000), 2))  # a heartbeat: news
    assert c.status.newest_at is not None


async def test_cluster_topics_are_not_joiner_outputs() -> None:
    assert not await _freshened(t.NODES, NodeEvent(meta=meta(T0, "gpu-a"), name="gpu-a"))
