"""The one place Kafka clients are built: every producer, consumer and admin client of every service,
replay and the tools comes from a `Kafka` connection (bootstrap, security, broker profile).

Settings that depend on the broker (idempotence, batching, compression, fetch waits) come from the
profile (periscope.bus.profile), security from periscope.bus.security; callers say only what their
use needs (a group, where to start, how large a fetch). The joiner's Faust application takes its
broker configuration from `faust_settings` and its transport from periscope.bus.faust_transport.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from periscope.bus.profile import KAFKA, BrokerProfile
from periscope.bus.security import PLAINTEXT, KafkaSecurity

REQUEST_TIMEOUT_MS = 30_000


class Producer(AIOKafkaProducer):  # type: ignore[misc]  # aiokafka is untyped
    """aiokafka's producer, with every topic it writes to kept in its client's metadata refreshes.

    aiokafka asks the broker for the metadata of every topic while its client follows none, and of
    the followed ones only after that; a topic it wrote to while known from the first kind of answer
    is not followed, and the next refresh forgets its partitions. A batch handed over just before
    such a refresh then has no leader and waits, asking again and again for metadata that never
    names its topic, until it expires and fails (the request timeout: 30 s for the services' own
    producers, 20 minutes for Faust's), and every flush behind it waits as long. A joiner worker's
    first pod-record write was held that way: its persist did not end and the worker did not stop.
    Following a topic from its first send closes that gap.
    """

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self._followed: set[str] = set()

    def _follow(self, topic: str) -> None:
        if topic not in self._followed:
            self._followed.add(topic)
            self.client.add_topic(topic)  # the refresh it starts needs no wait: the sender retries

    async def send(self, topic: str, *args: Any, **kwargs: Any) -> Any:
        self._follow(topic)
        return await super().send(topic, *args, **kwargs)

    async def send_batch(self, batch: Any, topic: str, *, partition: int) -> Any:
        self._follow(topic)
        return await super().send_batch(batch, topic, partition=partition)


@dataclass(frozen=True, slots=True)
class Kafka:
    """How to reach the broker: what every client is built from."""

    bootstrap: str
    security: KafkaSecurity = PLAINTEXT
    profile: BrokerProfile = KAFKA

    def with_bootstrap(self, bootstrap: str) -> Kafka:
        return replace(self, bootstrap=bootstrap)

    def _common(self, client_id: str) -> dict[str, Any]:
        # Built per client, so a client made after a password file was rotated uses the new password.
        return {"bootstrap_servers": self.bootstrap, "client_id": client_id,
                **self.security.aiokafka_kwargs()}

    def producer_settings(self, *, linger_ms: int | None = None, max_batch_bytes: int | None = None
                          ) -> dict[str, Any]:
        """Producer behaviour for this broker: acks from every in-sync replica, idempotence where the
        broker has it, batching and compression as the profile says."""
        p = self.profile
        if max_batch_bytes is None:  # the first record always fits: 1 byte means a batch per record
            max_batch_bytes = 1 if p.one_record_batches else p.max_batch_bytes
        if linger_ms is None:
            # A batch that holds one record cannot fill by waiting, and aiokafka keeps one open batch per
            # partition: each record would wait out the linger behind the one before it (1,289 records
            # to 4 partitions took 12 s at 20 ms, 1 s at 0).
            linger_ms = 0 if max_batch_bytes == 1 else p.linger_ms
        return {"acks": "all", "enable_idempotence": p.idempotent, "compression_type": p.compression,
                "linger_ms": linger_ms, "max_batch_size": max_batch_bytes}

    def producer(self, client_id: str, *, linger_ms: int | None = None, max_batch_bytes: int | None = None,
                 request_timeout_ms: int = REQUEST_TIMEOUT_MS) -> Producer:
        behaviour = self.producer_settings(linger_ms=linger_ms, max_batch_bytes=max_batch_bytes)
        return Producer(**self._common(client_id), request_timeout_ms=request_timeout_ms, **behaviour)

    def consumer(self, *topics: str, client_id: str, group_id: str | None = None,
                 from_beginning: bool = True, fetch_max_wait_ms: int | None = None,
                 **options: Any) -> AIOKafkaConsumer:
        """A consumer that never commits on a timer (callers commit after handling, or not at all).
        `options` are further aiokafka consumer settings of the caller's use (fetch sizes, sessions)."""
        wait = self.profile.fetch_max_wait_ms if fetch_max_wait_ms is None else fetch_max_wait_ms
        return AIOKafkaConsumer(*topics, **self._common(client_id), group_id=group_id,
                                enable_auto_commit=False, fetch_max_wait_ms=wait,
                                auto_offset_reset="earliest" if from_beginning else "latest",
                                request_timeout_ms=REQUEST_TIMEOUT_MS, **options)

    def admin(self, client_id: str) -> AIOKafkaAdminClient:
        return AIOKafkaAdminClient(**self._common(client_id), request_timeout_ms=REQUEST_TIMEOUT_MS)

    def faust_settings(self) -> dict[str, Any]:
        """The broker part of a faust.App's settings (the transport comes from faust_transport)."""
        p = self.profile
        return {
            "broker": [f"kafka://{h.strip()}" for h in self.bootstrap.split(",") if h.strip()],
            # Faust passes these to every client it creates: consumer, producer (changelogs too), admin.
            "broker_credentials": self.security.faust_credentials(),
            "producer_acks": -1,
            "producer_compression_type": p.compression,
            "producer_linger": p.linger_ms / 1000,
            "producer_max_batch_size": p.max_batch_bytes,
            "consumer_max_fetch_size": p.fetch_partition_bytes,
        }
