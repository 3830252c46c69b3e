"""Event-time alignment of a node's input streams: the min-over-inputs watermark.

A node's inputs arrive on several topics, one stream each. A consumer that is behind (restarted, a new
consumer group, a rebalance onto a worker with lag) reads them at different speeds: sparse topics and
whichever topic yields more event time per fetch run ahead. Joining a sample or an XID before the
node's allocations and pods have been read through its time would join it against the wrong holder,
and an XID finding is never corrected. So, for the streams named in `EngineConfig.align`, the engine
joins a sample or an XID at time t only once each of those streams is

- read past t: a record of it newer than t was stepped, or the host says so (`through_ms`: e.g. the
  watcher's pods partition, shared by many nodes, was read past t), or
- at its end: the host says its partition holds nothing more for now (position = high-water mark),
  which is the live case, so live (no lag) nothing waits longer than the lateness, as before, or
- silent: the node's watermark (its newest probe event time) passed the stream's newest record by
  more than `max_hold_ms`. The bound is in event time (the core has no clock) and keeps a stream the
  host never reports on from holding the others for ever; each stall is counted (`input_stalls`), and
  every sample or XID joined past a stream not read through its time is counted (`unaligned`).

What the host must do: after stepping records, or learning from a fetch where its partitions stand,
tell each node of a partition whether that stream is at its end (`engine.mark_inputs`); it is not until
told (after a restart too: `at_end` is not persisted). Replay feeds each node in event-time order, so
every stream is read through the record being stepped: it declares every stream at its end.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from enum import StrEnum

from periscope.core.model import (
    AllocationSnapshot,
    DeviceInventory,
    NodeEvent,
    NodeInput,
    NodeTelemetry,
    PodEvent,
    XidEvent,
)

NEVER = -(2**62)  # through_ms of a stream nothing was read from
OPEN = 2**62  # the bound when nothing holds


class Stream(StrEnum):
    """A node's input streams, one per input topic."""

    ALLOCATIONS = "allocations"
    TELEMETRY = "telemetry"
    XID = "xid"
    INVENTORY = "inventory"
    PODS = "pods"
    NODES = "nodes"


# Every input a sample's or an XID's outputs read. With all of them aligned, the samples and XIDs are
# joined in event-time order whatever the delivery; allocations and pods are what the owners need.
ALL_STREAMS: frozenset[Stream] = frozenset(Stream)
OWNER_STREAMS: frozenset[Stream] = frozenset({Stream.ALLOCATIONS, Stream.PODS})

_ORDER: tuple[Stream, ...] = tuple(Stream)
_INDEX: dict[Stream, int] = {s: i for i, s in enumerate(_ORDER)}
_STREAM_OF: dict[type, Stream] = {
    AllocationSnapshot: Stream.ALLOCATIONS, NodeTelemetry: Stream.TELEMETRY, XidEvent: Stream.XID,
    DeviceInventory: Stream.INVENTORY, PodEvent: Stream.PODS, NodeEvent: Stream.NODES,
}
_INDEX_OF: dict[type, int] = {t: _INDEX[s] for t, s in _STREAM_OF.items()}


def stream_of(ev: NodeInput) -> Stream:
    return _STREAM_OF[type(ev)]


def _never() -> array[int]:
    return array("q", [NEVER] * len(_ORDER))


@dataclass(slots=True)
class Inputs:
    """Where each of a node's input streams stands. Packed (a worker holds one per node): the newest
    event time read per stream, and a bit per stream for each flag."""

    through: array[int] = field(default_factory=_never)  # per stream, in Stream order: newest time read
    at_end: int = 0  # bit per stream: the host says its partition holds nothing more (not persisted)
    stalled: int = 0  # bit per stream: silent past max_hold_ms, not holding (counted once per stall)
    opened_ms: int = 0  # the node's first watermark: a stream never read is silent since then

    def read(self, ev: NodeInput) -> None:
        """A record of the stream was stepped."""
        i = _INDEX_OF[type(ev)]
        if ev.meta.time_ms > self.through[i]:
            self.through[i] = ev.meta.time_ms

    def through_ms(self, stream: Stream) -> int:
        return self.through[_INDEX[stream]]

    def is_at_end(self, stream: Stream) -> bool:
        return bool(self.at_end >> _INDEX[stream] & 1)

    def is_stalled(self, stream: Stream) -> bool:
        return bool(self.stalled >> _INDEX[stream] & 1)

    def mark(self, stream: Stream, *, at_end: bool | None = None, through_ms: int | None = None) -> None:
        """The host's word (periscope.core.engine.mark_inputs); a stream's time never moves back."""
        bit = 1 << _INDEX[stream]
        if at_end is not None:
            self.at_end = self.at_end | bit if at_end else self.at_end & ~bit
        if through_ms is not None and through_ms > self.through[_INDEX[stream]]:
            self.through[_INDEX[stream]] = through_ms


def gate(inputs: Inputs, align: frozenset[Stream], watermark_ms: int, max_hold_ms: int
         ) -> tuple[int, int, int]:
    """(bound, aligned, stalls): samples and XIDs at or before `bound` may be joined (silent streams
    left out); at or before `aligned` every aligned stream was read past them; `stalls`: how many
    streams fell silent just now."""
    bound = aligned = OPEN
    stalls = 0
    for s in align:
        i = _INDEX[s]
        bit = 1 << i
        if inputs.at_end & bit:
            inputs.stalled &= ~bit
            continue
        newest = inputs.through[i]
        through = newest - 1  # records at exactly the newest time may still come: only older are covered
        if through < aligned:
            aligned = through
        if watermark_ms - max(newest, inputs.opened_ms) > max_hold_ms:
            if not inputs.stalled & bit:
                inputs.stalled |= bit
                stalls += 1
            continue
        inputs.stalled &= ~bit
        if through < bound:
            bound = through
    return bound, aligned, stalls


def holding(inputs: Inputs, align: frozenset[Stream], t_ms: int) -> tuple[Stream, ...]:
    """The streams that keep an event at t waiting (in Stream order), as of the last `gate`."""
    free = inputs.at_end | inputs.stalled
    return tuple(s for i, s in enumerate(_ORDER)
                 if s in align and not free >> i & 1 and inputs.through[i] <= t_ms)


def to_record(inputs: Inputs) -> dict[str, object]:
    """The persisted form: where each stream was read to, and stalls (so none is counted twice)."""
    marks = {s.value: [inputs.through[i], bool(inputs.stalled >> i & 1)] for i, s in enumerate(_ORDER)
             if inputs.through[i] != NEVER or inputs.stalled >> i & 1}
    return {"opened": inputs.opened_ms, "marks": marks}


def from_record(rec: dict[str, object] | None, watermark_ms: int) -> Inputs:
    """Inverse of to_record; a state persisted before alignment existed reads as opened at its
    watermark with no stream read (each then holds until it is read, reported at its end, or silent)."""
    inputs = Inputs()
    if rec is None:
        inputs.opened_ms = watermark_ms
        return inputs
    opened = rec.get("opened", watermark_ms)
    inputs.opened_ms = opened if isinstance(opened, int) else watermark_ms
    marks = rec.get("marks", {})
    for name, (through, stalled) in (marks.items() if isinstance(marks, dict) else ()):
        i = _INDEX[Stream(name)]
        inputs.through[i] = int(through)
        inputs.stalled |= bool(stalled) << i
    return inputs
