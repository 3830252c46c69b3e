"""Faust acknowledges on its own the input records its stream drops (fetched before the latest
rebalance, or read while flow control is off); after a revocation nothing guards those acknowledgements,
and the next commit passed every earlier record the worker had not persisted. The gate in front of the
consumer's `ack` lets only the worker's own acknowledgements through. Faust's real `Consumer.ack`,
`_new_offset` and `ConsumerMessage` do the bookkeeping here."""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

from faust.transport.consumer import Consumer
from faust.types import TP
from faust.types.tuples import ConsumerMessage
from intervaltree import IntervalTree

from services.joiner.acks import AckGate

INPUT = "periscope.telemetry.v1"
OTHER = "some-other-topic"
tp = TP(INPUT, 0)


class _Topics:
    def acks_enabled_for(self, topic: str) -> bool:
        return True


class _App:
    topics = _Topics()


class FaustConsumer:
    """The state Faust's `Consumer.ack` and `_new_offset` read, as right after partition 0 was revoked
    and assigned again: its committed offset and acknowledgements forgotten."""

    def __init__(self) -> None:
        self.app = _App()
        self._acked: defaultdict[Any, list[int]] = defaultdict(list)
        self._acked_index: defaultdict[Any, set[int]] = defaultdict(set)
        self._gap: defaultdict[Any, IntervalTree] = defaultdict(IntervalTree)
        self._committed_offset: defaultdict[Any, int | None] = defaultdict(lambda: None)
        self._unacked_messages: set[Any] = set()
        self._waiting_for_ack: Any = None
        self._n_acked = 0
        self._lock = threading.Lock()

    def ack(self, message: Any) -> bool:
        return Consumer.ack(self, message)  # type: ignore[arg-type]

    def commit(self) -> int | None:
        offset = Consumer._new_offset(self, tp)  # type: ignore[arg-type]
        if offset is not None:
            self._committed_offset[tp] = offset
        return self._committed_offset[tp]


def message(offset: int, topic: str = INPUT) -> ConsumerMessage:
    m = ConsumerMessage(topic, 0, offset, 0.0, 0, None, b"node", b"", None, tp=TP(topic, 0))
    m.refcount = 1  # delivered to one stream
    return m


def test_without_the_gate_faust_commits_past_a_record_nobody_handled() -> None:
    c = FaustConsumer()
    message(5).ack(c)  # an older generation's record at 5, dropped by the stream: Faust acks it itself
    assert c.commit() == 6  # ... and the records 0-4 the new owner is still working on are passed


def test_the_gate_stops_faust_own_acknowledgements_and_lets_the_workers_through() -> None:
    c = FaustConsumer()
    gate = AckGate.install(c, [INPUT])
    assert AckGate.install(c, [INPUT]) is gate  # installed once
    dropped = message(5)
    dropped.ack(c)
    assert c.commit() is None and gate.held_back == 1  # nothing committed: 0-4 are read again
    for offset in range(5):  # the worker persisted 0-4 and acknowledges them, in order
        m = message(offset)
        gate.release(m)
        m.ack(c)
    assert c.commit() == 5  # up to the record the stream dropped, which its owner reads again
    again = message(5)
    gate.release(again)
    again.ack(c)
    assert c.commit() == 6


def test_other_topics_pass_untouched() -> None:
    c = FaustConsumer()
    gate = AckGate.install(c, [INPUT])
    other = message(0, OTHER)
    other.ack(c)
    assert gate.held_back == 0 and c._acked[TP(OTHER, 0)] == [0]
