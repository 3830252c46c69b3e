"""Catching up: what a worker publishes of a node's outputs while it works through records that waited
on the broker (a restart, a new consumer group, a rebalance, a probe's buffered backlog).

Live, a batch holds a tick or two of a node and every output is published at once. Catching up, the core
would compute an attribution and a GPU state per key for every tick, and publishing each would cost the
worker most of its time (encoding and producing ~1.9 records per device sample) for states that are
stale before they land. So once a batch finds the worker catching up on a node, the core builds no views
for its samples (periscope.core.engine.pause_views: the state, windows and findings advance as ever),
and the worker gathers what comes out (`Gathered`: findings, and views the core refreshes on its own,
before an XID, a prune or a sample without a device) and publishes it when it has caught up, or before
the node's next persist at the latest, after the views the samples ended with (`refresh_views`): the
newest attribution and GPU state per key as the core computed them, each closed window on its row's
attribution (in one publication only), and every finding in the order the core computed them. Every
subscriber ends where it would with all of the outputs (tests/unit/test_core_views_paused.py and
test_joiner_newest.py); building only these cut the worker's CPU per device sample on a backlog by a
fifth to a half (bench/README.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import itemgetter

from periscope.core.model import Finding, GpuState, Output, PodAttribution

# Telemetry records of a partition on the broker, when a batch was taken, from which the worker counts as
# catching up. Far above what a live worker leaves behind (a node's tick or two), far below a restart's.
LAG_RECORDS = 500
# A node's outputs of one batch that span more event time than this come from records that waited on the
# broker (live, a batch holds a tick or two of a node): the worker is catching up on that node.
CATCH_UP_SPAN_MS = 5_000
# A record that waited this long on the broker (its broker timestamp to the worker's wall clock) is read
# by a worker that is catching up. Live, a record waits well under a second. (A probe whose clock runs
# this far behind the worker's makes its node look behind: its outputs then go out at each persist.)
CATCH_UP_WAIT_S = 3.0


def time_of(o: Output) -> int:
    """Event time an output describes: as_of for attribution and GPU state, at for findings."""
    return o.at_ms if isinstance(o, Finding) else o.as_of_ms


def is_one_shot(o: Output) -> bool:
    """XID findings are unique events (the id names the error), safe to publish again at any time."""
    return isinstance(o, Finding) and o.kind == "xid-owner"


def catching_up(outs: list[Output], backlog: int | None, waited_s: float = 0.0) -> bool:
    """Whether a node's outputs of one batch come from catching up: its oldest record of the batch
    waited at least CATCH_UP_WAIT_S on the broker (`waited_s`), the node's partition had at least
    LAG_RECORDS telemetry records on the broker when the batch was taken (`backlog`), or the outputs span
    more than CATCH_UP_SPAN_MS of event time."""
    if waited_s >= CATCH_UP_WAIT_S or (backlog is not None and backlog >= LAG_RECORDS):
        return True
    times = [time_of(o) for o in outs if not is_one_shot(o)]
    return bool(times) and max(times) - min(times) > CATCH_UP_SPAN_MS


def _closes_windows(o: Output) -> bool:
    return isinstance(o, PodAttribution) and any(r.windows for r in o.rows)


class Gathered:
    """A node's outputs gathered while catching up, reduced as they come to what a subscriber needs of
    all of them: the newest attribution and GPU state per key, the attributions that close windows, and
    every finding. `take()` gives them in the order they were added."""

    __slots__ = ("_kept", "_newest", "_seq")

    def __init__(self) -> None:
        self._seq = 0
        self._kept: list[tuple[int, Output]] = []  # findings, and superseded attributions closing windows
        self._newest: dict[str, tuple[int, Output]] = {}  # key -> the newest attribution or GPU state

    def __bool__(self) -> bool:
        return bool(self._kept or self._newest)

    def add(self, outs: Iterable[Output]) -> None:
        for o in outs:
            self._seq += 1
            if isinstance(o, PodAttribution):
                key = o.pod_uid
            elif isinstance(o, GpuState):
                key = "\0" + o.gpu_uuid  # never equal to a pod UID
            else:
                self._kept.append((self._seq, o))
                continue
            older = self._newest.get(key)
            if older is not None and _closes_windows(older[1]):
                self._kept.append(older)
            self._newest[key] = (self._seq, o)

    def take(self) -> list[Output]:
        """Everything gathered, oldest first; the gatherer is empty after."""
        out = [o for _, o in sorted([*self._kept, *self._newest.values()], key=itemgetter(0))]
        self._kept, self._newest = [], {}
        return out
