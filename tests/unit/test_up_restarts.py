"""`periscope up` keeps a crashing child running as a supervisor would: a crash budget per time window
(five in ten minutes by default) with back-off, never a count over the child's whole lifetime.

The budget is tested with a fake clock; the stack's supervision with real child processes that crash.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from periscope.sim.cluster.model import ClusterModel
from periscope.sim.scenario import parse_scenario
from periscope.sim.up.child import Child
from periscope.sim.up.restarts import CrashBudget, CrashPolicy
from periscope.sim.up.stack import Stack, UpError, UpOptions


def test_five_crashes_in_ten_minutes_are_restarted_the_sixth_is_not() -> None:
    budget = CrashBudget()
    delays = [budget.crashed(t) for t in (0.0, 10.0, 20.0, 30.0, 40.0)]
    assert delays == [0.0, 1.0, 2.0, 4.0, 8.0]  # the first at once, then doubling
    assert budget.crashed(50.0) is None


def test_crashes_spread_over_a_long_run_never_spend_the_budget() -> None:
    budget = CrashBudget()
    for hour in range(48):  # one crash an hour for two days: a lifetime count would give up at the sixth
        assert budget.crashed(hour * 3600.0) == 0.0


def test_the_window_slides_and_back_off_is_capped() -> None:
    budget = CrashBudget(CrashPolicy(crashes=10, window_s=100.0, first_backoff_s=1.0, max_backoff_s=5.0))
    assert [budget.crashed(float(t)) for t in range(8)] == [0.0, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0, 5.0]
    assert budget.crashed(150.0) == 0.0  # all earlier crashes left the window: a fresh start
    tight = CrashBudget(CrashPolicy(crashes=2, window_s=10.0))
    assert tight.crashed(0.0) == 0.0 and tight.crashed(5.0) == 1.0
    assert tight.crashed(10.5) == 1.0  # the crash at 0 has left the window
    assert tight.crashed(11.0) is None


SCENARIO = "duration: {d}\nnodes:\n  - name: n\n    gpus: [{{model: T4, memory_mib: 15360}}]\n"


def _stack(tmp_path: Path, duration: str, policy: CrashPolicy,
           crash_after_s: float) -> tuple[Stack, list[str]]:
    """A stack supervising one child that crashes `crash_after_s` after each start (nothing else runs)."""
    lines: list[str] = []
    model = ClusterModel(parse_scenario(SCENARIO.format(d=duration), "t.yaml"))
    stack = Stack(UpOptions(exit_at_end=True, crash_policy=policy), model, lines.append)
    code = f"import time; time.sleep({crash_after_s}); raise SystemExit(3)"
    child = Child("flaky", [sys.executable, "-c", code], {}, tmp_path / "flaky", lines.append)
    stack.children["flaky"] = child
    child.start()
    stack.start_ms = stack.clock.now_ms()
    return stack, lines


def test_up_restarts_a_child_that_crashes_now_and_then_for_as_long_as_it_runs(tmp_path: Path) -> None:
    # At most two crashes fit in any one-second window when each run lasts 0.7 s: the budget holds,
    # though the child crashes many more times than two over the run.
    stack, lines = _stack(tmp_path, "6s", CrashPolicy(crashes=2, window_s=1.0, first_backoff_s=0.05),
                          crash_after_s=0.7)
    try:
        stack.supervise()
    finally:
        stack.stop()
    restarts = [line for line in lines if line.startswith("[up] flaky exited with status 3; restarting it")]
    assert len(restarts) >= 6, lines
    assert stack.crashed.count("flaky") == len(restarts)


def test_up_gives_up_on_a_crash_loop_after_backing_off(tmp_path: Path) -> None:
    stack, lines = _stack(tmp_path, "60s", CrashPolicy(crashes=3, window_s=60.0, first_backoff_s=0.3),
                          crash_after_s=0.0)
    started = time.monotonic()
    try:
        with pytest.raises(UpError, match=r"flaky exited with status 3 and cannot be kept running "
                                          r"\(more than 3 crashes in 60s\)"):
            stack.supervise()
    finally:
        stack.stop()
    assert time.monotonic() - started >= 0.3 + 0.6  # it waited out the back-off: 0.3 s, then 0.6 s
    assert "[up] flaky exited with status 3; restarting it" in lines  # the first: at once
    assert "[up] flaky exited with status 3; restarting it in 0.3s (crash 2 of 3 crashes in 60s)" in lines
    assert "[up] flaky exited with status 3; restarting it in 0.6s (crash 3 of 3 crashes in 60s)" in lines
