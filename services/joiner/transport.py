"""Faust's aiokafka transport with a shorter consumer fetch wait.

Faust creates its worker consumer with `fetch_max_wait_ms=1500` and no setting to change it. The
embedded broker does not answer a waiting fetch as soon as a record arrives, so each hop into the
joiner could sit for a good part of that wait; a sample's way from probe to API is dominated by it.
A shorter wait costs an idle worker a few more empty fetches per second.
"""

from __future__ import annotations

from typing import Any

from faust.transport.drivers import aiokafka as faust_aiokafka


def transport_class(fetch_max_wait_ms: int) -> type[faust_aiokafka.Transport]:
    """An aiokafka Transport whose worker consumer waits at most `fetch_max_wait_ms` per fetch."""

    class ShortWaitThread(faust_aiokafka.AIOKafkaConsumerThread):
        def _create_worker_consumer(self, transport: Any) -> Any:
            consumer = super()._create_worker_consumer(transport)
            # Read by AIOKafkaConsumer.start() when it builds its fetcher, which happens after this.
            consumer._fetch_max_wait_ms = fetch_max_wait_ms
            return consumer

    class ShortWaitConsumer(faust_aiokafka.Consumer):
        def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
            return ShortWaitThread(self, loop=self.loop, beacon=self.beacon)

    class ShortWaitTransport(faust_aiokafka.Transport):
        Consumer = ShortWaitConsumer

    return ShortWaitTransport
