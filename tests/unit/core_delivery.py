"""How a consumer that is behind delivers a node's input records to the core, without Kafka.

Every input topic of a node is its own ordered stream (one producer, records in event-time order). A
Faust worker that starts behind fetches a batch of records from each topic's partition and hands them
to the agents round-robin, one record per topic in turn (Faust's scheduler), so sparse topics (XIDs,
pods) and whichever topic yields more event time per batch run ahead of the others. The host learns
from the fetch that a partition is at its end (position = high-water mark) and tells the core.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from periscope.core.engine import EngineConfig, NodeState, flush, mark_inputs, new_state, step
from periscope.core.model import NodeInput, Output
from periscope.core.watermark import Stream, stream_of
from tests.unit.core_builders import NODE

# (stream, record): a record stepped; (stream, None): the host says the stream's partition is at its end.
Delivery = tuple[Stream, NodeInput | None]


def by_stream(events: Iterable[NodeInput]) -> dict[Stream, list[NodeInput]]:
    """Each stream's records in the order its producer sent them (the given order, per stream)."""
    out: dict[Stream, list[NodeInput]] = {s: [] for s in Stream}
    for ev in events:
        out[stream_of(ev)].append(ev)
    return out


def faust_order(streams: Mapping[Stream, Sequence[NodeInput]],
                per_fetch: Mapping[Stream, int]) -> list[Delivery]:
    """Fetch up to per_fetch[s] records of every stream, deliver them round-robin one record per
    stream, repeat; a stream is declared at its end right after its last record (or at once if empty)."""
    queues = {s: list(streams.get(s, ())) for s in Stream}
    out: list[Delivery] = [(s, None) for s in Stream if not queues[s]]
    pos = dict.fromkeys(Stream, 0)
    while any(pos[s] < len(queues[s]) for s in Stream):
        batch = {s: queues[s][pos[s]:pos[s] + per_fetch.get(s, 1)] for s in Stream}
        for s in Stream:
            pos[s] += len(batch[s])
        i = 0
        while any(i < len(b) for b in batch.values()):
            for s in Stream:
                if i < len(batch[s]):
                    out.append((s, batch[s][i]))
                    if pos[s] == len(queues[s]) and i == len(batch[s]) - 1:
                        out.append((s, None))
            i += 1
    return out


def interleave(streams: Mapping[Stream, Sequence[NodeInput]], choices: Sequence[int],
               late_ends: Sequence[int] = ()) -> list[Delivery]:
    """Any interleaving that keeps each stream's order: choice k picks the (k mod n)-th stream that still
    has records. A stream is declared at its end once exhausted, `late_ends[i]` deliveries later."""
    queues = {s: list(streams.get(s, ())) for s in Stream}
    pos = dict.fromkeys(Stream, 0)
    ends: list[tuple[int, Stream]] = []  # (delivery index at which to declare, stream)
    out: list[Delivery] = []

    def exhausted(s: Stream, k: int) -> None:
        delay = late_ends[k % len(late_ends)] if late_ends else 0
        ends.append((len(out) + delay, s))

    for k, s in enumerate(s for s in Stream if not queues[s]):
        exhausted(s, k)
    for k, choice in enumerate(choices):
        for at, s in sorted(ends):
            if at <= len(out):
                out.append((s, None))
                ends.remove((at, s))
        live = [s for s in Stream if pos[s] < len(queues[s])]
        if not live:
            break
        s = live[choice % len(live)]
        out.append((s, queues[s][pos[s]]))
        pos[s] += 1
        if pos[s] == len(queues[s]):
            exhausted(s, k)
    out += [(s, None) for _, s in sorted(ends)]
    return out


def feed(deliveries: Sequence[Delivery], config: EngineConfig) -> tuple[NodeState, list[Output]]:
    """Step a fresh node state through the deliveries as a host would, then flush it."""
    state = new_state(next((ev.meta.node for _, ev in deliveries if ev is not None), NODE))
    outs: list[Output] = []
    for stream, ev in deliveries:
        if ev is None:
            outs += mark_inputs(state, config, at_end={stream: True})
        else:
            state, o = step(state, ev, config)
            outs += o
    outs += flush(state, config)
    return state, outs
