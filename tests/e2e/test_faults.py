"""Faults end to end: kubelet restart, torn checkpoint, probe/joiner/watcher restarts, each while pods
change; attribution stays right and every fault is recovered from within 5 ticks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.support import Run, assert_scored, run_scenario

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def faults(module_tmp: Path) -> Run:
    return run_scenario(module_tmp, "faults", 1.5)


def test_every_fault_really_happened(faults: Run) -> None:
    out = faults.output
    assert "kubelet on fault-a restarts" in out and "checkpoint on fault-a corrupt" in out
    for name in ("probe/fault-b", "joiner", "watcher"):
        m = re.search(rf"restarted {re.escape(name)} \(pid (\d+) -> (\d+)\)", out)
        assert m is not None, name
        assert m.group(1) != m.group(2)
    assert [f["fault"] for f in faults.truth.faults] == [
        "kubelet-restart",
        "checkpoint-corrupt",
        "probe-restart",
        "joiner-restart",
        "watcher-restart",
    ]


def test_recovered_within_five_ticks(faults: Run) -> None:
    recovered = faults.report["periscope"]["faults"]
    assert len(recovered) == 5
    late = {f"{f['fault']}@{f['node']}": f["recovered_ticks"] for f in recovered if not f["ok"]}
    assert not late, f"recovered after more than 5 ticks (None: never): {late}"


def test_attribution_right_through_the_faults(faults: Run) -> None:
    assert_scored(faults)
    p = faults.report["periscope"]
    assert p["owners"]["share"] == 1.0, p["examples"]
    assert p["shared_util"]["share"] == 1.0 and p["exclusive_util"]["share"] == 1.0
    assert p["reused_names"]["share"] == 1.0  # infer-b recreated while its probe restarted
    assert p["xid_owners"]["share"] == 1.0
    assert p["policy"]["share"] == 1.0


def test_pods_started_during_faults_are_attributed(faults: Run) -> None:
    seen = {r["pod"] for s in faults.snaps() for r in s["pods"]}
    # batch-2 starts with the kubelet socket gone, batch-3 with the checkpoint torn, batch-4 while the
    # joiner restarts, batch-5 while the watcher restarts
    assert {"batch-2-r5t7y", "batch-3-u1i3o", "batch-4-p6a8s", "batch-5-k3d9f"} <= seen
