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
    persisted_ms: int = 0  # its processed_ms at its last persist or as restored (0: nothing processed)
    catching: bool = False  # its last batch was read catching up, not at the partition's end (catchup.py)
    persisting: bool = False
    again: bool = False
    # What the persist under way waits for, and since when (monotonic): named when one takes too long.
    # (0 before its first persist here: a node taken up persists at its first periodic check, which
    # acknowledges the records read again since the committed offsets.)
    waiting_for: str = ""
    persist_started: float = 0.0
    persist_warned: bool = False

    @property
    def unpublished(self) -> bool:
        """Whether outputs of the node wait to be published: gathered, or views the core has yet to
        build (catchup.py)."""
        return bool(self.gathered) or self.state.views_stale


EVENT_TIME_WAIT = 6  # intervals on the clock after which a node persists though its event time stood still
# While the worker catches up on a node its periodic persists are this many times further apart.
CATCH_UP_SPACING = 6


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


def periodic_due(slot: Slot, now: float, interval_s: float) -> bool:
    """Whether the node's periodic persist is due: its interval passed on the clock (`persist_due`) and
    in the node's event time too. A worker catching up on many nodes moves each through its samples
    slower than the clock; persisting by the clock alone, the slower it went the more often it persisted
    each node per sample, and each persist encodes the node's state (about 1.6 ms of CPU): runs on the
    same 2,050-node backlog made 3,000 to 28,000 persists and took 69 to 111 s of CPU. A node whose
    event time stands still persists once EVENT_TIME_WAIT intervals passed on the clock (its records are
    acknowledged only then). A node with no sample processed at its last persist counts its event time
    from its first record (from zero, the samples processed next made it due at once).

    While the worker catches up on the node (`slot.catching`) both spans are CATCH_UP_SPACING times
    longer: its outputs wait for a persist anyway (they are gathered, see catchup.py), so a persist then
    buys nothing but earlier acknowledgements, and with 2,050 nodes behind, the persists' own writes
    were what the input waited for. Once caught up, the next persist is due at the usual interval. (On
    that backlog: 5,535 to 5,725 persists in three runs, 62-72 s of CPU; 5,700 to 19,100 and 74-95 s in
    seven runs without it.)"""
    if now < slot.persist_due:
        return False
    every = interval_s * (CATCH_UP_SPACING if slot.catching else 1)
    since = slot.persisted_ms or slot.state.inputs.opened_ms
    return (slot.state.processed_ms - since >= every * 1000
            or now - slot.persist_started >= EVENT_TIME_WAIT * every)


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
