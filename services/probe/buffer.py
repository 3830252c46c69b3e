"""Bounded outgoing buffer that decides what to lose when the broker is unreachable.

Messages leave in the order they were produced. When the buffer is full, the victim is chosen by
value to the consumers: the oldest telemetry sample first (the next one replaces it), then the
oldest superseded state snapshot (an inventory or allocation snapshot with a newer one of the same
kind behind it), and only then the oldest XID. The newest allocation snapshot and the newest
inventory are never dropped, so a reconnecting probe always delivers the current state.
"""

from __future__ import annotations

import contextlib
from collections import Counter, deque
from dataclasses import dataclass
from enum import StrEnum

from periscope.bus.topics import Topic


class Kind(StrEnum):
    TELEMETRY = "telemetry"
    ALLOCATION = "allocation"
    INVENTORY = "inventory"
    XID = "xid"


_STATE_KINDS = (Kind.ALLOCATION, Kind.INVENTORY)


@dataclass(frozen=True, slots=True, eq=False)  # identity: two equal samples are still two messages
class Outgoing:
    kind: Kind
    topic: Topic
    key: str
    value: object


class OutBuffer:
    def __init__(self, limit: int) -> None:
        if limit < 2:
            raise ValueError("buffer limit must be at least 2 (one allocation snapshot + one inventory)")
        self.limit = limit
        self._items: deque[Outgoing] = deque()
        self.dropped: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._items)

    def items(self) -> list[Outgoing]:
        """What is waiting, oldest first (a copy)."""
        return list(self._items)

    def push(self, msg: Outgoing) -> Outgoing | None:
        """Append `msg`; if the buffer overflows, drop one message and return it."""
        self._items.append(msg)
        if len(self._items) <= self.limit:
            return None
        victim = self._victim()
        self._items.remove(victim)
        self.dropped[victim.kind.value] += 1
        return victim

    def _victim(self) -> Outgoing:
        items = self._items
        for m in items:
            if m.kind is Kind.TELEMETRY:
                return m
        newest = {k: self._newest(k) for k in _STATE_KINDS}
        for m in items:
            if m.kind in _STATE_KINDS and m is not newest[m.kind]:
                return m
        for m in items:
            if m.kind is Kind.XID:
                return m
        return items[0]  # unreachable with limit >= 2: only the two newest state snapshots remain

    def _newest(self, kind: Kind) -> Outgoing | None:
        for m in reversed(self._items):
            if m.kind is kind:
                return m
        return None

    def peek(self) -> Outgoing | None:
        return self._items[0] if self._items else None

    def pop(self) -> Outgoing:
        return self._items.popleft()

    def discard(self, msg: Outgoing) -> None:
        """Remove `msg` once sent (it may have moved from the head, or been dropped meanwhile)."""
        with contextlib.suppress(ValueError):
            self._items.remove(msg)
