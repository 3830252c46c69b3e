"""When `periscope up` restarts a crashed child, and when it gives up: a crash budget per time window.

As a supervisor does it (systemd's StartLimitBurst/StartLimitIntervalSec, Kubernetes' CrashLoopBackOff):
a child may crash `crashes` times within any `window_s`; one more within the window means it cannot be
kept running. A child that crashes now and then over a long run is restarted every time. Restarts back
off: the first crash in a window restarts at once, each further one waits twice as long as the one
before, up to `max_backoff_s`. Pure: the caller passes the (monotonic) time.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class CrashPolicy:
    crashes: int = 5  # within the window, restarted; one more, given up
    window_s: float = 600.0
    first_backoff_s: float = 1.0  # the wait before the second restart within a window
    max_backoff_s: float = 30.0

    def describe(self) -> str:
        return f"{self.crashes} crashes in {self.window_s:g}s"


@dataclass(slots=True)
class CrashBudget:
    """One child's crashes within the policy's window."""

    policy: CrashPolicy = field(default_factory=CrashPolicy)
    recent: deque[float] = field(default_factory=deque)

    def crashed(self, now: float) -> float | None:
        """Record a crash at `now`: the seconds to wait before restarting, or None when the budget is
        spent (more than `crashes` crashes within the window)."""
        while self.recent and self.recent[0] <= now - self.policy.window_s:
            self.recent.popleft()
        self.recent.append(now)
        n = len(self.recent)
        if n > self.policy.crashes:
            return None
        if n == 1:
            return 0.0
        return min(self.policy.max_backoff_s, self.policy.first_backoff_s * 2 ** (n - 2))
