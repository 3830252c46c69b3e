"""Allocation reconciliation: who holds which device, from PodResources, the checkpoint and DRA.

PodResources knows namespace/name but no UID; the checkpoint knows the UID but no name. A name is
resolved to a UID only through the pod registry *as of the event time*, cross-checked with the
checkpoint; when that still leaves several candidates the holding is reported as ambiguous rather than
guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

from periscope.core.devices import DeviceMap, Resolved
from periscope.core.model import AllocationSnapshot, AllocSource
from periscope.core.pods import PodRegistry

NVIDIA_DRA_DRIVER = "gpu.nvidia.com"


@dataclass(frozen=True, slots=True)
class Holding:
    pod_uid: str  # "" when the holder could not be identified unambiguously
    namespace: str
    pod: str
    container: str
    resource: str
    device: Resolved
    sources: tuple[str, ...]
    candidates: tuple[str, ...] = ()  # for ambiguous holdings: the UIDs it could be

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.pod_uid, self.container, self.device.device_id)


def source_ok(snapshot: AllocationSnapshot, source: str) -> bool:
    for h in snapshot.health:
        if h.source == source:
            return h.state == "ok"
    # No health entry: trust the source if it contributed anything.
    return any(e.source.value == source for e in snapshot.entries)


def _dra_device_ids(driver: str, device: str, ids: tuple[str, ...], devices: DeviceMap) -> tuple[str, ...]:
    if ids:
        return ids
    # NVIDIA DRA names whole GPUs gpu-<minor>; the probe normally resolves them, this is a fallback.
    if driver == NVIDIA_DRA_DRIVER and device.startswith("gpu-") and device[4:].isdigit():
        uuid = devices.gpu_for_minor(int(device[4:]))
        if uuid:
            return (uuid,)
    return ()


def reconcile(
    snapshot: AllocationSnapshot | None, pods: PodRegistry, devices: DeviceMap, t_ms: int
) -> list[Holding]:
    """All holdings at time t, sorted deterministically."""
    if snapshot is None:
        return []
    ck_by_dev: dict[tuple[str, str], set[str]] = {}
    ck_entries = [e for e in snapshot.entries if e.source is AllocSource.CHECKPOINT]
    for e in ck_entries:
        for dev in e.device_ids:
            ck_by_dev.setdefault((e.container, dev), set()).add(e.pod_uid)

    rows: dict[tuple[str, str, str], tuple[str, str, str, set[str]]] = {}
    ambiguous: dict[tuple[str, str, str, str], tuple[str, ...]] = {}

    def add(uid: str, ns: str, name: str, container: str, resource: str, dev: str, src: str) -> None:
        key = (uid, container, dev)
        if key not in rows:
            rec = pods.get(uid)
            if rec is not None and rec.start_ms <= t_ms:
                ns, name = rec.info.namespace, rec.info.name
            rows[key] = (ns, name, resource, set())
        rows[key][3].add(src)

    for e in snapshot.entries:
        if e.source is AllocSource.CHECKPOINT:
            continue
        dev_ids = e.device_ids
        if e.source is AllocSource.DRA:
            dev_ids = _dra_device_ids(e.driver, e.device, e.device_ids, devices)
        cands = pods.resolve(e.namespace, e.pod, t_ms)
        for dev in dev_ids:
            ck_uids = ck_by_dev.get((e.container, dev), set())
            uid: str | None = None
            if len(cands) == 1:
                uid = cands[0]
            elif len(cands) > 1:
                both = [u for u in cands if u in ck_uids]
                uid = both[0] if len(both) == 1 else None
            elif len(ck_uids) == 1:
                # Pod event not seen yet: the checkpoint names the UID, unless that pod is known gone.
                only = next(iter(ck_uids))
                rec = pods.get(only)
                uid = only if rec is None or rec.alive_at(t_ms) else None
            if uid is None:
                ambiguous[(e.namespace, e.pod, e.container, dev)] = tuple(sorted(set(cands) | ck_uids))
                continue
            add(uid, e.namespace, e.pod, e.container, e.resource, dev, e.source.value)
            if uid in ck_uids:
                add(uid, e.namespace, e.pod, e.container, e.resource, dev, AllocSource.CHECKPOINT.value)

    pr_ok = source_ok(snapshot, AllocSource.PODRESOURCES.value)
    for e in ck_entries:
        rec = pods.get(e.pod_uid)
        if rec is not None and not rec.alive_at(t_ms):
            continue  # the kubelet keeps checkpoint entries of gone pods for a while
        if pr_ok and rec is None:
            continue  # unknown UID that a healthy PodResources does not list: a stale entry
        for dev in e.device_ids:
            if (e.pod_uid, e.container, dev) in rows:
                continue
            add(e.pod_uid, "", "", e.container, e.resource, dev, AllocSource.CHECKPOINT.value)

    out = [
        Holding(uid, ns, name, container, resource, devices.resolve(dev), tuple(sorted(srcs)))
        for (uid, container, dev), (ns, name, resource, srcs) in rows.items()
    ]
    out += [
        Holding("", ns, name, container, "", devices.resolve(dev), ("podresources",), cands)
        for (ns, name, container, dev), cands in ambiguous.items()
    ]
    out.sort(key=lambda h: (h.device.device_id, h.pod_uid, h.container, h.namespace, h.pod))
    return out
