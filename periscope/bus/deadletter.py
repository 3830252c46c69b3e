"""Dead letters: a record no consumer could decode goes to periscope.deadletter.v1 with the error,
the original bytes and where it came from, keyed by the original key."""

from __future__ import annotations

import time

from periscope.bus import codec
from periscope.bus.codec import DeadLetter
from periscope.bus.producer import Publisher
from periscope.bus.topics import DEADLETTER


async def dead_letter(publisher: Publisher, topic_name: str, partition: int, offset: int, key: bytes | None,
                      value: bytes, error: str, service: str) -> DeadLetter:
    letter = DeadLetter(topic=topic_name, partition=partition, offset=offset, key=key, value=value,
                        error=error, service=service, at_ms=int(time.time() * 1000))
    await publisher.send_raw(DEADLETTER.name, key, codec.encode(letter))
    return letter
