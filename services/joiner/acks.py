"""Acknowledgement of input records to Faust: in offset order within each input partition.

The worker finishes records out of order: each node's records wait for that node's persist, nodes of one
partition persist at different times, and a dead-lettered record is done at once. Faust commits the
longest run of acknowledged offsets, but its gap check (`Consumer._new_offset` in faust-streaming
0.15) lets a run through that starts one past the committed offset, and checks nothing while the
committed offset is 0: with C committed and record C still unacknowledged, acknowledging C+1 commits
C+2. A takeover then resumes after a record that no persisted state includes, and its effect is lost.
So a record is acknowledged only once every record read before it on its partition is done; what is
handed to Faust is then always a contiguous run from where the partition was read, whatever its gap
check does. Commits are no later than before: Faust never commits past an unacknowledged record
anyway (outside that gap check), and this holds back exactly the acknowledgements behind one.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any


class _Entry:
    __slots__ = ("done", "event")

    def __init__(self, event: Any) -> None:
        self.event = event
        self.done = False


class OrderedAcks:
    """Records read but not yet acknowledged, per (topic, partition) in the order they were read."""

    def __init__(self, ack: Callable[[Any], Awaitable[Any]]) -> None:
        self._ack = ack
        self._open: dict[tuple[str, int], deque[_Entry]] = {}
        self._entries: dict[int, tuple[tuple[str, int], _Entry]] = {}  # id(event) -> its partition, entry
        self._lock = asyncio.Lock()  # acknowledgements leave in one order, whoever completes them
        self._resets = 0

    def read(self, event: Any) -> None:
        """`event` was read: it will be completed (done, or forgotten by a reset) in due course."""
        msg = event.message
        where = (msg.topic, msg.partition)
        entry = _Entry(event)
        self._open.setdefault(where, deque()).append(entry)
        self._entries[id(event)] = (where, entry)

    async def done(self, events: Iterable[Any]) -> None:
        """`events` are handled (their state is durable, or they have nothing to persist): acknowledge
        them and whatever they held back, each once every record read before it on its partition is."""
        async with self._lock:
            resets = self._resets
            touched = set()
            for event in events:
                # Unknown: read before the last reset (a rebalance); the partition's owner reads it again.
                found = self._entries.pop(id(event), None)
                if found is not None:
                    found[1].done = True
                    touched.add(found[0])
            for where in sorted(touched):
                waiting = self._open[where]
                while waiting and waiting[0].done and resets == self._resets:
                    await self._ack(waiting.popleft().event)
                if not waiting and self._open.get(where) is waiting:
                    del self._open[where]

    def reset(self) -> None:
        """Partitions were revoked or assigned: forget every record read; none of them is acknowledged
        (Faust forgets their partitions' acknowledgements too, and they are read again)."""
        self._open.clear()
        self._entries.clear()
        self._resets += 1
