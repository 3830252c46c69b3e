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

A record waiting for its acknowledgement is kept as its offset here and its number in its node's `Held`
(8 bytes each), not as the record: catching up on thousands of nodes, a worker holds hundreds of thousands of
records for their persists, and as objects they were a third of its memory, left fragmented after.
"""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Awaitable, Callable
from typing import Any

Where = tuple[str, int]  # (topic, partition)
Ack = Callable[[str, int, int], Awaitable[Any]]  # (topic, partition, offset): may be committed
COMPACT_AFTER = 4096  # acknowledged offsets kept at the front of a partition's list before it is cut


class Held:
    """Records read but not yet done, by where they were read (topic, partition) and their number in the
    order read there, of one generation of reads (a rebalance starts the next: records of an earlier one
    are read again, and never acknowledged)."""

    __slots__ = ("generation", "reads")

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.reads: dict[Where, array[int]] = {}

    def add(self, where: Where, number: int) -> None:
        got = self.reads.get(where)
        if got is None:
            got = self.reads[where] = array("q")
        got.append(number)

    def __len__(self) -> int:
        return sum(len(a) for a in self.reads.values())

    def __bool__(self) -> bool:
        return bool(self.reads)


class _Partition:
    """Offsets in the order read from one partition; read number `base + i` is `offsets[i]`, and those
    before `head` are acknowledged. (Numbers, not offsets, name a record: nothing assumes the offsets
    read are increasing.)"""

    __slots__ = ("base", "done", "head", "offsets")

    def __init__(self) -> None:
        self.offsets: array[int] = array("q")
        self.done = bytearray()
        self.base = self.head = 0

    def read(self, offset: int) -> int:
        self.offsets.append(offset)
        self.done.append(0)
        return self.base + len(self.offsets) - 1

    def finish(self, number: int) -> None:
        i = number - self.base
        if self.head <= i < len(self.offsets):
            self.done[i] = 1

    def compact(self) -> None:
        if self.head >= COMPACT_AFTER and self.head * 2 >= len(self.offsets):
            del self.offsets[:self.head]
            del self.done[:self.head]
            self.base += self.head
            self.head = 0


class OrderedAcks:
    """Records read but not yet acknowledged, per (topic, partition) in the order they were read."""

    def __init__(self, ack: Ack) -> None:
        self._ack = ack
        self._open: dict[Where, _Partition] = {}
        self._lock = asyncio.Lock()  # acknowledgements leave in one order, whoever completes them
        self.generation = 0  # bumps at every reset

    def read(self, held: Held, topic: str, partition: int, offset: int) -> None:
        """The record at `offset` was read, and waits in `held`: it will be completed (done, or forgotten
        by a reset) in due course."""
        where = (topic, partition)
        p = self._open.get(where)
        if p is None:
            p = self._open[where] = _Partition()
        held.add(where, p.read(offset))

    def held(self) -> Held:
        """An empty set of records of the current generation, to collect those read that wait."""
        return Held(self.generation)

    async def done(self, held: Held) -> None:
        """The records of `held` are handled (their state is durable, or they have nothing to persist):
        acknowledge them and whatever they held back, each once every record read before it on its
        partition is. Those of an earlier generation are forgotten (read again after the rebalance)."""
        async with self._lock:
            if held.generation != self.generation:
                return
            generation = self.generation
            for where, numbers in held.reads.items():
                p = self._open[where]
                for n in numbers:
                    p.finish(n)
            for where in sorted(held.reads):
                p = self._open[where]
                topic, partition = where
                while p.head < len(p.offsets) and p.done[p.head]:
                    offset = p.offsets[p.head]
                    p.head += 1
                    await self._ack(topic, partition, offset)
                    if generation != self.generation:
                        return
                p.compact()

    def reset(self) -> None:
        """Partitions were revoked or assigned: forget every record read; none of them is acknowledged
        (Faust forgets their partitions' acknowledgements too, and they are read again)."""
        self._open.clear()
        self.generation += 1
