"""The one retry policy for calls to the broker (and, by the same rule, to the apiserver).

Exponential back-off with jitter: the first retry comes quickly (a broker restart or a leader move
is usually over in a moment), later ones spread out to the ceiling, and the jitter keeps many
clients (a probe per node) from reconnecting in step. A success resets it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field

INITIAL_S = 0.2
MAX_S = 10.0


@dataclass(slots=True)
class Backoff:
    initial_s: float = INITIAL_S
    max_s: float = MAX_S
    factor: float = 2.0
    jitter: float = 0.2  # each delay is spread by up to this fraction either way
    _next: float = field(default=0.0, init=False)

    def next(self) -> float:
        """The delay before the next attempt (and the one after grows)."""
        delay = self._next or self.initial_s
        self._next = min(delay * self.factor, self.max_s)
        return delay * random.uniform(1 - self.jitter, 1 + self.jitter)

    def reset(self) -> None:
        self._next = 0.0

    async def sleep(self, stop: asyncio.Event | None = None) -> float:
        """Wait the next delay, or until `stop` is set; returns the delay."""
        delay = self.next()
        if stop is None:
            await asyncio.sleep(delay)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
        return delay
