"""`periscope up` gives the joiner a heartbeat of two ticks and the API a stale-after of at least three
heartbeats of real time, so a quiet simulated cluster keeps /readyz steady at any speed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from periscope.config import seconds
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
        assert tune.heartbeat_ms == 2 * tick_ms  # event time
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
