"""Feed input events through the pure core, node by node, in event-time order: no Kafka here.

The live joiner calls the same `engine.apply` per node as records arrive; replay has the whole range at hand,
so it orders each node's events by event time first (state-based events before samples of the same
instant), steps them, and flushes what the core still buffers (node by node, or nodes side by side in
worker processes: the same outputs). The same events in any arrival order
give the same outputs. Fed in event-time order, every input stream of a node is read through the event
being stepped: replay declares each stream at its end, so with the core's input alignment on
(`EngineConfig.align`) a sample waits for the lateness only, exactly as without it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from periscope.bus import codec
from periscope.bus import topics as t
from periscope.core.engine import (
    DEFAULT_CONFIG,
    EngineConfig,
    NodeState,
    apply,
    flush,
    mark_inputs,
    new_state,
    output_key,
)
from periscope.core.model import (
    AllocationSnapshot,
    DeviceInventory,
    Finding,
    GpuState,
    Meta,
    NodeEvent,
    NodeInput,
    NodeTelemetry,
    Output,
    PodAttribution,
    PodEvent,
    XidEvent,
)
from periscope.heap import paused_gc
from periscope.replay.parallel import can_fork, map_nodes, portable

# Order of event kinds that share an instant: what the world looked like, then what happened in it.
_RANK: dict[type, int] = {PodEvent: 0, NodeEvent: 1, DeviceInventory: 2, AllocationSnapshot: 3, XidEvent: 4,
                          NodeTelemetry: 5}


@dataclass(frozen=True, slots=True)
class Pending:
    """A record that was read and checked but is converted only when its node is replayed: its header,
    its topic and its bytes (a third or less of the memory the decoded event takes, and what a worker
    process is sent: bytes pickle at the speed of a copy, the decoded classes some 50 times slower)."""

    meta: Meta
    data: bytes
    topic: t.Topic = t.TELEMETRY

    def decode(self) -> NodeInput:
        ev: NodeInput = codec.decode(self.topic, self.data)
        return ev

    def packed(self) -> tuple[str, bytes]:
        """What a worker process is sent for it (see `ready`)."""
        return self.topic.name, self.data


ReplayInput = NodeInput | Pending
# A replay input as a worker process gets it: a Pending record as its topic's name and bytes.
WireInput = NodeInput | tuple[str, bytes]
# Rank of a record kept as bytes, by its topic: the rank of the event it decodes to.
_TOPIC_RANK: dict[t.Topic, int] = {topic: _RANK[cls] for cls in _RANK for topic in t.NODE_INPUTS
                                   if topic.message == cls.__name__}


def ready(ev: ReplayInput | WireInput) -> NodeInput:
    """The event the core takes for a replay input, converting what was kept as bytes."""
    if isinstance(ev, Pending):
        return ev.decode()
    if isinstance(ev, tuple):
        decoded: NodeInput = codec.decode(t.BY_NAME[ev[0]], ev[1])
        return decoded
    return ev


def input_kind(ev: ReplayInput) -> str:
    """The event's message type, as a warning names it."""
    return ev.topic.message if isinstance(ev, Pending) else type(ev).__name__


def packed(events: list[ReplayInput]) -> list[WireInput]:
    """`events` as a worker process is sent them."""
    return [ev.packed() if isinstance(ev, Pending) else ev for ev in events]


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    engine: EngineConfig = DEFAULT_CONFIG
    from_ms: int | None = None  # outputs before this instant are computed (to warm state) but not kept
    to_ms: int | None = None  # events after this instant are not fed
    latest_only: bool = False  # keep only the latest output per key (bounded memory for long replays)
    keep: Callable[[Output], bool] | None = None  # further filter on the outputs kept


@dataclass(slots=True)
class ReplayResult:
    """What a replay produced; iterating it yields the kept outputs."""

    outputs: list[Output] = field(default_factory=list)
    states: dict[str, NodeState] = field(default_factory=dict)
    events: int = 0  # events the core took
    samples: int = 0  # telemetry samples processed
    device_samples: int = 0  # device readings in those samples
    emitted: int = 0  # outputs the core emitted (kept or not)
    failed: int = 0  # events the core raised on (skipped)
    seconds: float = 0.0  # wall time spent replaying (see replay_nodes)

    def __iter__(self) -> Iterator[Output]:
        return iter(self.outputs)

    def __len__(self) -> int:
        return len(self.outputs)

    @property
    def device_samples_per_s(self) -> float:
        return self.device_samples / self.seconds if self.seconds > 0 else 0.0


def node_of(ev: ReplayInput) -> str:
    """The node whose partition (and engine state) an event belongs to."""
    if ev.meta.node:
        return ev.meta.node
    if isinstance(ev, PodEvent):
        return ev.pod.node
    if isinstance(ev, NodeEvent):
        return ev.name
    return ""


def output_time(o: Output) -> int:
    return o.at_ms if isinstance(o, Finding) else o.as_of_ms


def order_key(ev: ReplayInput) -> tuple[int, int, str, int, int]:
    m = ev.meta
    rank = _TOPIC_RANK[ev.topic] if isinstance(ev, Pending) else _RANK[type(ev)]
    return (m.time_ms, rank, m.source, m.epoch, m.seq)


def by_node(events: Iterable[ReplayInput], to_ms: int | None = None) -> dict[str, list[ReplayInput]]:
    """Events grouped per node and sorted by event time; unscheduled pods (no node) are dropped."""
    groups: dict[str, list[ReplayInput]] = {}
    for ev in events:
        if to_ms is not None and ev.meta.time_ms > to_ms:
            continue
        node = node_of(ev)
        if node:
            groups.setdefault(node, []).append(ev)
    for evs in groups.values():
        evs.sort(key=order_key)
    return groups


OnError = Callable[[ReplayInput, Exception], None]

@dataclass(slots=True)
class NodeReplay:
    """One node replayed: its kept outputs in emission order, its final state, what it counted."""

    node: str
    kept: list[Output]
    state: NodeState | None  # None unless asked for
    events: int = 0  # events the core took
    samples: int = 0
    device_samples: int = 0
    emitted: int = 0  # outputs the core emitted (kept or not)
    seconds: float = 0.0
    errors: list[tuple[int, BaseException]] = field(default_factory=list)  # (event index, what it raised)
    rendered: object = None  # what a `finish` made of `kept` where the node was replayed


def replay_node(node: str, events: Sequence[ReplayInput | WireInput], config: ReplayConfig, *,
                keep_state: bool = True, progress: Callable[[int], None] | None = None) -> NodeReplay:
    """Replay one node's events (in event-time order, as `by_node` sorts them) from an empty state."""
    cfg = config
    started = time.perf_counter()
    state = new_state(node)
    if cfg.engine.align:  # event-time order: each stream is read through the event being fed
        mark_inputs(state, cfg.engine, at_end=dict.fromkeys(cfg.engine.align, True))
    res = NodeReplay(node, [], None)
    kept, pending = res.kept, 0
    for i, ev in enumerate(events):
        try:
            outs = apply(state, ready(ev), cfg.engine)
        except Exception as e:  # a core bug on one event must not lose the whole replay
            res.errors.append((i, e))
            continue
        if outs:
            res.emitted += len(outs)
            _keep(outs, cfg, kept)
        res.events += 1
        pending += 1
        if pending >= 1000 and progress is not None:
            progress(pending)
            pending = 0
    last = flush(state, cfg.engine)
    res.emitted += len(last)
    _keep(last, cfg, kept)
    res.samples, res.device_samples = state.counters.samples, state.counters.device_samples
    res.state = state if keep_state else None
    res.seconds = time.perf_counter() - started
    if progress is not None and pending:
        progress(pending)
    return res


def replay_nodes(
    groups: dict[str, list[ReplayInput]],
    config: ReplayConfig,
    result: ReplayResult,
    *,
    progress: Callable[[int], None] | None = None,
    on_error: OnError | None = None,
    keep_states: bool = True,
    workers: int = 1,
    finish: Callable[[NodeReplay], NodeReplay] | None = None,
) -> Iterator[NodeReplay]:
    """Replay node by node, yielding each node's result in node-name order; with more than one worker,
    nodes run side by side in forked processes (periscope.replay.parallel) and what they yield is the
    same. `finish` runs on each node's result where the node was replayed, before it is handed back
    (e.g. to render its outputs in the worker). Each node's events are taken out of `groups` once it is
    done (with workers, once all are), so they can be freed; counters and (with keep_states) the final
    states go to `result`, and to its `seconds` the time spent replaying (node by node in the core;
    with workers, the wall time until the last node came back, `finish` included)."""
    started = time.perf_counter()
    parallel = workers > 1 and len(groups) > 1 and can_fork()

    def one(node: str, events: list[ReplayInput]) -> NodeReplay:
        res = replay_node(node, events, config, keep_state=keep_states,
                          progress=None if parallel else progress)
        if parallel:  # it travels back pickled: so must what the core raised
            res.errors = [(i, portable(e)) for i, e in res.errors]
        return finish(res) if finish is not None else res

    for node, res in map_nodes(one, groups, workers if parallel else 1):
        # While workers run, their parent leaves the events alone: freeing them would write to memory
        # the workers share with it, and so copy it. They go once every worker is done.
        tally(result, res, groups[node] if parallel else groups.pop(node), on_error)
        if keep_states and res.state is not None:
            result.states[node] = res.state
        if parallel:
            result.seconds = time.perf_counter() - started
            if progress is not None:
                progress(res.events + len(res.errors))
        else:
            result.seconds += res.seconds
        yield res
    groups.clear()


def tally(result: ReplayResult, res: NodeReplay, events: list[ReplayInput], on_error: OnError | None) -> None:
    """Count one node's replay into `result`; what the core raised on goes to `on_error` with its event
    (`events`: the node's events as they were replayed)."""
    result.failed += len(res.errors)
    if on_error is not None:
        for i, e in res.errors:
            on_error(events[i], e)  # type: ignore[arg-type]
    result.events += res.events
    result.samples += res.samples
    result.device_samples += res.device_samples
    result.emitted += res.emitted


def _keep(outs: list[Output], cfg: ReplayConfig, kept: list[Output]) -> None:
    for o in outs:
        if cfg.from_ms is not None and output_time(o) < cfg.from_ms:
            continue
        if cfg.keep is not None and not cfg.keep(o):
            continue
        kept.append(o)


def replay_events(
    events: Iterable[ReplayInput],
    config: ReplayConfig | None = None,
    *,
    progress: Callable[[int], None] | None = None,
    on_error: OnError | None = None,
    workers: int = 1,
) -> ReplayResult:
    """Run `events` through the core and return the outputs (and per-node states) it produced.

    `progress(n)` is told every so often how many more events were fed. An event the core raises on
    is skipped and counted (and handed to `on_error`), so one bad event cannot end a replay. With more
    than one worker, nodes are replayed in that many forked processes: the same result, but the
    outputs and states come back pickled, which costs about as much as computing them (worth it for
    states, not for millions of outputs; the timeline renders its outputs in the workers instead).
    """
    cfg = config or ReplayConfig()
    result = ReplayResult()
    latest: dict[str, Output] = {}
    with paused_gc():
        groups = by_node(events, cfg.to_ms)
        for res in replay_nodes(groups, cfg, result, progress=progress, on_error=on_error, workers=workers):
            if cfg.latest_only:
                latest.update((output_key(o), o) for o in res.kept)
            else:
                result.outputs += res.kept
    if cfg.latest_only:
        result.outputs = sorted(latest.values(), key=lambda o: (output_time(o), output_key(o)))
    return result


def output_filter(pod_uid: str | None = None, gpu_uuid: str | None = None,
                  node: str | None = None) -> Callable[[Output], bool]:
    """Which emitted records a timeline shows: a pod's attribution and findings about it, a GPU's (or
    MIG instance's) state and the attribution and findings on it, everything of a node; all must match."""

    def pod_ok(o: Output) -> bool:
        if isinstance(o, PodAttribution):
            return o.pod_uid == pod_uid
        if isinstance(o, Finding):
            return o.pod_uid == pod_uid or any(x.pod_uid == pod_uid for x in o.owners)
        return False

    def gpu_ok(o: Output) -> bool:
        if isinstance(o, PodAttribution):
            return any(r.gpu_uuid == gpu_uuid or (r.mig is not None and r.mig.uuid == gpu_uuid)
                       for r in o.rows)
        if isinstance(o, GpuState):
            return o.gpu_uuid == gpu_uuid or any(m.uuid == gpu_uuid for m in o.mig_devices)
        return o.gpu_uuid == gpu_uuid or (o.mig is not None and o.mig.uuid == gpu_uuid)

    def keep(o: Output) -> bool:
        return ((node is None or o.node == node) and (pod_uid is None or pod_ok(o))
                and (gpu_uuid is None or gpu_ok(o)))

    return keep
