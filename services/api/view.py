"""The materialized view of the joiner's output topics that the HTTP API answers from.

No I/O: the consumer feeds decoded domain objects to `View.apply`, the endpoints read. Applying is
idempotent and never regresses, because delivery is at-least-once and the topics are not compacted (a
replica rebuilding from offset 0 sees every historical state of every pod): a PodAttribution or GpuState
older than the one held is ignored, a Finding older than the held one with the same id is ignored.

Reads are served from lazily built sorted key lists (all rows, per node, per namespace) that are dropped
when something under them changes, so a filtered query at 100,000 rows touches only its own slice.

Windows: the joiner publishes each row's tumbling windows once, when they close (a PodAttribution may
carry none). The view merges them per row by start (a repeat replaces the held copy), keeps them packed
(services.api.windows) for `window_retention_ms` of event time, and keeps a row's merged windows when
its newest PodAttribution brings none. Each pod's and GPU's latest state is held packed
(services.api.compact) and unpacked on read; `pods` and `gpus` are read-only mappings that unpack.
Rendered rows are cached for at most `render_cache` rows, least recently used first out. The indexes
are kept small for the same reason: per node a tuple (a node holds a handful of pods and GPUs), per
namespace a set, and the strings they and the keys hold are interned (one object per distinct text).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from sys import intern
from typing import Any, Generic, TypeVar

from periscope.contract.attribution import pod_row_json
from periscope.contract.values import Json
from periscope.core.model import (
    AttributionRow,
    Finding,
    GpuState,
    NodeEvent,
    PodAttribution,
    PolicyEvent,
    WindowStat,
)
from services.api import compact, windows
from services.api.accounts import GpuHoursTotals, workload
from services.api.windows import Stat

# namespace, pod, pod_uid, container, device_id, ordinal: how many earlier rows of the pod have the same
# container and device (only breaks ties between duplicate rows, and stays put when rows are reordered)
RowKey = tuple[str, str, str, str, str, int]
GpuKey = tuple[str, int, str]  # node, index, gpu_uuid
XidKey = tuple[int, str, str, str]  # at_ms, node, gpu_uuid, finding id

XID_KIND = "xid-owner"
WINDOW_RETENTION_MS = 3_600_000
RENDER_CACHE_ROWS = 4096


@dataclass(slots=True)
class _Slices:
    """Sorted-key caches: None = all, ("node", X), ("ns", X); an entry is dropped on change."""

    cache: dict[tuple[str, str] | None, list[Any]] = field(default_factory=dict)

    def drop(self, *scopes: tuple[str, str]) -> None:
        self.cache.pop(None, None)
        for s in scopes:
            self.cache.pop(s, None)


def _add(index: dict[str, set[str]], k: str, v: str) -> None:
    index.setdefault(k, set()).add(v)


def _remove(index: dict[str, set[str]], k: str, v: str) -> None:
    s = index.get(k)
    if s is not None:
        s.discard(v)
        if not s:
            del index[k]


T = TypeVar("T")


def _put(index: dict[str, tuple[T, ...]], k: str, v: T) -> None:
    index[k] = (*index.get(k, ()), v)


def _take(index: dict[str, tuple[T, ...]], k: str, v: T) -> None:
    rest = tuple(x for x in index.get(k, ()) if x != v)
    if rest:
        index[k] = rest
    else:
        index.pop(k, None)


def _row_keys(pod: PodAttribution) -> list[RowKey]:
    seen: dict[tuple[str, str], int] = {}
    keys = []
    ns, name, uid = intern(pod.namespace), intern(pod.pod), intern(pod.pod_uid)
    for r in pod.rows:
        n = seen.get((r.container, r.device_id), 0)
        seen[(r.container, r.device_id)] = n + 1
        keys.append((ns, name, uid, intern(r.container), intern(r.device_id), n))
    return keys


# A pod's row keys in row order; a pod of one row (the usual case) holds its key itself, not a 1-tuple of
# it (56 bytes a row saved).
_Keys = RowKey | tuple[RowKey, ...]


def _keys(held: _Keys | None) -> tuple[RowKey, ...]:
    if not held:
        return ()
    return (held,) if type(held[0]) is str else held  # type: ignore[return-value]


class Packed(Mapping[str, T], Generic[T]):
    """A read-only mapping over packed records that unpacks each on access (a fresh object each time)."""

    def __init__(self, held: dict[str, bytes], unpack: Callable[[bytes], T]) -> None:
        self._held = held
        self._unpack = unpack

    def __getitem__(self, k: str) -> T:
        return self._unpack(self._held[k])

    def __contains__(self, k: object) -> bool:
        return k in self._held

    def __iter__(self) -> Iterator[str]:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)


class View:
    def __init__(
        self, window_retention_ms: int = WINDOW_RETENTION_MS, render_cache: int = RENDER_CACHE_ROWS
    ) -> None:
        self.window_retention_ms = window_retention_ms
        self._pods: dict[str, bytes] = {}  # pod UID -> packed PodAttribution, rows without windows
        self.pods: Packed[PodAttribution] = Packed(self._pods, compact.unpack_pod)
        self._rows: dict[RowKey, bytes] = {}  # the row's packed merged windows
        self._row_keys: dict[str, _Keys] = {}  # pod UID -> its row keys, in row order (see _keys)
        self._rendered: OrderedDict[RowKey, Json] = OrderedDict()
        self._render_cache = render_cache
        self._pods_by_node: dict[str, tuple[str, ...]] = {}
        self._pods_by_ns: dict[str, set[str]] = {}
        self._row_slices = _Slices()

        self._gpus: dict[str, bytes] = {}  # GPU UUID -> packed GpuState
        self.gpus: Packed[GpuState] = Packed(self._gpus, compact.unpack_gpu)
        self._gpus_by_node: dict[str, tuple[str, ...]] = {}  # node -> GPU UUIDs
        self._gpu_slices = _Slices()

        self.findings: dict[str, Finding] = {}
        self._xid_keys: list[XidKey] | None = None

        self.policy: PolicyEvent | None = None
        self.nodes: dict[str, NodeEvent] = {}
        self.as_of_ms = 0  # newest event time applied
        self.version = 0  # counts the applied records that changed the view (what a cached answer keys on)
        self.gpu_hours = GpuHoursTotals()  # what the merged windows' accounting added up to (counters)

    # ------------------------------------------------------------------ writes

    def apply(self, obj: object) -> bool:
        """Apply one decoded record; True if the view changed. Unknown types are ignored."""
        if isinstance(obj, PodAttribution):
            changed = self.apply_pod(obj)
        elif isinstance(obj, GpuState):
            changed = self.apply_gpu(obj)
        elif isinstance(obj, Finding):
            changed = self.apply_finding(obj)
        elif isinstance(obj, PolicyEvent):
            changed = self.apply_policy(obj)
        elif isinstance(obj, NodeEvent):
            changed = self.apply_node(obj)
        else:
            return False
        self.version += changed
        return changed

    def _saw(self, t_ms: int) -> None:
        self.as_of_ms = max(self.as_of_ms, t_ms)

    def apply_pod(self, pod: PodAttribution) -> bool:
        """Take a newer state of the pod; merge the windows of any (an older one's too: they are closed
        windows, so a late copy is as good as the first)."""
        uid = intern(pod.pod_uid)
        held = self._pods.get(uid)
        if held is not None and pod.as_of_ms < compact.as_of_ms(held):
            return self._merge_late(held, pod)
        stored = compact.pod(pod)
        keys = _row_keys(pod)
        old = {k: self._rows[k] for k in _keys(self._row_keys.get(uid))}
        cutoff = pod.as_of_ms - self.window_retention_ms
        series = [
            windows.merge(old.get(k, b""), r.windows, cutoff) for k, r in zip(keys, pod.rows, strict=True)
        ]
        if all(s == old.get(k) for k, s in zip(keys, series, strict=True)) and compact.same_pod(held, stored):
            return False
        self._count(pod, [windows.taken(old.get(k, b""), r.windows, cutoff)
                          for k, r in zip(keys, pod.rows, strict=True) if r.windows])
        self._saw(pod.as_of_ms)
        node, ns = intern(pod.node), intern(pod.namespace)
        if held is not None:
            self._drop_pod(uid, node, ns)
        self._pods[uid] = stored
        _put(self._pods_by_node, node, uid)
        _add(self._pods_by_ns, ns, uid)
        for k, s in zip(keys, series, strict=True):
            self._rows[k] = s
        self._row_keys[uid] = keys[0] if len(keys) == 1 else tuple(keys)
        self._row_slices.drop(("node", node), ("ns", ns))
        return True

    def _merge_late(self, held: bytes, pod: PodAttribution) -> bool:
        """An older state of a held pod: only its windows, into the rows still held, count."""
        changed = False
        cutoff = compact.as_of_ms(held) - self.window_retention_ms
        mine = set(_keys(self._row_keys.get(pod.pod_uid)))
        for k, r in zip(_row_keys(pod), pod.rows, strict=True):
            if k not in mine or not r.windows:
                continue
            s = windows.merge(self._rows[k], r.windows, cutoff)
            if s != self._rows[k]:
                self._count(pod, [windows.taken(self._rows[k], r.windows, cutoff)])
                self._rows[k] = s
                changed = True
        return changed

    def _count(self, pod: PodAttribution, taken: list[list[tuple[windows.Acct, windows.Acct | None]]]
               ) -> None:
        key = (intern(pod.namespace), workload(pod))
        for t in taken:
            if t:
                self.gpu_hours.add(key, t)

    def _drop_pod(self, uid: str, node: str | None = None, ns: str | None = None) -> None:
        """Forget the held pod `uid` and its rows. `node` and `ns`: where it probably is (the new state's),
        so that the held one need not be unpacked when it has not moved."""
        if node is None or uid not in self._pods_by_node.get(node, ()) or ns not in self._pods_by_ns or (
            uid not in self._pods_by_ns[ns]
        ):
            held = compact.unpack_pod(self._pods[uid])
            node, ns = held.node, held.namespace
        for k in _keys(self._row_keys.pop(uid, None)):
            self._rows.pop(k, None)
            self._rendered.pop(k, None)
        _take(self._pods_by_node, node, uid)
        _remove(self._pods_by_ns, ns, uid)
        self._row_slices.drop(("node", node), ("ns", ns))

    def prune_windows(self, cutoff_ms: int) -> int:
        """Drop the windows that start before `cutoff_ms` (event time) from every row; how many rows
        lost some. Merging prunes a row by its own pod's time; this catches rows that went quiet."""
        n = 0
        rows = self._rows
        for k, s in rows.items():  # replacing values, not keys: safe while iterating
            pruned = windows.prune(s, cutoff_ms)
            if pruned is not s:
                rows[k] = pruned
                n += 1
        return n

    def apply_gpu(self, gpu: GpuState) -> bool:
        uuid = intern(gpu.gpu_uuid)
        held = self._gpus.get(uuid)
        if held is not None and gpu.as_of_ms < compact.as_of_ms(held):
            return False
        stored = compact.gpu(gpu)
        if compact.same_gpu(held, stored):
            return False
        self._saw(gpu.as_of_ms)
        node = intern(gpu.node)
        if held is not None:
            self._drop_gpu(uuid, node)
        self._gpus[uuid] = stored
        _put(self._gpus_by_node, node, uuid)
        self._gpu_slices.drop(("node", node))
        return True

    def _drop_gpu(self, uuid: str, node: str | None = None) -> None:
        """Forget the held GPU `uuid`; `node`: where it probably is (the new state's), saving an unpack."""
        if node is None or uuid not in self._gpus_by_node.get(node, ()):
            node = compact.unpack_gpu(self._gpus[uuid]).node
        _take(self._gpus_by_node, node, uuid)
        self._gpu_slices.drop(("node", node))
        del self._gpus[uuid]

    def apply_finding(self, f: Finding) -> bool:
        held = self.findings.get(f.id)
        if held is not None and (f.at_ms < held.at_ms or f == held):
            return False
        self._saw(f.at_ms)
        self.findings[f.id] = f
        if f.kind == XID_KIND or (held is not None and held.kind == XID_KIND):
            self._xid_keys = None
        return True

    def apply_policy(self, ev: PolicyEvent) -> bool:
        if self.policy is not None and (ev.meta.time_ms < self.policy.meta.time_ms or ev == self.policy):
            return False
        self._saw(ev.meta.time_ms)
        self.policy = ev
        return True

    def apply_node(self, ev: NodeEvent) -> bool:
        held = self.nodes.get(ev.name)
        if held is not None and (ev.meta.time_ms < held.meta.time_ms or ev == held):
            return False
        self._saw(ev.meta.time_ms)
        self.nodes[ev.name] = ev
        return True

    def evict(self, cutoff_ms: int) -> int:
        """Forget what stopped changing before `cutoff_ms` (event time) and is over: pods whose rows are
        all released, GPUs no longer reported, cleared findings and XIDs, deleted nodes. Bounds a
        long-running replica; a restarted one re-reads the topics and evicts the same things."""
        n = 0
        for uid, b in list(self._pods.items()):
            if compact.as_of_ms(b) >= cutoff_ms:
                continue
            p = compact.unpack_pod(b)
            if not any(r.active for r in p.rows):
                self._drop_pod(uid, p.node, p.namespace)
                del self._pods[uid]
                n += 1
        for uuid, b in list(self._gpus.items()):
            if compact.as_of_ms(b) < cutoff_ms:
                self._drop_gpu(uuid)
                n += 1
        for fid, f in list(self.findings.items()):
            if f.at_ms < cutoff_ms and (not f.active or f.kind == XID_KIND):
                del self.findings[fid]
                self._xid_keys = None
                n += 1
        for name, ev in list(self.nodes.items()):
            if ev.deleted and ev.meta.time_ms < cutoff_ms:
                del self.nodes[name]
                n += 1
        return n

    # ------------------------------------------------------------------ reads

    def row_keys(self, node: str | None = None, namespace: str | None = None) -> list[RowKey]:
        """Row keys in contract order (namespace, pod, pod_uid, container, device_id)."""
        if node is not None and namespace is not None:
            # Narrow by whichever index is smaller, then filter by the other.
            by_node = self._pods_by_node.get(node, ())
            by_ns = self._pods_by_ns.get(namespace, set())
            if len(by_node) <= len(by_ns):
                return [k for k in self.row_keys(node=node) if k[0] == namespace]
            on_node = set(by_node)
            return [k for k in self.row_keys(namespace=namespace) if k[2] in on_node]
        scope: tuple[str, str] | None = None
        uids: Iterable[str]
        if node is not None:
            scope, uids = ("node", node), self._pods_by_node.get(node, ())
        elif namespace is not None:
            scope, uids = ("ns", namespace), self._pods_by_ns.get(namespace, ())
        else:
            uids = self._row_keys.keys()
        cached = self._row_slices.cache.get(scope)
        if cached is None:
            cached = sorted(k for uid in uids for k in _keys(self._row_keys.get(uid)))
            self._row_slices.cache[scope] = cached
        return cached

    def namespaces(self) -> Collection[str]:
        """Namespaces of the pods held (a live view: do not keep it across awaits)."""
        return self._pods_by_ns.keys()

    def row(self, key: RowKey) -> tuple[PodAttribution, AttributionRow]:
        """The pod and the row (its `windows` empty: see `windows`)."""
        uid = key[2]
        pod = compact.unpack_pod(self._pods[uid])
        return pod, pod.rows[_keys(self._row_keys[uid]).index(key)]

    def windows(self, key: RowKey) -> tuple[WindowStat, ...]:
        """The row's merged closed windows within the retention, oldest first."""
        return windows.windows(self._rows[key])

    def window_stats(self, key: RowKey) -> list[Stat]:
        """`windows` as plain tuples (start_ms, samples, util_sum, util_samples, fb_max_mib,
        power_sum_w), for scans over many rows."""
        return windows.unpack(self._rows[key])

    def row_json(self, key: RowKey) -> Json:
        """The rendered /v1/pods row; cached (a bounded number of rows) until the pod changes. Callers
        must not mutate it."""
        cache = self._rendered
        out = cache.get(key)
        if out is not None:
            cache.move_to_end(key)
            return out
        out = cache[key] = pod_row_json(*self.row(key))
        if len(cache) > self._render_cache:
            cache.popitem(last=False)
        return out

    def pod_row_keys(self, pod_uid: str) -> list[RowKey]:
        return list(_keys(self._row_keys.get(pod_uid)))

    def gpu_keys(self, node: str | None = None) -> list[GpuKey]:
        """GPU keys in contract order (node, index, gpu_uuid)."""
        scope = None if node is None else ("node", node)
        cached = self._gpu_slices.cache.get(scope)
        if cached is None:
            held, index = self._gpus, compact.gpu_index
            nodes = self._gpus_by_node.items() if node is None else [(node, self._gpus_by_node.get(node, ()))]
            cached = sorted((n, index(held[u]), u) for n, uuids in nodes for u in uuids)
            self._gpu_slices.cache[scope] = cached
        return cached

    def xid_keys(self) -> list[XidKey]:
        """xid-owner findings in time order."""
        if self._xid_keys is None:
            self._xid_keys = sorted(
                (f.at_ms, f.node, f.gpu_uuid, f.id) for f in self.findings.values() if f.kind == XID_KIND
            )
        return self._xid_keys

    def row_count(self) -> int:
        return len(self._rows)
