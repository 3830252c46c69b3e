"""Allocation reconciliation: who holds which device, from PodResources, the checkpoint and DRA.

PodResources knows namespace/name but no UID; the checkpoint knows the UID but no name. A name is
resolved to a UID only through the pod registry *as of the event time*, cross-checked with the
checkpoint; when that still leaves several candidates the holding is reported as ambiguous rather than
guessed.

Which card a device ID stands for is the device map's answer (periscope.core.devices), with one
exception: a HAMi ID (`GPU-<uuid>-<n>`) names a slot the kubelet picked, while HAMi's scheduler picked
the card, and the container got what its AllocResp's NVIDIA_VISIBLE_DEVICES says; where the checkpoint
has it, that card wins. A device nobody can resolve is still a holding, with gpu_uuid "" and the reason.

A DRA device a pod's claim got with adminAccess (monitoring: DCGM, its exporter, the operator's DRA
validator) is not a holding at all: admin access "ignores all ordinary claims to the device", so it
neither makes a holder nor takes a share. Such devices are returned apart, as monitors.
"""

from __future__ import annotations

from dataclasses import dataclass

from periscope.core.deviceid import parse_device_id
from periscope.core.devices import DeviceMap, Resolved
from periscope.core.model import AllocationEntry, AllocationSnapshot, AllocSource, SourceHealth
from periscope.core.pods import PodRecord, PodRegistry

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


# The few combinations of sources a holding is known from, each one tuple for every holding that has it
# (a node's state keeps its holdings; a tuple of its own cost each pod-device row 64 bytes).
_SOURCE_SETS: dict[tuple[str, ...], tuple[str, ...]] = {}


def _sources(srcs: set[str]) -> tuple[str, ...]:
    got = tuple(sorted(srcs))  # (names of AllocSource only: a handful of combinations)
    return _SOURCE_SETS.setdefault(got, got)


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


def _card(raw: str) -> str | None:
    """`raw` when it is a plain NVML UUID (GPU-... or MIG-..., no replica suffix), else None."""
    try:
        d = parse_device_id(raw.strip())
    except ValueError:
        return None
    return d.uuid if d.replica is None and d.uuid == d.raw else None


def visible_cards(entries: tuple[AllocationEntry, ...]) -> dict[tuple[str, str, str], str]:
    """(pod UID, container, HAMi device ID) -> the card the AllocResp gave the container.

    The plugin lists the cards it was told to give, one per device, in request order (unique UUIDs,
    envvar strategy): an ID whose own card is listed was aligned to it; otherwise the IDs map to the
    listed cards in order when the counts agree, and keep their own card when they do not."""
    out: dict[tuple[str, str, str], str] = {}
    for e in entries:
        if e.source is not AllocSource.CHECKPOINT or not e.visible_devices:
            continue
        visible = [c for c in map(_card, e.visible_devices) if c is not None]
        hami: list[tuple[str, str]] = []
        for dev in e.device_ids:
            try:
                d = parse_device_id(dev)
            except ValueError:
                continue
            if d.hami and d.uuid:
                hami.append((dev, d.uuid))
        for i, (dev, own) in enumerate(hami):
            if own in visible:
                out[(e.pod_uid, e.container, dev)] = own
            elif len(visible) == len(hami):
                out[(e.pod_uid, e.container, dev)] = visible[i]
    return out


def unresolved_health(holdings: list[Holding]) -> SourceHealth | None:
    """The `device-ids` health: why held devices could not be resolved to a GPU (None: all resolved)."""
    bad = {h.device.device_id: h.device.unresolved for h in holdings if h.pod_uid and not h.device.gpu_uuid}
    if not bad:
        return None
    listed = "; ".join(f"{d}: {why}" for d, why in sorted(bad.items())[:5])
    more = f"; and {len(bad) - 5} more" if len(bad) > 5 else ""
    return SourceHealth("device-ids", "error", f"{len(bad)} held device IDs unresolved: {listed}{more}")


def _admin_access(rec: PodRecord | None, e: AllocationEntry) -> bool:
    """Whether the pod's claim got this DRA device for administrative access (the watcher's word)."""
    if rec is None:
        return False
    key = (e.claim_name, e.driver, e.pool, e.device)
    return any(
        d.admin_access and (d.claim_name, d.driver, d.pool, d.device) == key for d in rec.info.claim_devices
    )


def reconcile(
    snapshot: AllocationSnapshot | None, pods: PodRegistry, devices: DeviceMap, t_ms: int
) -> list[Holding]:
    """All holdings at time t, sorted deterministically."""
    return reconcile_all(snapshot, pods, devices, t_ms)[0]


def reconcile_all(
    snapshot: AllocationSnapshot | None, pods: PodRegistry, devices: DeviceMap, t_ms: int
) -> tuple[list[Holding], list[Holding]]:
    """(holdings, monitors) at time t, each sorted deterministically: monitors are the DRA devices pods
    got with admin access, in the same shape, and are never holders."""
    if snapshot is None:
        return [], []
    ck_by_dev: dict[tuple[str, str], set[str]] = {}
    ck_entries = [e for e in snapshot.entries if e.source is AllocSource.CHECKPOINT]
    for e in ck_entries:
        for dev in e.device_ids:
            ck_by_dev.setdefault((e.container, dev), set()).add(e.pod_uid)

    rows: dict[tuple[str, str, str], tuple[str, str, str, set[str]]] = {}
    monitors: dict[tuple[str, str, str], tuple[str, str, str]] = {}
    ambiguous: dict[tuple[str, str, str, str], tuple[str, ...]] = {}
    dra_unresolved: dict[str, str] = {}  # DRA device name -> why no NVML device stands for it
    names: dict[tuple[str, str], list[str]] | None = None  # pods.by_name(), once an entry needs it

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
            if not dev_ids and e.device:
                dev_ids = (e.device,)
                dra_unresolved[e.device] = (
                    f"DRA device {e.driver} {e.pool}/{e.device} not resolved to an NVML device by the "
                    "probe (its dra health says why)"
                )
        if names is None:
            names = pods.by_name()
        cands = pods.resolve(e.namespace, e.pod, t_ms, names)
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
            if e.source is AllocSource.DRA and _admin_access(pods.get(uid), e):
                monitors[(uid, e.container, dev)] = (e.namespace, e.pod, e.resource)
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

    cards = visible_cards(snapshot.entries)

    def resolve(uid: str, container: str, dev: str) -> Resolved:
        if dev in dra_unresolved:
            return Resolved(dev, "", unresolved=dra_unresolved[dev])
        r = devices.resolve(dev)
        card = cards.get((uid, container, dev))
        if card is not None and card != r.gpu_uuid:
            c = devices.resolve(card)
            r = Resolved(dev, c.gpu_uuid, c.mig, r.replica, c.unresolved)
        return r

    out = [
        Holding(uid, ns, name, container, resource, resolve(uid, container, dev), _sources(srcs))
        for (uid, container, dev), (ns, name, resource, srcs) in rows.items()
    ]
    out += [
        Holding("", ns, name, container, "", resolve("", container, dev), ("podresources",), cands)
        for (ns, name, container, dev), cands in ambiguous.items()
    ]
    watching = [
        Holding(uid, ns, name, container, resource, resolve(uid, container, dev), ("dra",))
        for (uid, container, dev), (ns, name, resource) in monitors.items()
    ]
    order = lambda h: (h.device.device_id, h.pod_uid, h.container, h.namespace, h.pod)  # noqa: E731
    return sorted(out, key=order), sorted(watching, key=order)
