"""Freshness, the readiness notion shared by the probe, the joiner and the API: a service whose data
stopped moving for longer than its `stale_after` is not ready, even though it is alive.

The probe counts from its last publish while it has something waiting (an idle outbox is fresh), the
joiner from the last input record it handled (or its last partition assignment), the API from the last
new attribution its view took.
Monotonic time: a wall-clock step must not make a service stale or fresh.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Freshness:
    def __init__(self, stale_after_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.stale_after_s = stale_after_s
        self.clock = clock
        self.newest_at = clock()  # from the start until the first data moves

    def touch(self) -> None:
        """Data moved just now."""
        self.newest_at = self.clock()

    def age_s(self) -> float:
        return max(0.0, self.clock() - self.newest_at)

    def stale(self) -> bool:
        return self.age_s() > self.stale_after_s
