"""Faust's aiokafka transport, set up for the broker profile: how the joiner's Faust app reaches Kafka.

Faust builds its clients itself and offers no settings for two things the profile decides:
- its worker consumer waits up to 1.5 s per fetch (hard-coded); the profile's fetch wait is used
  instead (a broker that does not answer a waiting fetch early makes a long wait cost latency);
- its producer is idempotent only inside transactions; with a profile whose broker has idempotence,
  every producer Faust makes (outputs and changelogs) asks for it, so a retried send after a lost
  acknowledgement is not written twice;
- after a rebalance it seeks each partition to its committed offset, through aiokafka, which leaves a
  partition with none (or 0) wherever its fetcher was. Faust drops records fetched for a partition
  that is paused or whose flow stopped during a rebalance, and the fetcher has moved past them: they
  would never be read. Stream partitions without a committed offset are sought to their first offset.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from periscope.bus.profile import BrokerProfile


def transport_class(profile: BrokerProfile) -> type[faust_aiokafka.Transport]:
    """An aiokafka Transport whose clients behave as `profile` says."""
    fetch_max_wait_ms = profile.fetch_max_wait_ms

    class ProfileThread(faust_aiokafka.AIOKafkaConsumerThread):
        def _create_worker_consumer(self, transport: Any) -> Any:
            consumer = super()._create_worker_consumer(transport)
            # Read by AIOKafkaConsumer.start() when it builds its fetcher, which happens after this.
            consumer._fetch_max_wait_ms = fetch_max_wait_ms
            return consumer

    class ProfileConsumer(faust_aiokafka.Consumer):
        # Where the last seek_to_committed positioned each stream partition: its committed offset, or
        # its first offset where it has none or where retention removed the committed one.
        positioned: dict[TP, int] = {}

        def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
            return ProfileThread(self, loop=self.loop, beacon=self.beacon)

        async def seek_to_committed(self) -> Mapping[TP, int]:
            committed = await super().seek_to_committed()
            changelogs = self.app.tables.changelog_topics  # their readers position them themselves
            streams = [tp for tp in committed if tp.topic not in changelogs]
            first = await self.earliest_offsets(*streams) if streams else {}
            positioned = {}
            for tp in streams:
                start = max(0, first.get(tp) or 0)
                if not committed[tp]:
                    await self.seek(tp, start)
                positioned[tp] = max(committed[tp] or 0, start)
            self.positioned = positioned
            return committed

    class ProfileProducer(faust_aiokafka.Producer):
        def _settings_extra(self) -> Any:
            extra = dict(super()._settings_extra())
            if profile.idempotent:
                extra.update(acks="all", enable_idempotence=True)
            return extra

    class ProfileTransport(faust_aiokafka.Transport):
        Consumer = ProfileConsumer
        Producer = ProfileProducer

    return ProfileTransport
