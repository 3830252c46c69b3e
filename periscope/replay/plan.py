"""Which input events a replay of a range needs: what the reader fetches from the input topics for a
range (`ReadPlan`, `nodes_needing_snapshots`) and which of the events read it feeds (`select`). The
reading itself is in reader.py."""

from __future__ import annotations

from dataclasses import dataclass

from periscope.bus import topics as t
from periscope.core.model import PodEvent
from periscope.replay.runner import ReplayInput, node_of

STATE = (t.PODS, t.NODES)  # from the beginning
SNAPSHOTS = (t.ALLOCATIONS, t.INVENTORY)  # from a lookback, at least one per node at or before the anchor
SAMPLES = (t.TELEMETRY, t.XID)  # [anchor, to]


@dataclass(frozen=True, slots=True)
class ReadPlan:
    anchor_ms: int  # first instant whose samples the core must see
    to_ms: int  # last instant replayed
    lookback_ms: int = 3_600_000
    late_slack_ms: int = 300_000  # a time-ranged partition is read until a record this far past `to`
    samples: bool = True  # read telemetry and XIDs (ownership at an instant needs neither)
    node: str | None = None

    @property
    def cut_ms(self) -> int:
        return self.anchor_ms - self.lookback_ms


def nodes_needing_snapshots(events: list[tuple[t.Topic, ReplayInput]], plan: ReadPlan) -> set[str]:
    """Nodes the replay will need allocation/inventory state for."""
    if plan.node is not None:
        return {plan.node}
    nodes: set[str] = set()
    last_pod: dict[str, PodEvent] = {}
    for topic, ev in events:
        if topic in SAMPLES or (topic in SNAPSHOTS and ev.meta.time_ms >= plan.cut_ms):
            nodes.add(node_of(ev))
        elif isinstance(ev, PodEvent) and ev.meta.time_ms <= plan.to_ms:
            prev = last_pod.get(ev.pod.uid)
            if prev is None or ev.meta.time_ms >= prev.meta.time_ms:
                last_pod[ev.pod.uid] = ev
    nodes |= {node_of(e) for e in last_pod.values() if not e.deleted}
    nodes.discard("")
    return nodes


def select(events: list[tuple[t.Topic, ReplayInput]], plan: ReadPlan) -> list[ReplayInput]:
    """The events the replay feeds, independent of how far before the range the reading started:
    state up to `to`; snapshots in [cut, to] plus, where a node has none in [cut, anchor], its latest
    before the cut; samples in [anchor, to]."""
    out: list[ReplayInput] = []
    older: dict[tuple[str, str], ReplayInput] = {}
    covered: set[tuple[str, str]] = set()
    for topic, ev in events:
        tm = ev.meta.time_ms
        if tm > plan.to_ms:
            continue
        if topic in STATE:
            out.append(ev)
        elif topic in SAMPLES:
            if tm >= plan.anchor_ms:
                out.append(ev)
        elif tm >= plan.cut_ms:
            out.append(ev)
            if tm <= plan.anchor_ms:
                covered.add((topic.name, node_of(ev)))
        else:
            key = (topic.name, node_of(ev))
            prev = older.get(key)
            if prev is None or tm >= prev.meta.time_ms:
                older[key] = ev
    out += [ev for key, ev in sorted(older.items(), key=lambda kv: kv[0]) if key not in covered]
    return out
