"""The fake apiserver's object store: the kinds it serves, objects, one revision counter, history and
watch fan-out.

A `Kind` names one resource the way the apiserver's discovery does; `KINDS` is the whole catalogue,
from core pods and nodes to the GPU Operator's ClusterPolicy CRD, DRA resourceclaims and coordination
leases. Like etcd behind a real apiserver, `ObjectStore` keeps every object under (plural, namespace,
name) and stamps each change with the next value of a single revision counter shared by all kinds; it
records the change in a bounded history, which watches read from the revision they have reached, and
wakes them. Versions below the compaction floor (raised by `compact`, `clear` or the history limit) are
expired, so a watch at or resuming from one must get 410. It also remembers which optional kinds are
served (the GPU Operator CRD, DRA). Every method is thread-safe under one re-entrant lock.
"""

from __future__ import annotations

import asyncio
import bisect
import copy
import itertools
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Kind:
    plural: str
    kind: str
    group: str
    version: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


KINDS: tuple[Kind, ...] = (
    Kind("pods", "Pod", "", "v1", True),
    Kind("nodes", "Node", "", "v1", False),
    Kind("daemonsets", "DaemonSet", "apps", "v1", True),
    Kind("clusterpolicies", "ClusterPolicy", "nvidia.com", "v1", False),
    Kind("resourceclaims", "ResourceClaim", "resource.k8s.io", "v1", True),
    Kind("leases", "Lease", "coordination.k8s.io", "v1", True),
)
BY_NAME = {n.lower(): k for k in KINDS for n in (k.plural, k.kind, k.kind.lower())}


def status(code: int, reason: str, message: str) -> Obj:
    """The `Status` body every error (and every watch ERROR event) carries."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


def rfc3339(ms: int) -> str:
    """Unix ms as a metav1.Time string (whole seconds, UTC), as the apiserver writes them."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms // 1000))


class ObjectStore:
    """Versioned objects of every kind: `upsert`/`delete`/`get`/`objects`, `compact`, `clear`."""

    history_limit = 10_000  # events kept for resuming watches; older versions expire, as etcd compacts

    def __init__(self, *, crd_installed: bool = True, dra_installed: bool = True) -> None:
        self._lock = threading.RLock()
        self._objects: dict[tuple[str, str, str], Obj] = {}
        self._history: list[tuple[int, Kind, str, Obj]] = []
        self._rv = 1
        self._floor = 0  # watches from a version below this get 410
        self._served = {"clusterpolicies": crd_installed, "resourceclaims": dra_installed}
        self._loop: asyncio.AbstractEventLoop | None = None  # the serving loop the watches run on
        self._tick = asyncio.Event()  # set (and replaced) on the serving loop after every change
        self._uids = itertools.count(1)

    @property
    def resource_version(self) -> int:
        return self._rv

    def kind(self, name: str) -> Kind:
        try:
            return BY_NAME[name.lower()]
        except KeyError:
            raise ValueError(f"unknown kind {name!r}; known: {', '.join(k.plural for k in KINDS)}") from None

    def served(self, kind: Kind) -> bool:
        return self._served.get(kind.plural, True)

    def upsert(self, kind: str, obj: Obj) -> Obj:
        """Create or replace an object; a different metadata.uid under the same name is a recreate
        (DELETED for the old object, then ADDED), as a StatefulSet pod replaced by the controller."""
        k = self.kind(kind)
        if not self.served(k):
            raise ValueError(f"{k.plural}.{k.group} is not served (CRD or API group not installed)")
        new = copy.deepcopy(obj)
        meta = new.setdefault("metadata", {})
        if not meta.get("name"):
            raise ValueError("metadata.name is required")
        key = self.key(kind, meta.get("namespace"), meta["name"])
        if k.namespaced:
            meta["namespace"] = key[1]
        else:
            meta.pop("namespace", None)
        with self._lock:
            old = self._objects.get(key)
            if old is not None and meta.get("uid") and meta["uid"] != old["metadata"]["uid"]:
                self._remove(key)
                old = None
            prev = old["metadata"] if old is not None else {}
            meta["uid"] = meta.get("uid") or prev.get("uid") or self._new_uid()
            meta["creationTimestamp"] = meta.get("creationTimestamp") or prev.get("creationTimestamp") \
                or rfc3339(time.time_ns() // 1_000_000)
            new.setdefault("apiVersion", k.api_version)
            new.setdefault("kind", k.kind)
            self._rv += 1
            meta["resourceVersion"] = str(self._rv)
            self._objects[key] = new
            self._record(k, "ADDED" if old is None else "MODIFIED", new)
            return copy.deepcopy(new)

    def key(self, kind: str, namespace: str | None, name: str) -> tuple[str, str, str]:
        """Where an object is stored: a namespaced kind's default namespace is `default`."""
        k = self.kind(kind)
        return k.plural, (namespace or "default") if k.namespaced else "", name

    def delete(self, kind: str, namespace: str | None, name: str) -> bool:
        """Remove an object. A pod is deleted as the real apiserver deletes one with no kubelet to wait
        for: first stamped (deletionTimestamp, grace period 0: a MODIFIED event), then removed."""
        with self._lock:
            key = self.key(kind, namespace, name)
            obj = self._objects.get(key)
            stamped = obj is not None and obj["metadata"].get("deletionGracePeriodSeconds") == 0
            if obj is not None and key[0] == "pods" and not stamped:
                meta = obj["metadata"]
                meta.setdefault("deletionTimestamp", rfc3339(time.time_ns() // 1_000_000))
                meta["deletionGracePeriodSeconds"] = 0
                self._rv += 1
                meta["resourceVersion"] = str(self._rv)
                self._record(BY_NAME["pods"], "MODIFIED", obj)
            return self._remove(key)

    def get(self, kind: str, namespace: str | None, name: str) -> Obj | None:
        with self._lock:
            obj = self._objects.get(self.key(kind, namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def objects(self, kind: str, namespace: str | None = None) -> list[Obj]:
        with self._lock:
            return [copy.deepcopy(o) for o in self._select(self.kind(kind), namespace)]

    def _select(self, kind: Kind, namespace: str | None) -> list[Obj]:
        """The stored objects of a kind (in one namespace, or all), in key order; not copies."""
        return [o for key, o in sorted(self._objects.items())
                if key[0] == kind.plural and namespace in (None, key[1])]

    def set_crd_installed(self, installed: bool) -> None:
        """Install or remove the ClusterPolicy CRD; removing it deletes every ClusterPolicy."""
        self._set_served("clusterpolicies", installed)

    def set_dra_installed(self, installed: bool) -> None:
        """Serve or stop serving resource.k8s.io/v1 (a cluster without DRA)."""
        self._set_served("resourceclaims", installed)

    def compact(self) -> None:
        """Expire all versions handed out so far: open watches get ERROR 410, resumes fail."""
        with self._lock:
            self._rv += 1
            self._floor = self._rv
            self._history.clear()
            self._notify()

    def clear(self) -> None:
        """Drop every object without events (a wiped store); old versions become expired."""
        with self._lock:
            self._objects.clear()
            self.compact()

    def _new_uid(self) -> str:
        # Deterministic (counter-based) so simulator runs are reproducible.
        return str(uuid.UUID(int=(0x5E << 120) | next(self._uids)))

    def _set_served(self, plural: str, served: bool) -> None:
        with self._lock:
            if not served:
                for key in [key for key in self._objects if key[0] == plural]:
                    self._remove(key)
            self._served[plural] = served  # an unserved kind's watches end
            self._notify()

    def _remove(self, key: tuple[str, str, str]) -> bool:
        obj = self._objects.pop(key, None)
        if obj is None:
            return False
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._record(BY_NAME[key[0]], "DELETED", obj)
        return True

    def _record(self, kind: Kind, typ: str, obj: Obj) -> None:
        self._history.append((self._rv, kind, typ, copy.deepcopy(obj)))
        if len(self._history) > self.history_limit:
            dropped = self._history.pop(0)
            self._floor = dropped[0] + 1
        self._notify()

    def _since(self, rv: int, kind: Kind, namespace: str | None) -> list[tuple[str, Obj]]:
        """(type, object) of the recorded changes after `rv` to objects of `kind` (in `namespace`)."""
        start = bisect.bisect_right(self._history, rv, key=lambda change: change[0])
        return [(t, o) for _, k, t, o in self._history[start:]
                if k is kind and namespace in (None, o["metadata"].get("namespace"))]

    def _notify(self) -> None:
        """Wake every watch; through the loop's FIFO, so from any thread."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        self._tick.set()
        self._tick = asyncio.Event()
