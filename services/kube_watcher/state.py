"""What the watcher knows about the cluster, and which events a notification turns into.

Synchronous and free of I/O (the clock is injected), so convergence rules are unit-testable:
- pods are tracked by UID, never by name, so a recreated StatefulSet pod is a new pod;
- a (re)list is a full snapshot: every tracked pod is re-sent with relist=True, and every pod that
  vanished while the watch was down gets a deleted=True event;
- a pod is published once it asks for a GPU (nvidia.com/* or a DRA claim) or sits on a node labelled
  nvidia.com/gpu.present=true, and stays tracked until it is deleted;
- updates that change nothing the consumers see (only resourceVersion) are not re-sent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from periscope.bus.topics import NODES, PODS, POLICY, Topic
from periscope.core.model import Meta, NodeEvent, PodEvent, PodInfo, PolicyEvent
from services.kube_watcher import mappers
from services.kube_watcher.watch import Changed, Listed, Notification, Unavailable

SOURCE = "kube_watcher"
POLICY_KEY = "cluster"
Obj = dict[str, Any]
_BLANK = Meta(node="", source="", epoch=0, seq=0, time_ms=0)
KINDS = ("nodes", "resourceclaims", "pods", "clusterpolicies", "gpuclusters", "daemonsets")


@dataclass(frozen=True, slots=True)
class Outgoing:
    topic: Topic
    key: str
    value: PodEvent | NodeEvent | PolicyEvent


class ClusterState:
    def __init__(
        self, *, epoch: int, clock: Callable[[], int], operator_namespace: str = "gpu-operator"
    ) -> None:
        self.epoch = epoch
        self._clock = clock
        self.operator_namespace = operator_namespace
        self._seq = 0
        self.pods: dict[str, Obj] = {}  # every pod by UID (GPU or not: a node may turn GPU later)
        self.tracked: dict[str, PodInfo] = {}  # published pods, last info sent
        self.nodes: dict[str, Obj] = {}
        self.gpu_nodes: set[str] = set()
        self._node_sent: dict[str, NodeEvent] = {}
        self.claims: dict[tuple[str, str], Obj] = {}
        self.policies: dict[str, Obj] = {}
        self.gpuclusters: dict[str, Obj] = {}
        self.daemonsets: dict[str, Obj] = {}
        self.crd = ""  # installed | not-installed | error; "" until the first answer
        self.gpucluster_crd = ""  # the same for gpuclusters.nvidia.com (GPU Operator v26.7's DRA stack)
        self._gpucluster_detail = ""
        self.dra_available: bool | None = None
        self._policy_detail = ""
        self._daemonsets_known = False
        self.last_policy: PolicyEvent | None = None
        self.reported: set[str] = set()  # kinds that answered at least once

    @property
    def synced(self) -> bool:
        return self.reported.issuperset(KINDS)

    def _meta(self, node: str, time_ms: int | None = None) -> Meta:
        self._seq += 1
        now = self._clock()
        return Meta(
            node=node,
            source=SOURCE,
            epoch=self.epoch,
            seq=self._seq,
            time_ms=now if time_ms is None else time_ms,
        )

    def handle(self, note: Notification) -> list[Outgoing]:
        self.reported.add(note.kind)
        handler = getattr(self, f"_on_{note.kind}", None)
        return handler(note) if handler is not None else []

    # ------------------------------------------------------------------ pods
    def _pod_out(self, obj: Obj, *, relist: bool = False) -> Outgoing | None:
        info = mappers.pod_info(obj, self.claims)
        last = self.tracked.get(info.uid)
        if (
            not relist
            and last is not None
            and dataclasses.replace(last, resource_version="")
            == dataclasses.replace(info, resource_version="")
        ):
            return None
        self.tracked[info.uid] = info
        meta = self._meta(info.node, mappers.pod_event_time(obj, self._clock()))
        return Outgoing(PODS, info.node, PodEvent(meta=meta, pod=info, relist=relist))

    def _pod_gone(self, info: PodInfo, *, relist: bool = False) -> Outgoing:
        self.tracked.pop(info.uid, None)
        return Outgoing(
            PODS, info.node, PodEvent(meta=self._meta(info.node), pod=info, deleted=True, relist=relist)
        )

    def _relevant(self, obj: Obj) -> bool:
        uid = str((obj.get("metadata") or {}).get("uid", ""))
        return uid in self.tracked or mappers.is_gpu_pod(obj, self.gpu_nodes)

    def _on_pods(self, note: Notification) -> list[Outgoing]:
        out: list[Outgoing] = []
        if isinstance(note, Listed):
            self.pods = {str(o["metadata"]["uid"]): o for o in note.items}
            for uid in [u for u in self.tracked if u not in self.pods]:
                out.append(self._pod_gone(self.tracked[uid], relist=True))
            out += [o for o in (self._pod_out(p, relist=True) for p in note.items if self._relevant(p)) if o]
        elif isinstance(note, Changed):
            uid = str(note.obj["metadata"]["uid"])
            if note.type == "DELETED":
                self.pods.pop(uid, None)
                if uid in self.tracked:
                    out.append(self._pod_gone(mappers.pod_info(note.obj, self.claims)))
            else:
                self.pods[uid] = note.obj
                if self._relevant(note.obj) and (ev := self._pod_out(note.obj)):
                    out.append(ev)
        return out

    def _refresh_pods(self, pods: Iterable[Obj]) -> list[Outgoing]:
        return [o for o in (self._pod_out(p) for p in pods if self._relevant(p)) if o]

    # ------------------------------------------------------------------ claims (DRA)
    def _on_resourceclaims(self, note: Notification) -> list[Outgoing]:
        touched: set[tuple[str, str]] = set()
        if isinstance(note, Listed):
            touched = set(self.claims)
            self.claims = {_ns_name(o): o for o in note.items}
            touched |= set(self.claims)
            self.dra_available = True
        elif isinstance(note, Changed):
            key = _ns_name(note.obj)
            touched = {key}
            if note.type == "DELETED":
                self.claims.pop(key, None)
            else:
                self.claims[key] = note.obj
        elif isinstance(note, Unavailable):
            touched, self.claims = set(self.claims), {}
            self.dra_available = False
        users = [
            p
            for p in self.pods.values()
            if any((_ns_name(p)[0], n) in touched for n in mappers.pod_claim_names(p))
        ]
        return self._refresh_pods(users) + self._policy_out()

    # ------------------------------------------------------------------ nodes
    def _node_out(self, obj: Obj, *, force: bool = False) -> list[Outgoing]:
        name = str(obj["metadata"]["name"])
        self.nodes[name] = obj
        was_gpu, is_gpu = name in self.gpu_nodes, mappers.is_gpu_node(obj)
        (self.gpu_nodes.add if is_gpu else self.gpu_nodes.discard)(name)
        out: list[Outgoing] = []
        event = mappers.node_event(obj, _BLANK)
        if force or self._node_sent.get(name) != event:
            self._node_sent[name] = event
            out.append(Outgoing(NODES, name, dataclasses.replace(event, meta=self._meta(name))))
        if is_gpu and not was_gpu:  # its pods become interesting now
            out += self._refresh_pods(p for p in self.pods.values() if mappers.pod_node(p) == name)
        return out

    def _node_gone(self, name: str) -> list[Outgoing]:
        self.nodes.pop(name, None)
        self.gpu_nodes.discard(name)
        last = self._node_sent.pop(name, None)
        if last is None:
            return []
        return [Outgoing(NODES, name, dataclasses.replace(last, meta=self._meta(name), deleted=True))]

    def _on_nodes(self, note: Notification) -> list[Outgoing]:
        out: list[Outgoing] = []
        if isinstance(note, Listed):
            names = {str(o["metadata"]["name"]) for o in note.items}
            for name in [n for n in self._node_sent if n not in names]:
                out += self._node_gone(name)
            for obj in note.items:
                out += self._node_out(obj, force=True)
        elif isinstance(note, Changed):
            if note.type == "DELETED":
                out += self._node_gone(str(note.obj["metadata"]["name"]))
            else:
                out += self._node_out(note.obj)
        return out

    # ------------------------------------------------------------------ GPU Operator intent
    def _on_clusterpolicies(self, note: Notification) -> list[Outgoing]:
        if isinstance(note, Listed):
            self.policies = {_ns_name(o)[1]: o for o in note.items}
            self.crd, self._policy_detail = "installed", ""
        elif isinstance(note, Changed):
            name = _ns_name(note.obj)[1]
            if note.type == "DELETED":
                self.policies.pop(name, None)
            else:
                self.policies[name] = note.obj
            self.crd, self._policy_detail = "installed", ""
        elif isinstance(note, Unavailable):
            self.policies = {}
            if note.status == 404:
                self.crd, self._policy_detail = "not-installed", "clusterpolicies.nvidia.com/v1 is not served"
            else:
                self.crd, self._policy_detail = "error", f"listing ClusterPolicies: {note.detail}"
        return self._policy_out()

    def _on_gpuclusters(self, note: Notification) -> list[Outgoing]:
        """Watched beside ClusterPolicies: a cluster runs one or the other (mappers.policy_event)."""
        if isinstance(note, Listed):
            self.gpuclusters = {_ns_name(o)[1]: o for o in note.items}
            self.gpucluster_crd, self._gpucluster_detail = "installed", ""
        elif isinstance(note, Changed):
            name = _ns_name(note.obj)[1]
            if note.type == "DELETED":
                self.gpuclusters.pop(name, None)
            else:
                self.gpuclusters[name] = note.obj
            self.gpucluster_crd, self._gpucluster_detail = "installed", ""
        elif isinstance(note, Unavailable):
            self.gpuclusters = {}
            if note.status == 404:
                self.gpucluster_crd, self._gpucluster_detail = "not-installed", ""
            else:
                self.gpucluster_crd = "error"
                self._gpucluster_detail = f"listing GPUClusters: {note.detail}"
        return self._policy_out()

    def _on_daemonsets(self, note: Notification) -> list[Outgoing]:
        if isinstance(note, Listed):
            self.daemonsets = {_ns_name(o)[1]: o for o in note.items}
        elif isinstance(note, Changed):
            name = _ns_name(note.obj)[1]
            if note.type == "DELETED":
                self.daemonsets.pop(name, None)
            else:
                self.daemonsets[name] = note.obj
        self._daemonsets_known = True
        return self._policy_out()

    def _policy_out(self) -> list[Outgoing]:
        # One complete picture, not three partial ones at start-up.
        answered = self.crd and self.gpucluster_crd and self._daemonsets_known
        if not answered or self.dra_available is None:
            return []
        event = mappers.policy_event(
            _BLANK,
            crd=self.crd,
            policies=self.policies.values(),
            daemonsets=self.daemonsets.values(),
            namespace=self.operator_namespace,
            dra_available=self.dra_available,
            detail=self._policy_detail or self._gpucluster_detail,
            gpuclusters=self.gpuclusters.values(),
            gpucluster_crd=self.gpucluster_crd,
        )
        if self.last_policy is not None and dataclasses.replace(self.last_policy, meta=_BLANK) == event:
            return []
        self.last_policy = dataclasses.replace(event, meta=self._meta(POLICY_KEY))
        return [Outgoing(POLICY, POLICY_KEY, self.last_policy)]


def _ns_name(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")
