"""`periscope up` gives the joiner a heartbeat that republishes an unchanged output on every second sample
(whatever the probe's timing jitter) and the API a stale-after of at least three heartbeats of real time,
so a quiet simulated cluster keeps /readyz steady at any speed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from periscope.config import seconds
from periscope.core.changes import ChangeConfig, gpu_due
from periscope.core.model import GpuState
from periscope.sim.cluster.model import ClusterModel
from periscope.sim.scenario import load_scenario
from periscope.sim.up.services import services
from periscope.sim.up.stack import Stack, UpOptions


@pytest.mark.parametrize(("scenario", "speed"), [("demo", 1.0), ("demo", 4.0), ("faults", 1.5)])
def test_heartbeat_and_stale_after_follow_the_tick_and_the_speed(scenario: str, speed: float) -> None:
    stack = Stack(UpOptions(scenario=scenario, speed=speed), ClusterModel(load_scenario(scenario)),
                  lambda _line: None)
    try:
        tick_ms = stack.scenario.tick_ms
        tune = stack._tuning()
        assert published_samples(tune.heartbeat_ms, tick_ms) == [0, 2, 4, 6, 8]  # event time
        wall_heartbeat_s = tune.heartbeat_ms / speed / 1000
        assert seconds(tune.stale_after) >= max(5.0, 3 * wall_heartbeat_s)
        ready = {"nodes": {}, "kubeconfig": str(stack.workdir / "kubeconfig")}
        by_name = {name: settings for name, _, settings in services(stack.opts, stack.scenario, ready,
                                                                     "http://127.0.0.1:1", tune)}
        assert seconds(by_name["joiner"]["heartbeat"]) * 1000 == tune.heartbeat_ms
        assert by_name["api"]["api_stale_after"] == tune.stale_after
        # /v1/idle without parameters judges by the joiner's rule.
        for name in ("idle_window", "idle_threshold"):
            assert by_name["api"][name] == by_name["joiner"][name]
    finally:
        shutil.rmtree(Path(stack.workdir), ignore_errors=True)


def published_samples(heartbeat_ms: int, tick_ms: int) -> list[int]:
    """Which of ten samples of an unchanged GPU the change rule publishes, each stamped up to a quarter of
    a tick off its tick (late, early, alternating: the worst cases of a probe's timing)."""
    jitter = [tick_ms // 4, -(tick_ms // 4), 0, tick_ms // 4, 0, -(tick_ms // 4), tick_ms // 4, 0, 0, 0]
    cfg = ChangeConfig(heartbeat_ms=heartbeat_ms)
    last = GpuState(gpu_uuid="GPU-0", node="n", as_of_ms=0, sample_ms=0)
    out = [0]
    for i in range(1, 10):
        t = i * tick_ms + jitter[i]
        new = GpuState(gpu_uuid="GPU-0", node="n", as_of_ms=t, sample_ms=t)
        if gpu_due(last, new, cfg):
            out.append(i)
            last = new
    return out


def test_a_heartbeat_of_exactly_two_ticks_would_wait_for_a_third_on_a_late_sample() -> None:
    """Why the heartbeat is not two ticks: after a sample stamped late, the second tick reads short."""
    assert published_samples(2000, 1000) != [0, 2, 4, 6, 8]
