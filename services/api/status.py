"""What the consumer reports about itself: readiness, counters and lag (read by /readyz and /metrics)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ConsumerStatus:
    group_id: str = ""
    # Ready once every partition was read up to the end offset seen at start; it stays ready after that
    # (serving a slightly stale view beats flapping out of the load balancer when the broker hiccups).
    ready: bool = False
    connected: bool = False
    error: str = ""
    # Partitions still short of their start-time end offset: (topic, partition) -> end offset.
    pending: dict[tuple[str, int], int] = field(default_factory=dict)
    consumed: dict[str, int] = field(default_factory=dict)  # topic -> records read
    applied: int = 0  # records that changed the view
    stale: int = 0  # duplicates and older states, ignored
    dead_letters: int = 0
    evicted: int = 0  # finished pods, GPUs, findings dropped after the retention
    lag: dict[tuple[str, int], int] = field(default_factory=dict)

    def total_lag(self) -> int | None:
        return sum(self.lag.values()) if self.lag else (None if not self.connected else 0)
