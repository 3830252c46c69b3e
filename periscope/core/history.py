"""A node's allocation history: what the kubelet said each device was held by, by event time.

Kept as runs of equal content: `allocs` holds each run's first snapshot, sorted by (time, epoch, seq),
and `repeats` the keys of the run's later snapshots (the probe re-sends an unchanged snapshot every few
seconds). Keeping the repeats' keys is what lets a late snapshot of other content split a run exactly
where it should, so any arrival order gives the same runs. XID owners and samples are joined against
the snapshot in force at their own time (`at`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import replace

from periscope.core.model import AllocationSnapshot
from periscope.core.repeats import AllocKey, Repeats

Allocs = list[AllocationSnapshot]
RepeatsByRun = dict[AllocKey, Repeats]


def key_of(snap: AllocationSnapshot) -> AllocKey:
    return (snap.meta.time_ms, snap.meta.epoch, snap.meta.seq)


def same_content(a: AllocationSnapshot, b: AllocationSnapshot) -> bool:
    return a.entries == b.entries and a.allocatable == b.allocatable and a.health == b.health


def add(allocs: Allocs, repeats: RepeatsByRun, snap: AllocationSnapshot,
        intern: Callable[[AllocationSnapshot], AllocationSnapshot]) -> bool:
    """Insert into the run-length history; False if it holds the snapshot already (a duplicate).
    `intern` is applied to a snapshot that starts a run of its own (it is kept)."""
    key = key_of(snap)
    keys = [key_of(s) for s in allocs]
    i = bisect_right(keys, key)  # allocs[:i] start at or before the new snapshot
    run = repeats.get(keys[i - 1]) if i else None
    if (i and keys[i - 1] == key) or (run is not None and key in run):
        return False
    prev = allocs[i - 1] if i else None
    if prev is not None and same_content(prev, snap):
        repeats.setdefault(keys[i - 1], Repeats()).add(key)
        return True
    if prev is not None and run is not None:
        # New content inside prev's run: the run's members after it resume prev's content after it.
        after = run.split_after(key)
        if after:
            if not run:
                del repeats[keys[i - 1]]
            t, epoch, seq = after[0]
            allocs.insert(i, replace(prev, meta=replace(prev.meta, time_ms=t, epoch=epoch, seq=seq)))
            if after[1:]:
                repeats[after[0]] = Repeats(after[1:])
    snap = intern(snap)
    allocs.insert(i, snap)
    if i + 1 < len(allocs) and same_content(snap, allocs[i + 1]):
        # The next run has the new snapshot's content: it is now part of the new snapshot's run.
        nxt = key_of(allocs.pop(i + 1))
        repeats[key] = Repeats([nxt, *repeats.pop(nxt, Repeats())])
    return True


def at(allocs: Allocs, t_ms: int) -> AllocationSnapshot | None:
    """The snapshot in force at t: the last one at or before it."""
    best: AllocationSnapshot | None = None
    for s in allocs:
        if s.meta.time_ms <= t_ms:
            best = s
        else:
            break
    return best


def prune(allocs: Allocs, repeats: RepeatsByRun, cutoff_ms: int) -> None:
    """Forget the runs that ended before the cutoff; the last one before it is kept (it is "as of" it)."""
    keep_from = 0
    for i, s in enumerate(allocs):
        if s.meta.time_ms <= cutoff_ms:
            keep_from = i
    for s in allocs[:keep_from]:
        repeats.pop(key_of(s), None)
    del allocs[:keep_from]
