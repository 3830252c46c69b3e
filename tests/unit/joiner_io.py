"""What the joiner's worker reads and writes, in memory, for its unit tests: Faust-shaped events and a
changelogged table (TableIO) that remembers its writes."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any


def done() -> asyncio.Future[None]:
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    fut.set_result(None)
    return fut


class Table:
    """A changelogged table as the joiner sees it (TableIO), in memory, remembering its writes."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.writes: list[bytes] = []
        self.partition_of: dict[bytes, int] = {}

    def get(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    def put(self, key: bytes, value: bytes, partition: int) -> asyncio.Future[None]:
        self.data[key] = value
        self.writes.append(key)
        self.partition_of[key] = partition
        return done()

    def put_many(self, items: list[tuple[bytes, bytes, int]]) -> dict[int, Any]:
        for key, value, partition in items:
            self.put(key, value, partition)
        return {p: done() for _, _, p in items}

    def delete(self, key: bytes, partition: int) -> asyncio.Future[None]:
        self.data.pop(key, None)
        self.partition_of.pop(key, None)
        return done()

    def keys_on(self, partitions: Collection[int]) -> list[tuple[bytes, int]]:
        return sorted((k, p) for k, p in self.partition_of.items() if p in partitions and k in self.data)

    def fence(self, partition: int) -> asyncio.Future[None]:
        return done()


@dataclass
class Msg:
    """The fields of a Faust message the worker reads (timestamp: the broker's, in seconds)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    generation_id: int = 1
    timestamp: float | None = None


@dataclass
class Event:
    message: Msg


def read(batch: list[Event]) -> list[Event]:
    """`batch` as a fetch hands it over: new message objects each time records are read (a worker may
    drop what it no longer needs of a message it took, such as its bytes once decoded)."""
    return [Event(replace(ev.message)) for ev in batch]
