"""What a worker keeps per node it owns, and how a record is matched to its node."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Protocol

from periscope.core.engine import NodeState
from periscope.core.model import NodeEvent, NodeInput, Output, PodEvent
from services.joiner.acks import Held
from services.joiner.catchup import Gathered
from services.joiner.changelog import PodVersion


class Message(Protocol):
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


class Rejected(ValueError):
    """A record that decodes but cannot be joined (no key, or a key that contradicts the payload)."""


@dataclass(slots=True)
class Slot:
    node: str
    partition: int
    state: NodeState
    held: Held  # positions of the applied records that wait for a persist to be acknowledged
    seq: int
    versions: dict[str, PodVersion]
    mark_ms: int  # newest output time whose publication was promised (durable mark)
    replay_until_ms: int  # after recovery: outputs at or before this were published before
    recovered_ms: int  # processed_ms when rebuilt: older telemetry is a redelivery, not a late sample
    stash: dict[str, Output] = field(default_factory=dict)
    # Outputs computed while catching up on the node, published when it caught up or before its next persist.
    gathered: Gathered = field(default_factory=Gathered)
    dirty: bool = False
    last_probe: float = 0.0
    advanced_at: float = 0.0  # when a probe record last moved the node's event time (monotonic)
    persist_due: float = 0.0  # when the next periodic persist is due (monotonic; see next_persist)
    persisting: bool = False
    again: bool = False
    # What the persist under way waits for, and since when (monotonic): named when one takes too long.
    waiting_for: str = ""
    persist_started: float = 0.0
    persist_warned: bool = False


def next_persist(node: str, now: float, interval_s: float) -> float:
    """When the node's next periodic persist is due after one at `now`: the last point up to `interval_s`
    ahead on a grid of that step, offset by a phase taken from the node's name. Nodes that started
    together then persist in different batches and ticks instead of all in one (each persist encodes
    the node's state: a hundred at once hold up every output behind them)."""
    if interval_s <= 0:
        return now
    phase = zlib.crc32(node.encode()) / 2**32 * interval_s
    ahead = now + interval_s
    return ahead - (ahead - phase) % interval_s


def node_of(key: bytes | None, obj: NodeInput) -> str | None:
    """The node whose state the record belongs to; None for an unscheduled pod (nothing to join)."""
    node = (key or b"").decode("utf-8", "replace")
    if isinstance(obj, PodEvent):
        if not node:
            return None
        if obj.pod.node and obj.pod.node != node:
            raise Rejected(f"record key {node!r} is not the pod's node {obj.pod.node!r}")
        return node
    if not node:
        raise Rejected("record has no key (the node name)")
    named = obj.name if isinstance(obj, NodeEvent) else obj.meta.node
    if named != node:
        raise Rejected(f"record key {node!r} is not the event's node {named!r}")
    return node


def state_mark(s: NodeState) -> tuple[object, ...]:
    """Identity of the state-based inputs: changes when a pod, allocation, inventory or node label does.
    An unchanged snapshot only adds a repeat to its run; it is persisted with the next periodic write
    (its record stays unacknowledged until then, so a crash redelivers it)."""
    return s.input_versions()
