"""When an output is worth publishing: the change rule, compared with the last published one per key.

A PodAttribution or GpuState is published when something a subscriber acts on changed (identity,
flags, ownership, newly closed windows), when a number moved by at least its threshold since the last
publication, or when `heartbeat_ms` of event time passed since then. A sample time advancing alone is
not a change. Findings are published whenever they differ at all (they are rare and carry state
transitions). Everything here is event time and pure, so the live joiner and replay publish the same.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from operator import attrgetter

from periscope.core.model import AttributionRow, Finding, GpuState, MigState, Output, PodAttribution

_EPS = 1e-9  # 50.3 - 49.3 is 0.99999...: a move of exactly one threshold counts


@dataclass(frozen=True, slots=True)
class ChangeConfig:
    heartbeat_ms: int = 5000  # publish at least this often (event time) while a key keeps producing
    util_pct: float = 1.0  # util_pct and avg_util_pct, percentage points
    fb_mib: float = 1.0
    power_w: float = 1.0
    temp_c: float = 1.0
    wasted_gpu_hours: float = 0.01


def _moved(old: float | None, new: float | None, threshold: float) -> bool:
    if old is None or new is None:
        return (old is None) != (new is None)
    return abs(new - old) >= threshold - _EPS


# Fields compared exactly, read as one tuple each (attrgetter runs in C); the numbers are compared with
# thresholds; last_seen_ms, sample_ms and as_of_ms only advance, and windows are compared by whether any
# closed since the last publication. The numbers are checked first: they are what usually moved.
_PROFILE = ("sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "dram_active_pct")  # percent, like util
_ROW_EXACT = attrgetter(*(f.name for f in fields(AttributionRow) if f.name not in (
    "util_pct", "avg_util_pct", "fb_used_mib", "power_w", "wasted_gpu_hours", "last_seen_ms", "sample_ms",
    "windows", *_PROFILE)))
_PROFILE_OF = attrgetter(*_PROFILE)
_POD_EXACT = attrgetter(*(f.name for f in fields(PodAttribution) if f.name not in ("rows", "as_of_ms")))
_GPU_EXACT = attrgetter(*(f.name for f in fields(GpuState) if f.name not in (
    "util_pct", "fb_used_mib", "power_w", "temp_c", "mig_devices", "sample_ms", "as_of_ms")))
_MIG_EXACT = attrgetter(*(f.name for f in fields(MigState) if f.name not in ("util_pct", "fb_used_mib")))


def row_changed(old: AttributionRow, new: AttributionRow, cfg: ChangeConfig) -> bool:
    if new.windows:
        return True
    a, b = old.util_pct, new.util_pct
    if a is not None and b is not None and abs(b - a) >= cfg.util_pct - _EPS:
        return True  # _moved inline for the number that moves most often
    return (_moved(a, b, cfg.util_pct)
            or _moved(old.avg_util_pct, new.avg_util_pct, cfg.util_pct)
            or _moved(old.fb_used_mib, new.fb_used_mib, cfg.fb_mib)
            or _moved(old.power_w, new.power_w, cfg.power_w)
            or _moved(old.wasted_gpu_hours, new.wasted_gpu_hours, cfg.wasted_gpu_hours)
            or _ROW_EXACT(old) != _ROW_EXACT(new)
            or (_PROFILE_OF(old) != _PROFILE_OF(new) and any(
                _moved(a, b, cfg.util_pct) for a, b in zip(_PROFILE_OF(old), _PROFILE_OF(new), strict=True))))


def _mig_changed(old: MigState, new: MigState, cfg: ChangeConfig) -> bool:
    return (_moved(old.util_pct, new.util_pct, cfg.util_pct)
            or _moved(old.fb_used_mib, new.fb_used_mib, cfg.fb_mib)
            or _MIG_EXACT(old) != _MIG_EXACT(new))


def pod_changed(old: PodAttribution, new: PodAttribution, cfg: ChangeConfig) -> bool:
    if len(old.rows) != len(new.rows):
        return True
    for a, b in zip(old.rows, new.rows, strict=True):
        if row_changed(a, b, cfg):
            return True
    return bool(_POD_EXACT(old) != _POD_EXACT(new))


def gpu_changed(old: GpuState, new: GpuState, cfg: ChangeConfig) -> bool:
    a, b = old.util_pct, new.util_pct
    if a is not None and b is not None and abs(b - a) >= cfg.util_pct - _EPS:
        return True  # _moved inline for the number that moves most often
    if (_moved(a, b, cfg.util_pct)
            or _moved(old.fb_used_mib, new.fb_used_mib, cfg.fb_mib)
            or _moved(old.power_w, new.power_w, cfg.power_w)
            or _moved(old.temp_c, new.temp_c, cfg.temp_c)):
        return True
    if len(old.mig_devices) != len(new.mig_devices):
        return True
    for ma, mb in zip(old.mig_devices, new.mig_devices, strict=True):
        if _mig_changed(ma, mb, cfg):
            return True
    return bool(_GPU_EXACT(old) != _GPU_EXACT(new))


def worth_publishing(last: Output | None, new: Output, cfg: ChangeConfig) -> bool:
    """Whether `new` is published, given the last output published under the same key (None: never)."""
    if last is None:
        return True
    if isinstance(new, Finding):
        return last != new
    if isinstance(new, GpuState):
        return not isinstance(last, GpuState) or gpu_due(last, new, cfg)
    return not isinstance(last, PodAttribution) or pod_due(last, new, cfg)


def pod_due(last: PodAttribution, new: PodAttribution, cfg: ChangeConfig) -> bool:
    """`worth_publishing` for a pod's attribution that was published before."""
    # The heartbeat, written out here and in gpu_due rather than called: every pod and GPU of every
    # sample comes this way. A later instant only: heartbeat 0 publishes every sample, never one twice.
    if new.as_of_ms > last.as_of_ms and new.as_of_ms - last.as_of_ms >= cfg.heartbeat_ms:
        return True
    return pod_changed(last, new, cfg)


def gpu_due(last: GpuState, new: GpuState, cfg: ChangeConfig) -> bool:
    """`worth_publishing` for a GPU's state that was published before."""
    if new.as_of_ms > last.as_of_ms and new.as_of_ms - last.as_of_ms >= cfg.heartbeat_ms:
        return True  # the heartbeat, as in pod_due
    return gpu_changed(last, new, cfg)


def without_windows(o: Output) -> Output:
    """What is kept of a published output to compare later ones with: its windows were published once
    and are never compared again, so the copy kept need not hold them."""
    if isinstance(o, PodAttribution) and any(r.windows for r in o.rows):
        return replace(o, rows=tuple(replace(r, windows=()) for r in o.rows))
    return o


def carry_windows(older: Output | None, newer: Output) -> Output:
    """`newer` with the windows `older` published and `newer` lacks, for a publisher that sends only the
    newest output of a key out of several (recovery): each closed window still reaches subscribers."""
    if not isinstance(older, PodAttribution) or not isinstance(newer, PodAttribution):
        return newer
    before = {(r.container, r.device_id): r.windows for r in older.rows if r.windows}
    if not before:
        return newer
    rows = []
    for r in newer.rows:
        old = before.get((r.container, r.device_id), ())
        have = {w.start_ms for w in r.windows}
        extra = tuple(w for w in old if w.start_ms not in have)
        rows.append(replace(r, windows=tuple(sorted((*extra, *r.windows), key=lambda w: w.start_ms)))
                    if extra else r)
    return replace(newer, rows=tuple(rows))
