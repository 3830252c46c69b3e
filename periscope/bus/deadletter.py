"""Dead letters: a record no consumer could decode goes to periscope.deadletter.v1 with the error,
the original bytes and where it came from, keyed by the original key.

`DeadLetters` is how every service sends them: its producer is started on the first dead letter
(most processes never need one) and stopped with the service.

A dead letter always fits. The record it copies may be as large as the broker allows (Apache Kafka's
`message.max.bytes`, 1 MiB + 12 by default; the embedded broker has no limit), and the copy adds the
topic, the error and more: sent whole it would be refused (by the producer's `max_request_size`,
1 MiB, or by the broker), and a consumer that cannot send its dead letter cannot acknowledge the bad
record either. So a letter is kept within `MAX_LETTER_BYTES`: a key, value or error that does not fit
is cut to a prefix, `truncated` says so, and `value_size`, `value_sha256` and `key_size` describe the
original (every letter carries them).
"""

from __future__ import annotations

import hashlib
import time

from periscope.bus import codec
from periscope.bus.clients import Kafka
from periscope.bus.codec import DeadLetter
from periscope.bus.producer import Publisher
from periscope.bus.topics import DEADLETTER

MAX_LETTER_BYTES = 256 * 1024  # the whole encoded letter: well inside every producer and broker limit
MAX_KEY_BYTES = 1024  # keys are node names, pod UIDs, GPU UUIDs
MAX_ERROR_CHARS = 2048
_ENVELOPE_BYTES = 512  # room for the fields besides key, value and error (topic, numbers, hash)


def letter(topic_name: str, partition: int, offset: int, key: bytes | None, value: bytes, error: str,
           service: str, at_ms: int, max_bytes: int = MAX_LETTER_BYTES) -> DeadLetter:
    """The dead letter of a record, cut to fit `max_bytes` when encoded."""
    key = key or b""
    error = error if len(error) <= MAX_ERROR_CHARS else error[:MAX_ERROR_CHARS] + " ..."
    kept_key = key[:MAX_KEY_BYTES]
    room = max(0, max_bytes - _ENVELOPE_BYTES - len(topic_name.encode()) - len(service.encode())
               - len(error.encode()) - len(kept_key))
    kept = value[:room]
    return DeadLetter(topic=topic_name, partition=partition, offset=offset, key=kept_key or None,
                      value=kept, error=error, service=service, at_ms=at_ms, value_size=len(value),
                      value_sha256=hashlib.sha256(value).digest(), key_size=len(key),
                      truncated=len(kept) < len(value) or len(kept_key) < len(key))


async def dead_letter(publisher: Publisher, topic_name: str, partition: int, offset: int, key: bytes | None,
                      value: bytes, error: str, service: str) -> DeadLetter:
    out = letter(topic_name, partition, offset, key, value, error, service, int(time.time() * 1000))
    # Keyed by the original key, cut like the letter's own copy of it.
    await publisher.send_raw(DEADLETTER.name, out.key, codec.encode(out))
    return out


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
