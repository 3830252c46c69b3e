"""Where services read "now": the wall clock, or a simulated clock that runs faster than it.

`periscope up --speed N` runs the whole simulated cluster N times faster than real time. Every process
it starts must stamp events with the same simulated time, so each one gets the setting
`sim:<origin_ms>:<speed>` and builds a `ScaledClock` from it: simulated time is
`origin + (wall - origin) * speed`, which needs no coordination beyond the shared origin.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    def now_ms(self) -> int:
        """Current (event) time in Unix milliseconds."""
        ...


class WallClock:
    """Real time. `speed` is 1 so callers can scale sleeps the same way for both clocks."""

    speed: float = 1.0

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def event_ms(self, wall_ms: float) -> int:
        """This clock's time at the wall time `wall_ms` (a record's broker timestamp, say)."""
        return int(wall_ms)

    def __repr__(self) -> str:
        return "WallClock()"


class ScaledClock:
    """Simulated time that starts equal to wall time at `origin_ms` and runs `speed` times faster."""

    def __init__(self, origin_ms: int, speed: float) -> None:
        if not speed > 0:
            raise ValueError(f"clock speed must be > 0, got {speed}")
        self.origin_ms = int(origin_ms)
        self.speed = float(speed)

    def now_ms(self) -> int:
        wall = time.time_ns() // 1_000_000
        return self.origin_ms + int((wall - self.origin_ms) * self.speed)

    def event_ms(self, wall_ms: float) -> int:
        """This clock's time at the wall time `wall_ms` (a record's broker timestamp, say)."""
        return self.origin_ms + int((wall_ms - self.origin_ms) * self.speed)

    def wall_ms(self, sim_ms: int) -> float:
        """The wall time (Unix ms) at which this clock shows `sim_ms`."""
        return self.origin_ms + (sim_ms - self.origin_ms) / self.speed

    def setting(self) -> str:
        return f"sim:{self.origin_ms}:{self.speed:g}"

    def __repr__(self) -> str:
        return f"ScaledClock(origin_ms={self.origin_ms}, speed={self.speed:g})"


def clock_from_setting(setting: str) -> WallClock | ScaledClock:
    """Build a clock from `"wall"` or `"sim:<origin_ms>:<speed>"`; ValueError names the bad part."""
    text = setting.strip()
    if text == "wall":
        return WallClock()
    parts = text.split(":")
    if len(parts) != 3 or parts[0] != "sim":
        raise ValueError(f"clock setting {setting!r}: expected 'wall' or 'sim:<origin_ms>:<speed>'")
    try:
        origin = int(parts[1])
    except ValueError:
        raise ValueError(f"clock setting {setting!r}: origin {parts[1]!r} is not an integer") from None
    try:
        speed = float(parts[2])
    except ValueError:
        raise ValueError(f"clock setting {setting!r}: speed {parts[2]!r} is not a number") from None
    if not speed > 0 or speed != speed or speed == float("inf"):
        raise ValueError(f"clock setting {setting!r}: speed must be a positive number")
    return ScaledClock(origin, speed)


def real_seconds(clock: WallClock | ScaledClock, sim_ms: float) -> float:
    """Seconds of real time that `sim_ms` of this clock's time take (for timers and sleeps)."""
    return max(0.0, sim_ms / 1000.0 / clock.speed)
