"""A node's state in the engine: what its inputs said, what waits to be joined, its rows and findings,
what was published, and the lookups derived from its inputs.

The state-based inputs (pods, the allocation history, the device inventory, the node's labels) change
through the methods here, which count every effective change in a version counter: the pod registry's
`version`, `allocs_version`, `inventory_version` and `node_event_version`. The lookups derived from
them (the holdings in force over a span of event time and their groupings, the node's GPU sharing
labels) are cached under those counters, and only this class reads or writes its caches.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field

from periscope.core import history
from periscope.core.allocation import Holding, reconcile_all
from periscope.core.devices import DeviceMap
from periscope.core.findings import FindingBook
from periscope.core.holdings import HoldingIndex
from periscope.core.model import (
    AllocationSnapshot,
    DeviceInventory,
    NodeEvent,
    NodeTelemetry,
    Output,
    XidEvent,
    XidRef,
)
from periscope.core.pods import PodRegistry
from periscope.core.repeats import AllocKey, Repeats
from periscope.core.rows import RowState
from periscope.core.watermark import Inputs

SHARING_LABEL = "nvidia.com/gpu.sharing-strategy"
REPLICAS_LABEL = "nvidia.com/gpu.replicas"

Pending = NodeTelemetry | XidEvent
RowKey = tuple[str, str, str]  # pod UID, container, device ID


@dataclass(slots=True)
class Counters:
    events: int = 0
    duplicates: int = 0
    late_dropped: int = 0
    samples: int = 0
    device_samples: int = 0
    unattributed_samples: int = 0
    ambiguous_joins: int = 0
    input_stalls: int = 0  # times an aligned stream fell silent past max_hold_ms and stopped holding
    unaligned: int = 0  # samples and XIDs joined before an aligned stream was read through their time


def pending_key(p: Pending) -> tuple[int, int, str, int, int]:
    """Processing order: event time, XIDs before samples of the same instant, then producer order."""
    m = p.meta
    return (m.time_ms, 0 if isinstance(p, XidEvent) else 1, m.source, m.epoch, m.seq)


@dataclass(slots=True)
class Held:
    """The holdings in force over a span of event time, [from_ms, until_ms), for one version of the
    node's inputs: who holds which device, the pods with monitoring (admin-access) claims apart, and
    the groupings every sample reads (built when first asked for)."""

    key: tuple[AllocKey | None, int, int]  # the allocation run in force, pods.version, inventory_version
    from_ms: int
    until_ms: int
    holdings: list[Holding]
    monitors: list[Holding]
    _index: HoldingIndex | None = None

    @property
    def index(self) -> HoldingIndex:
        ix = self._index
        if ix is None:
            ix = self._index = HoldingIndex.build(self.holdings)
        return ix


@dataclass(slots=True)
class NodeState:
    node: str
    pods: PodRegistry = field(default_factory=PodRegistry)
    # Allocation history as runs of equal content (periscope.core.history): each run's first snapshot,
    # and the (time, epoch, seq) of its later ones.
    allocs: list[AllocationSnapshot] = field(default_factory=list)
    alloc_repeats: dict[AllocKey, Repeats] = field(default_factory=dict)
    inventory: DeviceInventory | None = None
    node_event: NodeEvent | None = None
    pending: list[Pending] = field(default_factory=list)  # sorted by pending_key
    watermark_ms: int = 0
    processed_ms: int = 0
    pruned_ms: int = 0
    rows: dict[RowKey, RowState] = field(default_factory=dict)
    last_xid: dict[str, XidRef] = field(default_factory=dict)
    last_telemetry: NodeTelemetry | None = None  # the last processed sample
    findings: FindingBook = field(default_factory=FindingBook)
    # The last output published per key (without windows): a pod's attribution under its UID, a GPU's
    # state under its UUID ("GPU-" or "MIG-", never a pod UID), a finding under "finding/" + its ID.
    # (The UIDs and UUIDs are the strings the node holds anyway; a key of their own was 90 bytes each.)
    emitted: dict[str, Output] = field(default_factory=dict)
    counters: Counters = field(default_factory=Counters)
    devmap: DeviceMap = field(default_factory=DeviceMap)
    inputs: Inputs = field(default_factory=Inputs)  # how far each input stream was read (alignment)
    # Bumped on every change of the runs of `allocs` (not on a repeat added to a run), of `inventory`
    # and of `node_event`; with `pods.version`, they say when what is derived from the inputs changed.
    allocs_version: int = field(default=0, compare=False)
    inventory_version: int = field(default=0, compare=False)
    node_event_version: int = field(default=0, compare=False)
    # While a host catches up on the node (engine.pause_views), samples are stepped without building
    # their attribution and GPU states; `views_stale`: some were since the views were last refreshed.
    # Not persisted: a host refreshes the views before it persists the state.
    views_paused: bool = field(default=False, compare=False)
    views_stale: bool = field(default=False, compare=False)
    views_pods: dict[str, int] = field(default_factory=dict, compare=False)  # pod UID -> its last step
    _held: Held | None = field(default=None, compare=False, repr=False)
    _sharing: tuple[int, str, int] = field(default=(-1, "time-slicing", 0), compare=False, repr=False)

    # ------------------------------------------------------------------ inputs

    def set_inventory(self, inventory: DeviceInventory) -> None:
        self.inventory = inventory
        self.devmap = DeviceMap.from_inventory(inventory)
        self.inventory_version += 1

    def set_node_event(self, event: NodeEvent) -> None:
        if event != self.node_event:
            self.node_event_version += 1
        self.node_event = event

    def add_snapshot(self, snap: AllocationSnapshot,
                     intern: Callable[[AllocationSnapshot], AllocationSnapshot]) -> bool:
        """Add an allocation snapshot to the history; False when it holds it already (a duplicate)."""
        added = history.add(self.allocs, self.alloc_repeats, snap, intern)
        if added == "runs":
            self.allocs_version += 1
        return added != "duplicate"

    def prune_history(self, cutoff_ms: int) -> None:
        if history.prune(self.allocs, self.alloc_repeats, cutoff_ms):
            self.allocs_version += 1

    def input_versions(self) -> tuple[int, int, int, int]:
        """Changes when a pod, the allocation runs, the inventory or the node's labels change."""
        return (self.pods.version, self.allocs_version, self.inventory_version, self.node_event_version)

    # ------------------------------------------------------------------ derived lookups

    def snapshot_at(self, t_ms: int) -> AllocationSnapshot | None:
        return history.at(self.allocs, t_ms)

    def held_at(self, t_ms: int) -> Held:
        """The holdings in force at t. Cached for the span of event time over which the answer stays
        the same: the same allocation run, pods and inventory, and no pod starting or going in it."""
        snap = self.snapshot_at(t_ms)
        key = (None if snap is None else history.key_of(snap), self.pods.version, self.inventory_version)
        held = self._held
        if held is not None and key == held.key and held.from_ms <= t_ms < held.until_ms:
            return held
        holdings, monitors = reconcile_all(snap, self.pods, self.devmap, t_ms)
        # Pod lifetimes change the answer only at start/deletion times: cache until the next boundary.
        bounds = sorted({b for r in self.pods.pods.values() for b in (r.start_ms, r.deleted_ms) if b})
        i = bisect_left(bounds, t_ms + 1)  # bounds[:i] are at or before t
        lo = bounds[i - 1] if i else -(2**62)
        hi = bounds[i] if i < len(bounds) else 2**62
        held = self._held = Held(key, lo, hi, holdings, monitors)
        return held

    def holdings_at(self, t_ms: int) -> list[Holding]:
        return self.held_at(t_ms).holdings

    def monitors_at(self, t_ms: int) -> list[Holding]:
        """The pods with admin (monitoring) access to the node's devices at t: never holders."""
        return self.held_at(t_ms).monitors

    def sharing(self) -> tuple[str, int]:
        """The node's GPU sharing strategy and replica count, from its labels."""
        version, strategy, replicas = self._sharing
        if version == self.node_event_version:
            return strategy, replicas
        ev = self.node_event
        if ev is None:
            strategy, replicas = "time-slicing", 0
        else:
            strategy = ev.label(SHARING_LABEL, "time-slicing")
            raw = ev.label(REPLICAS_LABEL, "0")
            replicas = int(raw) if raw.isdigit() else 0
        self._sharing = (self.node_event_version, strategy, replicas)
        return strategy, replicas


def new_state(node: str) -> NodeState:
    return NodeState(node=node)
