"""RecordBatches' partition cache: the partitioner's answer, asked once per key, kept without a copy."""

from __future__ import annotations

import sys
import zlib
from types import SimpleNamespace

from services.joiner.delivery import RecordBatches


class Partitioner:
    """Faust's Producer.key_partition, as RecordBatches calls it (a TP with .partition)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.asked: list[tuple[str, bytes]] = []

    def key_partition(self, topic: str, key: bytes) -> SimpleNamespace:
        self.asked.append((topic, key))
        return SimpleNamespace(topic=topic, partition=zlib.crc32(key) % self.count)


def test_each_key_is_placed_as_the_partitioner_says_and_asked_once() -> None:
    producer = Partitioner(12)
    batches = RecordBatches(producer)
    uid = sys.intern("".join(["5e1c0002-4000-8000-0000-", "000000000007"]))  # as the core holds it
    keys = [uid.encode(), b"GPU-1", uid.encode(), "finding/\u00e9".encode()]
    got = [batches._partition("periscope.attribution.v1", 12, k) for k in keys]
    assert got == [zlib.crc32(k) % 12 for k in keys]
    assert producer.asked == [("periscope.attribution.v1", k) for k in (keys[0], keys[1], keys[3])]
    cached = batches._partitions["periscope.attribution.v1"][1]
    assert any(k is uid for k in cached)  # the core's own string, not a copy of the key per pod


def test_a_changed_partition_count_asks_again() -> None:
    producer = Partitioner(4)
    batches = RecordBatches(producer)
    batches._partition("t", 4, b"k")
    producer.count = 8
    assert batches._partition("t", 8, b"k") == zlib.crc32(b"k") % 8
    assert len(producer.asked) == 2
