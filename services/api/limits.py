"""Rate limits of the access gate: token buckets per key (a user, a client address).

A bucket holds up to `burst` tokens and refills `burst` of them every `per_s` seconds; taking from an
empty one is refused with the seconds until a token is back. The map of buckets is bounded (least
recently used first out): a forgotten bucket starts full again, so the bound only matters to a caller
with more keys than `max_keys`.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable


class Throttled(Exception):
    """Over a limit; `retry_after_s` (whole seconds, at least 1) until it is likely to pass."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = max(1, math.ceil(retry_after_s))


class Buckets:
    def __init__(self, burst: int, per_s: float, *, max_keys: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.burst, self.rate, self.max_keys, self.clock = burst, burst / per_s, max_keys, clock
        self._b: OrderedDict[Hashable, tuple[float, float]] = OrderedDict()  # key -> (tokens, at)

    def _level(self, key: Hashable) -> float:
        tokens, at = self._b.get(key, (float(self.burst), self.clock()))
        return min(float(self.burst), tokens + (self.clock() - at) * self.rate)

    def wait_s(self, key: Hashable) -> float:
        """Seconds until `key` has a token (0: it has one now)."""
        return max(0.0, (1.0 - self._level(key)) / self.rate)

    def give(self, key: Hashable) -> None:
        """Return a token taken ahead of an outcome that turned out not to count."""
        if key in self._b:
            self._b[key] = (min(float(self.burst), self._level(key) + 1.0), self.clock())

    def take(self, key: Hashable) -> bool:
        """Take a token for `key`; False (nothing taken) when it has none."""
        level = self._level(key)
        if level < 1.0:
            return False
        self._b[key] = (level - 1.0, self.clock())
        self._b.move_to_end(key)
        while len(self._b) > self.max_keys:
            self._b.popitem(last=False)
        return True
