"""Split one device's measured usage between the pods holding it.

Exclusive: the holder gets the device's numbers. Time-slicing/MPS: per-process NVML samples, mapped to
pods through /proc cgroups, give each holder its own SM util and memory (`process`); without per-process
util every holder gets an equal share, flagged `equal-split`, except under MPS, where the device's util
and power are split in proportion to each holder's processes' memory (`memory-weighted`): a driver may
give no per-process utilization for MPS clients, and their memory is the only per-client measure.
MIG: per-instance memory, util only when the hardware reports it, power stays with the parent GPU
(it is a whole-GPU value).

DCGM (the node's dcgm-exporter, when the probe scrapes one): NVML's util stays primary; where NVML
has none (always on a MIG instance) the unit's graphics-engine activity stands in for it, and the
profiling fields go to a holder whose unit is its alone. On a shared GPU they describe the GPU, not a
pod, so no holder gets them (copying them to every sharer is the mistake this project exists to avoid).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from periscope.core.allocation import Holding
from periscope.core.frozen import fast_init
from periscope.core.model import DcgmProfile, DeviceSample, ProcessSample
from periscope.core.pods import PodRegistry


@fast_init
@dataclass(frozen=True, slots=True)
class Usage:
    util_pct: float | None
    fb_used_mib: float | None
    power_w: float | None
    sharing: str  # exclusive | time-slicing | mps | mig
    share_basis: str  # exclusive | process | memory-weighted | equal-split | none
    gpu_fraction: float
    seen_processes: bool  # the holder's own processes were observed on the device
    dcgm: DcgmProfile | None = None  # the unit's profiling fields, when the unit is this holder's alone
    util_from_dcgm: bool = False  # util_pct is DCGM's graphics-engine activity (NVML had none)


USAGE_FIELDS = ("util_pct", "fb_used_mib", "power_w", "sharing", "share_basis", "gpu_fraction",
                "seen_processes", "dcgm", "util_from_dcgm")


def _round(v: float | None) -> float | None:
    """`v` to three decimals; `v` itself where that changes nothing (`round` makes a new float each
    time, and a row's usage would then keep a copy of the sample's number; the decoder shares whole
    percentages between samples)."""
    if v is None:
        return None
    r = round(v, 3)
    return v if r == v else r


def device_util(d: DeviceSample) -> tuple[float | None, bool]:
    """The unit's utilization and whether it came from DCGM: NVML's when it has one, else DCGM's
    graphics-engine activity (the MIG-safe measure)."""
    if d.util_pct is not None or d.dcgm is None or d.dcgm.gr_engine_active_pct is None:
        return d.util_pct, False
    return d.dcgm.gr_engine_active_pct, True


def sharing_of(holders: Sequence[Holding], strategy: str) -> str:
    if len(holders) == 1 and holders[0].device.replica is None:  # the common case, without any()
        return "mig" if holders[0].device.mig is not None else "exclusive"
    if any(h.device.mig is not None for h in holders):
        return "mig"
    if len(holders) > 1 or any(h.device.replica is not None for h in holders):
        return strategy if strategy in ("time-slicing", "mps") else "time-slicing"
    return "exclusive"


def split_instance(
    sample: DeviceSample | None,
    holders: Sequence[Holding],
    pods: PodRegistry,
    strategy: str,
    base_fraction: float,
    replicas: int,
) -> tuple[dict[tuple[str, str, str], Usage], list[ProcessSample]]:
    """Usage per holding key on one measured unit (GPU or MIG instance), and unattributed processes."""
    if len(holders) == 1 and holders[0].device.replica is None:
        usage, unattributed = single_usage(sample, holders[0], base_fraction)
        return {holders[0].key: usage}, unattributed
    sharing = sharing_of(holders, strategy)
    n = len(holders)
    procs = sample.processes if sample is not None else ()
    holder_uids = {h.pod_uid for h in holders if h.pod_uid}
    unattributed = [p for p in procs if not p.pod_uid or p.pod_uid not in holder_uids]
    out: dict[tuple[str, str, str], Usage] = {}
    if sample is None or sample.lost:
        for h in holders:
            out[h.key] = Usage(util_pct=None, fb_used_mib=None, power_w=None, sharing=sharing,
                               share_basis="none", gpu_fraction=base_fraction / max(n, 1),
                               seen_processes=False)
        return out, unattributed
    power = sample.power_w
    fraction = base_fraction / max(replicas, n, 1)
    # Assign processes to holders: by container ID when the pod holds several rows here, else to the
    # pod's only row; a pod's unassignable processes are shared among its rows.
    rows_of_pod: dict[str, list[Holding]] = {}
    for h in holders:
        if h.pod_uid:
            rows_of_pod.setdefault(h.pod_uid, []).append(h)
    mine: dict[tuple[str, str, str], list[tuple[ProcessSample, float]]] = {h.key: [] for h in holders}
    for p in procs:
        rows = rows_of_pod.get(p.pod_uid)
        if not rows:
            continue
        if len(rows) > 1:
            cname = pods.container_name(p.pod_uid, p.container_id)
            named = [h for h in rows if h.container == cname] if cname else []
            rows = named or rows
        for h in rows:
            mine[h.key].append((p, 1.0 / len(rows)))

    per_proc_util = any(p.sm_util_pct is not None for p in procs)
    per_proc_mem = any(p.used_mib is not None for p in procs)
    total_util = sum(p.sm_util_pct or 0.0 for p in procs)
    total_mem = sum(p.used_mib or 0.0 for p in procs)
    by_memory = sharing == "mps" and not per_proc_util and total_mem > 0
    for h in holders:
        assigned = mine[h.key]
        mem = sum((p.used_mib or 0.0) * w for p, w in assigned) if per_proc_mem else None
        util: float | None
        if per_proc_util:
            util = min(100.0, sum((p.sm_util_pct or 0.0) * w for p, w in assigned))
            share = util / total_util if total_util > 0 else 1.0 / n
            pw = power * share if power is not None else None
            basis = "process"
        elif by_memory:
            share = (mem or 0.0) / total_mem
            util = sample.util_pct * share if sample.util_pct is not None else None
            pw = power * share if power is not None else None
            basis = "memory-weighted"
        else:
            util = sample.util_pct / n if sample.util_pct is not None else None
            pw = power / n if power is not None else None
            basis = "equal-split"
        if mem is None and sample.fb_used_mib is not None:
            mem = sample.fb_used_mib / n
        if sharing == "mig":
            pw = None
        out[h.key] = Usage(util_pct=_round(util), fb_used_mib=_round(mem), power_w=_round(pw),
                           sharing=sharing, share_basis=basis, gpu_fraction=fraction,
                           seen_processes=bool(assigned))
    return out, unattributed


def single_usage(
    sample: DeviceSample | None, h: Holding, base_fraction: float
) -> tuple[Usage, list[ProcessSample]]:
    """One holder of a whole unit, the common case: what `split_instance` gives it, in one pass over
    the processes (this runs for every device of every sample)."""
    sharing = "mig" if h.device.mig is not None else "exclusive"
    uid = h.pod_uid
    seen = False
    unattributed: list[ProcessSample] = []
    for p in sample.processes if sample is not None else ():
        owner = p.pod_uid
        if owner == uid:
            seen = True
        if not owner or owner != uid:
            unattributed.append(p)
    if sample is None or sample.lost:
        return Usage(None, None, None, sharing, "none", base_fraction, False), unattributed
    util, fb, power = sample.util_pct, sample.fb_used_mib, sample.power_w
    dcgm, from_dcgm = sample.dcgm, False
    if dcgm is not None and util is None:
        util, from_dcgm = device_util(sample)
    # Positional, in USAGE_FIELDS order (every held device of every sample; see rows.ROW_FIELDS for why).
    usage = Usage(_round(util), _round(fb), _round(power), sharing, "exclusive", base_fraction, seen, dcgm,
                  from_dcgm)
    return usage, unattributed
