"""Dead letters: a record no consumer could decode goes to periscope.deadletter.v1 with the error,
the original bytes and where it came from, keyed by the original key.

`DeadLetters` is how every service sends them: its producer is started on the first dead letter
(most processes never need one) and stopped with the service.
"""

from __future__ import annotations

import time

from periscope.bus import codec
from periscope.bus.clients import Kafka
from periscope.bus.codec import DeadLetter
from periscope.bus.producer import Publisher
from periscope.bus.topics import DEADLETTER


async def dead_letter(publisher: Publisher, topic_name: str, partition: int, offset: int, key: bytes | None,
                      value: bytes, error: str, service: str) -> DeadLetter:
    letter = DeadLetter(topic=topic_name, partition=partition, offset=offset, key=key, value=value,
                        error=error, service=service, at_ms=int(time.time() * 1000))
    await publisher.send_raw(DEADLETTER.name, key, codec.encode(letter))
    return letter


class DeadLetters:
    """A service's dead-letter sender (client id `<client_id>`), connected on first use."""

    def __init__(self, kafka: Kafka, client_id: str, service: str) -> None:
        self.kafka, self.client_id, self.service = kafka, client_id, service
        self._publisher: Publisher | None = None

    async def send(self, topic_name: str, partition: int, offset: int, key: bytes | None, value: bytes,
                   error: str) -> DeadLetter:
        if self._publisher is None:
            publisher = Publisher(self.kafka, self.client_id)
            await publisher.start()
            self._publisher = publisher
        return await dead_letter(self._publisher, topic_name, partition, offset, key, value, error,
                                 self.service)

    async def stop(self) -> None:
        if self._publisher is not None:
            publisher, self._publisher = self._publisher, None
            await publisher.stop()
