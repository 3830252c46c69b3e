"""What the joiner's worker reads and writes, in memory, for its unit tests: Faust-shaped events and a
changelogged table (TableIO) that remembers its writes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
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

    def get(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    def put(self, key: bytes, value: bytes, partition: int) -> asyncio.Future[None]:
        self.data[key] = value
        self.writes.append(key)
        return done()

    def put_many(self, items: list[tuple[bytes, bytes, int]]) -> dict[int, Any]:
        for key, value, _ in items:
            self.put(key, value, 0)
        return {p: done() for _, _, p in items}

    def delete(self, key: bytes, partition: int) -> asyncio.Future[None]:
        self.data.pop(key, None)
        return done()

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
