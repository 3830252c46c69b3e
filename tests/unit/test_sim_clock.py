"""The shared clock: wall time, or simulated time running `speed` times faster from a common origin."""

from __future__ import annotations

import time

import pytest

from periscope.clock import Clock, ScaledClock, WallClock, clock_from_setting, real_seconds


def test_wall_clock_is_now() -> None:
    before = time.time_ns() // 1_000_000
    now = WallClock().now_ms()
    assert before <= now <= time.time_ns() // 1_000_000
    assert isinstance(WallClock(), Clock)


def test_scaled_clock_runs_faster_from_its_origin(monkeypatch: pytest.MonkeyPatch) -> None:
    wall = [1_000_000_000]
    monkeypatch.setattr(time, "time_ns", lambda: wall[0] * 1_000_000)
    clock = ScaledClock(origin_ms=1_000_000_000, speed=10)
    assert clock.now_ms() == 1_000_000_000  # equal to wall time at the origin
    wall[0] += 1500
    assert clock.now_ms() == 1_000_015_000  # 1.5 s of wall time = 15 s simulated
    assert clock.wall_ms(1_000_015_000) == wall[0]
    assert isinstance(clock, Clock)


def test_two_processes_agree_given_the_same_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time_ns", lambda: 1_700_000_123_456 * 1_000_000)
    a = clock_from_setting("sim:1700000000000:4")
    b = clock_from_setting(ScaledClock(1_700_000_000_000, 4.0).setting())
    assert a.now_ms() == b.now_ms() == 1_700_000_000_000 + 123_456 * 4


def test_settings() -> None:
    assert isinstance(clock_from_setting("wall"), WallClock)
    c = clock_from_setting(" sim:5:0.5 ")
    assert isinstance(c, ScaledClock) and (c.origin_ms, c.speed) == (5, 0.5)
    assert c.setting() == "sim:5:0.5"
    assert real_seconds(c, 1000) == 2.0 and real_seconds(WallClock(), 1500) == 1.5


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("sim", "expected 'wall' or 'sim:<origin_ms>:<speed>'"),
        ("fast", "expected 'wall'"),
        ("sim:x:2", "origin 'x' is not an integer"),
        ("sim:1:fast", "speed 'fast' is not a number"),
        ("sim:1:0", "speed must be a positive number"),
        ("sim:1:-2", "speed must be a positive number"),
        ("sim:1:nan", "speed must be a positive number"),
        ("sim:1:inf", "speed must be a positive number"),
    ],
)
def test_bad_settings_name_the_problem(setting: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        clock_from_setting(setting)
    with pytest.raises(ValueError):
        ScaledClock(0, 0)
