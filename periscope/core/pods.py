"""Pod registry keyed by pod UID, with lifetimes, so a reused name resolves to the right UID.

PodResources names pods by namespace/name only; this registry answers "which UID did ns/name refer to
at event time t" and never lets a newer pod inherit an older one's identity.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from periscope.core.model import PodEvent, PodInfo


@dataclass(slots=True)
class PodRecord:
    info: PodInfo
    first_seen_ms: int  # event time we first heard of it
    deleted_ms: int = 0  # when it disappeared from the apiserver (0 = alive)
    # (epoch, seq) of the event that set `info`, held apart: a tuple of them cost each pod 56 bytes
    epoch: int = 0
    seq: int = 0

    @property
    def version(self) -> tuple[int, int]:
        return (self.epoch, self.seq)

    @property
    def start_ms(self) -> int:
        return self.info.created_ms or self.first_seen_ms

    def alive_at(self, t_ms: int) -> bool:
        if self.start_ms > t_ms:
            return False
        return self.deleted_ms == 0 or self.deleted_ms > t_ms


@dataclass(slots=True)
class PodRegistry:
    pods: dict[str, PodRecord] = field(default_factory=dict)  # in the order first heard of
    version: int = 0  # bumps on every effective change (cache key for allocation reconciliation)
    # (version, value) memos of what is derived from the pods alone, e.g. the MPS daemons' UIDs.
    memo: dict[str, tuple[int, Any]] = field(default_factory=dict, compare=False, repr=False)

    def apply(self, ev: PodEvent) -> bool:
        """Apply a state-based pod event; return True if anything changed. Idempotent."""
        info = ev.pod
        ver = (ev.meta.epoch, ev.meta.seq)
        rec = self.pods.get(info.uid)
        if rec is None:
            rec = PodRecord(info=info, first_seen_ms=ev.meta.time_ms, epoch=ver[0], seq=ver[1])
            self.pods[info.uid] = rec
            changed = True
        else:
            changed = False
            if ver >= rec.version and info != rec.info:
                rec.info, rec.epoch, rec.seq, changed = info, ver[0], ver[1], True
            if ev.meta.time_ms < rec.first_seen_ms:
                rec.first_seen_ms, changed = ev.meta.time_ms, True
        if ev.deleted:
            # Keep the earliest deletion time we learn of: duplicates and reorderings converge.
            at = info.deletion_ms or ev.meta.time_ms
            if rec.deleted_ms == 0 or at < rec.deleted_ms:
                rec.deleted_ms, changed = at, True
        if changed:
            self.version += 1
        return changed

    def by_name(self) -> dict[tuple[str, str], list[str]]:
        """(namespace, name) -> UIDs of that name, oldest first. Built for each use (an allocation
        change resolves all its entries with one): kept, it cost ~230 bytes a pod for a rare lookup."""
        index: dict[tuple[str, str], list[str]] = {}
        for uid, rec in self.pods.items():
            index.setdefault((rec.info.namespace, rec.info.name), []).append(uid)
        return index

    def resolve(self, namespace: str, name: str, t_ms: int,
                index: dict[tuple[str, str], list[str]] | None = None) -> list[str]:
        """UIDs that namespace/name could mean at time t (0, 1, or several when ambiguous); `index`:
        `by_name()`, where several names are resolved against the same pods."""
        uids = (index if index is not None else self.by_name()).get((namespace, name), ())
        return [u for u in uids if self.pods[u].alive_at(t_ms)]

    def get(self, uid: str) -> PodRecord | None:
        return self.pods.get(uid)

    def container_name(self, uid: str, container_id: str) -> str | None:
        rec = self.pods.get(uid)
        if rec is None or not container_id:
            return None
        for c in rec.info.containers:
            if c.container_id == container_id:
                return c.name
        return None

    def prune(self, before_ms: int) -> list[str]:
        """Forget pods deleted before `before_ms`; return their UIDs."""
        gone = [u for u, r in self.pods.items() if r.deleted_ms and r.deleted_ms < before_ms]
        for u in gone:
            del self.pods[u]
        if gone:
            self.version += 1
        return gone

    def to_dict(self) -> dict[str, Any]:
        return {
            u: {"first": r.first_seen_ms, "deleted": r.deleted_ms, "ver": list(r.version)}
            for u, r in self.pods.items()
        }
