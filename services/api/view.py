"""The materialized view of the joiner's output topics that the HTTP API answers from.

No I/O: the consumer feeds decoded domain objects to `View.apply`, the endpoints read. Applying is
idempotent and never regresses, because delivery is at-least-once and the topics are not compacted (a
replica rebuilding from offset 0 sees every historical state of every pod): a PodAttribution or GpuState
older than the one held is ignored, a Finding older than the held one with the same id is ignored.

Reads are served from lazily built sorted key lists (all rows, per node, per namespace) that are dropped
when something under them changes, so a filtered query at 100,000 rows touches only its own slice.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from periscope.core.model import (
    AttributionRow,
    Finding,
    GpuState,
    NodeEvent,
    PodAttribution,
    PolicyEvent,
)
from services.api import render

# namespace, pod, pod_uid, container, device_id, ordinal (only breaks ties between duplicate rows)
RowKey = tuple[str, str, str, str, str, int]
GpuKey = tuple[str, int, str]  # node, index, gpu_uuid
XidKey = tuple[int, str, str, str]  # at_ms, node, gpu_uuid, finding id

XID_KIND = "xid-owner"


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


class View:
    def __init__(self) -> None:
        self.pods: dict[str, PodAttribution] = {}
        self._rows: dict[RowKey, tuple[PodAttribution, AttributionRow]] = {}
        self._row_keys: dict[str, list[RowKey]] = {}  # pod UID -> its row keys
        self._rendered: dict[RowKey, render.Json] = {}
        self._pods_by_node: dict[str, set[str]] = {}
        self._pods_by_ns: dict[str, set[str]] = {}
        self._row_slices = _Slices()

        self.gpus: dict[str, GpuState] = {}
        self._gpus_by_node: dict[str, set[str]] = {}
        self._gpu_slices = _Slices()

        self.findings: dict[str, Finding] = {}
        self._xid_keys: list[XidKey] | None = None

        self.policy: PolicyEvent | None = None
        self.nodes: dict[str, NodeEvent] = {}
        self.as_of_ms = 0  # newest event time applied

    # ------------------------------------------------------------------ writes

    def apply(self, obj: object) -> bool:
        """Apply one decoded record; True if the view changed. Unknown types are ignored."""
        if isinstance(obj, PodAttribution):
            return self.apply_pod(obj)
        if isinstance(obj, GpuState):
            return self.apply_gpu(obj)
        if isinstance(obj, Finding):
            return self.apply_finding(obj)
        if isinstance(obj, PolicyEvent):
            return self.apply_policy(obj)
        if isinstance(obj, NodeEvent):
            return self.apply_node(obj)
        return False

    def _saw(self, t_ms: int) -> None:
        self.as_of_ms = max(self.as_of_ms, t_ms)

    def apply_pod(self, pod: PodAttribution) -> bool:
        held = self.pods.get(pod.pod_uid)
        if held is not None and (pod.as_of_ms < held.as_of_ms or pod == held):
            return False
        self._saw(pod.as_of_ms)
        if held is not None:
            self._drop_pod(held)
        self.pods[pod.pod_uid] = pod
        _add(self._pods_by_node, pod.node, pod.pod_uid)
        _add(self._pods_by_ns, pod.namespace, pod.pod_uid)
        keys: list[RowKey] = []
        for i, row in enumerate(pod.rows):
            k = (pod.namespace, pod.pod, pod.pod_uid, row.container, row.device_id, i)
            self._rows[k] = (pod, row)
            keys.append(k)
        self._row_keys[pod.pod_uid] = keys
        self._row_slices.drop(("node", pod.node), ("ns", pod.namespace))
        return True

    def _drop_pod(self, pod: PodAttribution) -> None:
        for k in self._row_keys.pop(pod.pod_uid, []):
            self._rows.pop(k, None)
            self._rendered.pop(k, None)
        _remove(self._pods_by_node, pod.node, pod.pod_uid)
        _remove(self._pods_by_ns, pod.namespace, pod.pod_uid)
        self._row_slices.drop(("node", pod.node), ("ns", pod.namespace))

    def apply_gpu(self, gpu: GpuState) -> bool:
        held = self.gpus.get(gpu.gpu_uuid)
        if held is not None and (gpu.as_of_ms < held.as_of_ms or gpu == held):
            return False
        self._saw(gpu.as_of_ms)
        if held is not None:
            _remove(self._gpus_by_node, held.node, held.gpu_uuid)
            self._gpu_slices.drop(("node", held.node))
        self.gpus[gpu.gpu_uuid] = gpu
        _add(self._gpus_by_node, gpu.node, gpu.gpu_uuid)
        self._gpu_slices.drop(("node", gpu.node))
        return True

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
        for uid, p in list(self.pods.items()):
            if p.as_of_ms < cutoff_ms and not any(r.active for r in p.rows):
                self._drop_pod(p)
                del self.pods[uid]
                n += 1
        for uuid, g in list(self.gpus.items()):
            if g.as_of_ms < cutoff_ms:
                _remove(self._gpus_by_node, g.node, uuid)
                self._gpu_slices.drop(("node", g.node))
                del self.gpus[uuid]
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
            by_node = self._pods_by_node.get(node, set())
            by_ns = self._pods_by_ns.get(namespace, set())
            if len(by_node) <= len(by_ns):
                return [k for k in self.row_keys(node=node) if k[0] == namespace]
            return [k for k in self.row_keys(namespace=namespace) if self._rows[k][0].node == node]
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
            cached = sorted(k for uid in uids for k in self._row_keys.get(uid, ()))
            self._row_slices.cache[scope] = cached
        return cached

    def namespaces(self) -> Collection[str]:
        """Namespaces of the pods held (a live view: do not keep it across awaits)."""
        return self._pods_by_ns.keys()

    def row(self, key: RowKey) -> tuple[PodAttribution, AttributionRow]:
        return self._rows[key]

    def row_json(self, key: RowKey) -> render.Json:
        """The rendered /v1/pods row; cached until the pod changes. Callers must not mutate it."""
        out = self._rendered.get(key)
        if out is None:
            pod, row = self._rows[key]
            out = self._rendered[key] = render.pod_row(pod, row)
        return out

    def pod_row_keys(self, pod_uid: str) -> list[RowKey]:
        return list(self._row_keys.get(pod_uid, ()))

    def gpu_keys(self, node: str | None = None) -> list[GpuKey]:
        """GPU keys in contract order (node, index, gpu_uuid)."""
        scope = None if node is None else ("node", node)
        cached = self._gpu_slices.cache.get(scope)
        if cached is None:
            uuids = self.gpus.keys() if node is None else self._gpus_by_node.get(node, set())
            cached = sorted((self.gpus[u].node, self.gpus[u].index, u) for u in uuids)
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
