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


class AckGate:
    """Lets through to Faust only the acknowledgements of input records that `OrderedAcks` released.

    Faust's stream acknowledges on its own every record it drops without yielding it: one fetched
    before the latest rebalance (an older generation), or read while flow control is off during one.
    Such a record was never handled, but its acknowledgement lands in the partition's fresh list after
    the revocation cleared it, where no committed offset guards it (see above), and the next commit
    passes it and every record before it that the worker had not persisted. Stopped here, the record
    stays unacknowledged, the commit stops before it, and the partition's owner reads it again.
    Installed as the consumer's `ack` (which Faust's messages call on their final acknowledgement)."""

    def __init__(self, ack: Callable[[Any], bool], topics: Iterable[str]) -> None:
        self._ack = ack
        self._topics = frozenset(topics)
        self._released: set[int] = set()  # id() of messages whose acknowledgement is ours
        self.held_back = 0  # acknowledgements Faust made on its own, stopped

    @classmethod
    def install(cls, consumer: Any, topics: Iterable[str]) -> AckGate:
        """Put a gate in front of `consumer.ack` (once; the same gate on a second call)."""
        current = consumer.ack
        if isinstance(current, AckGate):
            return current
        gate = cls(current, topics)
        consumer.ack = gate
        return gate

    def release(self, message: Any) -> None:
        """The worker acknowledges `message`: its acknowledgement may pass."""
        self._released.add(id(message))

    def forget(self, message: Any) -> None:
        """The worker's acknowledgement of `message` is over: its pass, if unused, goes (an id is reused
        once its object is gone)."""
        self._released.discard(id(message))

    def __call__(self, message: Any) -> bool:
        if message.topic in self._topics:
            if id(message) not in self._released:
                self.held_back += 1
                return False
            self._released.discard(id(message))
        return self._ack(message)
