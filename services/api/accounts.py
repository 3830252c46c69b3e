"""GPU-hours the API has seen, as counters: allocated, used and idle per namespace and workload.

The joiner publishes each row's windows, with their accounting (periscope.core.accounting), once as
they close, and again (whole, same start) when a row came back within a window. The view merges them
(services.api.windows); each merge hands the windows it takes, with the copy it replaced, to
`GpuHoursTotals.add`, which adds what is new: a window not held before counts whole, a repeat only
by what it grew. The totals only grow, as Prometheus counters must, and outlive the windows (pruned
after the view's window retention) and the pods (evicted after the view's retention). They start from
nothing when the API starts, and a replica that re-reads the topics counts what they still hold.

Cardinality is bounded: at most `max_series` (namespace, workload) pairs are kept; beyond that a new
workload is counted as workload "other" of its namespace, and once `max_series` namespaces have an
"other" too, as namespace "other" (at most 2 x `max_series` + 1 series in all). A workload is the
pod's controller as the watcher saw it (`Kind/name`, e.g. `Job/etl-28461`), or `Pod` for a pod
without one (never the pod's name: names of bare pods are unbounded).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from periscope.core.accounting import HOUR_MS
from periscope.core.model import PodAttribution
from services.api.windows import Acct

MAX_SERIES = 2000
OTHER = "other"
Key = tuple[str, str]  # namespace, workload


def workload(pod: PodAttribution) -> str:
    return f"{pod.owner_kind}/{pod.owner_name}" if pod.owner_kind and pod.owner_name else "Pod"


@dataclass(slots=True)
class GpuHoursTotals:
    max_series: int = MAX_SERIES
    _ms: dict[Key, list[float]] = field(default_factory=dict)
    _other_namespaces: int = 0

    def _slot(self, key: Key) -> list[float]:
        held = self._ms.get(key)
        if held is not None:
            return held
        if len(self._ms) < self.max_series:
            held = self._ms[key] = [0.0, 0.0, 0.0]
            return held
        other = (key[0], OTHER)
        if other not in self._ms and self._other_namespaces < self.max_series:
            self._other_namespaces += 1
            self._ms[other] = [0.0, 0.0, 0.0]
        return self._ms.get(other) or self._ms.setdefault((OTHER, OTHER), [0.0, 0.0, 0.0])

    def add(self, key: Key, taken: Iterable[tuple[Acct, Acct | None]]) -> None:
        """Count the merged windows' growth over the copies they replaced (never negative)."""
        slot: list[float] | None = None
        for new, old in taken:
            for i in range(3):
                grew = new[i + 1] - (old[i + 1] if old is not None else 0.0)
                if grew > 0:
                    if slot is None:
                        slot = self._slot(key)
                    slot[i] += grew

    def hours(self) -> Iterator[tuple[Key, tuple[float, float, float]]]:
        """(namespace, workload), (allocated, used, idle GPU-hours), sorted by key."""
        for k in sorted(self._ms):
            a, u, i = self._ms[k]
            yield k, (a / HOUR_MS, u / HOUR_MS, i / HOUR_MS)

    def __len__(self) -> int:
        return len(self._ms)
