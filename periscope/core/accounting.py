"""GPU-hours accounting: what each pod-device row was allocated, used and held idle, sample by sample.

Every telemetry sample of a node charges each row it observes for the time since the node's previous
sample (`gap_ms`, at most `RowConfig.charge_gap_ms`: a longer silence is not billed as if it had
been seen). The charge, in device-equivalent milliseconds (a whole GPU held for 1 ms is 1):
- allocated: the held share of the physical GPU. A whole GPU is 1. A MIG slice is its compute
  slices over the parent's (`3g` of 7 is 3/7; the A30 has 4); a profile the name does not tell falls
  back to the memory fraction. Holders sharing one unit (time-slicing, MPS) split it by what they
  measurably used plus an equal part of the time nobody used: with utilizations u_i (percent, as
  the core attributed them) summing to U over the unit's holders and n = max(replicas, holders),
  u_i/100 + (1 - U/100)/n, or u_i/U once U reaches 100. Nobody busy gives 1/n each (1/replicas);
  without a utilization for every holder it is 1/n too. The parts of a GPU never exceed the GPU.
- used: allocated time weighted by the row's utilization (u/100 of the whole GPU when shared, of the
  slice on MIG), at most the allocated share; time without a utilization reading is `unmeasured`,
  neither used nor idle.
- idle: the core's idle verdict (periscope.core.rows: held for the idle window with average
  utilization below the threshold) decides; once it holds, the allocated time of the below-threshold
  run it confirmed is booked from the run's first sample (as `wasted_gpu_hours` counts from
  `idle_since`; of that sample's gap, half: the run began somewhere within it; all of it when that is
  the row's first sample, whose gap starts no earlier than the pod), then every sample's while it
  holds. The run-up is booked in the window where the verdict was reached.
- memory: framebuffer MiB x ms; energy: the row's attributed power (on MIG, the parent GPU's power x
  the allocated share) x time, in joules.
- request: one per allocated device x time, whatever the device is: the request x hours baseline.

A pod's lifetime bounds the charges of a unit it holds alone (a whole GPU, a MIG slice; on a shared
unit the other holders' shares of the same gap already assume it was there, or was not): a sample
does not charge the pod for the part of its gap before the pod was created, and a row whose pod was
deleted after its last sample is charged up to the deletion, as last observed (`charge_end`). So its
time is billed from creation to deletion, not from sample to sample.

Charges accumulate per tumbling window (the row's windows: periscope.core.rows) in the row's ledger
and are published with the window (WindowStat's accounting fields). A sample's gap that began in the
row's previous window (still unpublished: it closes with this sample) is split at the window's start,
so each window holds the time within it and a period of whole windows the time inside the period,
whatever the phase of the samples. Pure and deterministic: the live
joiner and replay charge the same.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from periscope.core.model import DeviceSample, MigRef, WindowStat
from periscope.core.usage import Usage

if TYPE_CHECKING:
    from periscope.core.rows import RowConfig, RowState

HOUR_MS = 3_600_000

# Ledger: L doubles per window, oldest first: start_ms, gpu_ms, used_gpu_ms, idle_gpu_ms,
# unmeasured_gpu_ms, fb_mib_ms, energy_j, request_gpu_ms, basis (an index into BASES).
L = 9
BASES = ("", "exclusive", "mig-slices", "mig-memory", "process", "memory-weighted", "equal-split",
         "replicas", "mixed")
_MIXED = BASES.index("mixed")

# Compute slices of a whole GPU in MIG mode: 7 on A100, H100, H200 and Blackwell; 4 on the A30.
_PARENT_SLICES = (("A30", 4),)
DEFAULT_PARENT_SLICES = 7
# GPU-instance profile `<g>g.<mem>gb[+me…]`, or a compute-instance profile `<c>c.<g>g.<mem>gb`.
_PROFILE = re.compile(r"^(?:(\d+)c\.)?(\d+)g\.\d+gb")


def parent_slices(model: str) -> int:
    for key, n in _PARENT_SLICES:
        if key in model:
            return n
    return DEFAULT_PARENT_SLICES


_MIG_SHARES: dict[tuple[str, str], tuple[float, str] | None] = {}


def mig_share(mig: MigRef, model: str, memory_fraction: float) -> tuple[float, str]:
    """A MIG slice's share of its parent GPU, and its basis: compute slices from the profile name,
    else the memory fraction."""
    key = (mig.profile, model)
    if key in _MIG_SHARES:
        got = _MIG_SHARES[key]
    else:
        m = _PROFILE.match(mig.profile)
        total = parent_slices(model)
        slices = int(m.group(1) or m.group(2)) if m else 0
        got = (slices / total, "mig-slices") if 0 < slices <= total else None
        if len(_MIG_SHARES) < 1024:
            _MIG_SHARES[key] = got
    return got if got is not None else (memory_fraction, "mig-memory")


def split_shares(utils: Sequence[float | None], replicas: int) -> list[float]:
    """Shares of one measured unit between its holders (see the module doc), in holder order."""
    k = len(utils)
    n = max(replicas, k, 1)
    if any(u is None for u in utils):
        return [1.0 / n] * k
    total = sum(u or 0.0 for u in utils)
    if total >= 100.0:
        return [(u or 0.0) / total for u in utils]
    spare = (1.0 - total / 100.0) / n
    return [(u or 0.0) / 100.0 + spare for u in utils]


def unit_shares(usages: Sequence[Usage], replicas: int, whole: tuple[float, str]) -> list[tuple[float, str]]:
    """(allocated share of the physical GPU, basis) per holder of one measured unit, whose own share
    and basis are `whole` ((1, "exclusive") for a GPU, the slice's for a MIG instance)."""
    if len(usages) == 1 and usages[0].sharing in ("exclusive", "mig"):
        return [whole]
    utils = [u.util_pct for u in usages]
    basis = usages[0].share_basis if all(x is not None for x in utils) else "replicas"
    if basis in ("none", "exclusive"):
        basis = "replicas"
    return [(whole[0] * s, basis) for s in split_shares(utils, replicas)]


def _basis_code(basis: str) -> int:
    return BASES.index(basis) if basis in BASES else _MIXED


def charge(row: RowState, t_ms: int, gap_ms: int, share: float, basis: str, power_w: float | None,
           used_scale: float, cfg: RowConfig) -> None:
    """Charge the sample the row was just observed with (`RowState.observe` ran first, so its usage,
    low run and idle verdict are this sample's). `share`: allocated device-equivalents; `used_scale`:
    what 100 % utilization is worth in them (1 for a whole or shared GPU, the slice's share on MIG);
    `power_w`: the power attributed to the row (None: unknown)."""
    u = row.usage
    if u is None:
        return
    dt = float(min(max(0, gap_ms), cfg.charge_gap_ms))
    alloc = share * dt
    util = u.util_pct
    measured = util is not None
    # Never more than held: holders whose measured use adds up past the unit split it by use, each
    # then using all of its part.
    used = min(used_scale * (util or 0.0) / 100.0, share) * dt
    # Idle: the allocated time of the current below-threshold run is pending until the verdict holds
    # (unknown utilization neither extends nor ends a run, as in RowState.observe).
    in_run = measured and row.low_since_ms != 0
    if not measured:
        pending = row.low_gpu_ms
    elif in_run:
        # The run began somewhere in the gap before its first sample: half of that gap is in it. But
        # for the row's first sample (its gap bounded by the pod's creation, nothing of it seen busy),
        # all of it.
        first = row.low_since_ms == t_ms
        pending = (alloc if t_ms == row.first_seen_ms else alloc / 2) if first else row.low_gpu_ms + alloc
    else:
        pending = 0.0
    this = runup = 0.0
    if row.idle:
        this = alloc if measured else 0.0
        if not row.idle_booked:
            runup = pending - this if in_run else pending
        pending = 0.0
    row.low_gpu_ms, row.idle_booked = pending, row.idle
    amounts: tuple[float, ...] = (alloc, used, this, 0.0 if measured else alloc, (u.fb_used_mib or 0.0) * dt,
                                  (power_w or 0.0) * dt / 1000.0, dt)
    start = t_ms - t_ms % cfg.window_ms
    code = _basis_code(basis) if alloc else 0
    # A gap that began before this sample's window: its part before the window's start belongs to the
    # previous window, while that one is still unpublished (it closes with this sample), so a period of
    # whole windows counts the time inside it, not the time up to its last sample.
    before = min(dt, start - (t_ms - dt)) if dt > 0 else 0.0
    led = row.ledger
    if before > 0 and len(led) >= L and led[-L] < start and led[-L] > row.published_ms:
        f = before / dt
        accrue(led, int(led[-L]), tuple(a * f for a in amounts), code)
        amounts = tuple(a * (1 - f) for a in amounts)
    if runup:
        amounts = (amounts[0], amounts[1], amounts[2] + runup, *amounts[3:])
    accrue(led, start, amounts, code)


def charge_end(row: RowState, end_ms: int, cfg: RowConfig) -> None:
    """Charge a row whose pod was deleted at `end_ms`, after its last sample, for the time between, as
    last observed (`RowState.charged`): the samples that follow no longer see it. Booked in the last
    sample's window, the one the row publishes as it goes inactive; idle only where the verdict held."""
    u, held = row.usage, row.charged
    if u is None or held is None:
        return
    (share, basis), power_w, used_scale = held, row.charged_power, row.charged_scale
    dt = float(min(max(0, end_ms - row.sample_ms), cfg.charge_gap_ms))
    alloc = share * dt
    measured = u.util_pct is not None
    used = min(used_scale * (u.util_pct or 0.0) / 100.0, share) * dt
    amounts = (alloc, used, alloc if row.idle and measured else 0.0, 0.0 if measured else alloc,
               (u.fb_used_mib or 0.0) * dt, (power_w or 0.0) * dt / 1000.0, dt)
    window = row.sample_ms - row.sample_ms % cfg.window_ms
    accrue(row.ledger, window, amounts, _basis_code(basis) if alloc else 0)


def accrue(ledger: array[float], start_ms: int, amounts: tuple[float, ...], basis: int) -> None:
    """Add one charge (gpu, used, idle, unmeasured, fb, energy, request) to the window at `start_ms`."""
    if not ledger or ledger[-L] != start_ms:
        ledger.extend((float(start_ms), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0))
    i = len(ledger) - L
    for k, a in enumerate(amounts, 1):
        ledger[i + k] += a
    if basis:
        held = int(ledger[i + 8])
        ledger[i + 8] = basis if held in (0, basis) else _MIXED


def with_account(ledger: array[float], w: WindowStat) -> WindowStat:
    """The window with its accounting from the ledger (unchanged when the ledger has none for it)."""
    for i in range(len(ledger) - L, -1, -L):
        if ledger[i] == w.start_ms:
            return replace(w, gpu_ms=round(ledger[i + 1], 3), used_gpu_ms=round(ledger[i + 2], 3),
                           idle_gpu_ms=round(ledger[i + 3], 3), unmeasured_gpu_ms=round(ledger[i + 4], 3),
                           fb_mib_ms=round(ledger[i + 5], 3), energy_j=round(ledger[i + 6], 3),
                           request_gpu_ms=round(ledger[i + 7], 3), alloc_basis=BASES[int(ledger[i + 8])])
        if ledger[i] < w.start_ms:
            break
    return w


def forget_published(ledger: array[float], upto_start_ms: int) -> None:
    """Drop the windows published up to `upto_start_ms`, but the newest (the row may come back within
    it, and it is then published again, whole)."""
    cut = 0
    while cut + L < len(ledger) and ledger[cut] <= upto_start_ms:
        cut += L
    if cut:
        del ledger[:cut]


def parent_power(samples: dict[str, DeviceSample], gpu_uuid: str) -> float | None:
    s = samples.get(gpu_uuid)
    return None if s is None or s.lost else s.power_w
