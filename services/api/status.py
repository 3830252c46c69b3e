"""What the consumer reports about itself: readiness, counters and lag (read by /readyz and /metrics)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(slots=True)
class ConsumerStatus:
    group_id: str = ""
    # Caught up once every partition was read up to the end offset seen at start; it stays so after that.
    # /readyz also needs the view to be fresh (`serving`).
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
    # Records not believed (services.api.evidence): per reason, those held for evidence, the last why.
    refused: dict[str, int] = field(default_factory=dict)
    held: int = 0
    last_refusal: str = ""
    lag: dict[tuple[str, int], int] = field(default_factory=dict)
    # Freshness: the view is stale once no new joiner output (attribution, GPU state or finding) was
    # applied for longer than `stale_after_s`, counted from the start until the first one (monotonic s).
    stale_after_s: float = 30.0
    started_at: float = field(default_factory=time.monotonic)
    newest_at: float | None = None

    def data_age_s(self, now: float | None = None) -> float:
        """Seconds since the view last took a new joiner output (since the start when it never did)."""
        at = self.newest_at if self.newest_at is not None else self.started_at
        return max(0.0, (time.monotonic() if now is None else now) - at)

    def is_stale(self, now: float | None = None) -> bool:
        """Broker unreachable (the last attempt failed) or no new joiner output for too long."""
        return bool(self.error) or self.data_age_s(now) > self.stale_after_s

    def serving(self, now: float | None = None) -> bool:
        """What /readyz reports: caught up once, and fresh now."""
        return self.ready and not self.is_stale(now)

    def total_lag(self) -> int | None:
        return sum(self.lag.values()) if self.lag else (None if not self.connected else 0)
