"""The default scenario end to end: MIG, time-slicing, a rollout reusing pod names, an idle notebook,
XIDs and a ClusterPolicy with intended and unintended gaps, scored against the ground truth."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.support import Run, assert_scored, pod_rows, run_scenario

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo(module_tmp: Path) -> Run:
    return run_scenario(module_tmp, "demo", 4, "--idle-window", "20s")


def test_every_owner_right_after_convergence(demo: Run) -> None:
    assert_scored(demo)
    owners = demo.report["periscope"]["owners"]
    assert owners["share"] == 1.0, demo.report["periscope"]["examples"]


def test_shared_and_exclusive_usage_match_truth(demo: Run) -> None:
    p = demo.report["periscope"]
    assert p["shared_util"]["total"] > 30 and p["shared_util"]["share"] == 1.0, p["shared_util"]
    assert p["exclusive_util"]["share"] == 1.0, p["exclusive_util"]
    # the name-join baseline copies the T4's util to all three sharers
    assert demo.report["baseline"]["shared_util"]["share"] < 0.5


def test_reused_name_never_shows_the_old_pods_usage(demo: Run) -> None:
    p, b = demo.report["periscope"], demo.report["baseline"]
    assert p["reused_names"]["total"] > 5 and p["reused_names"]["share"] == 1.0, p["reused_names"]
    assert b["reused_names"]["share"] < 1.0  # the incumbent shows the old pod's 85 % under the new UID
    uids = {r["pod_uid"] for r in demo.final["pods"] if r["pod"] == "api-6d4f8b7c9-7xk2m"}
    assert len(uids) == 2  # both pods are known, each under its own UID
    last = demo.snaps()[-1]
    (active,) = pod_rows(last, "api-6d4f8b7c9-7xk2m")
    assert active["util_pct"] == pytest.approx(12, abs=5)


def test_xid_owners_are_the_owners_at_error_time(demo: Run) -> None:
    assert demo.report["periscope"]["xid_owners"] == {"right": 2, "total": 2, "share": 1.0}
    assert demo.report["baseline"]["xid_owners"]["right"] < 2
    by_code = {x["code"]: x for x in demo.final["xid"]}
    assert {o["pod"] for o in by_code[79]["owners"]} == {"api-6d4f8b7c9-7xk2m"}
    assert {o["pod"] for o in by_code[31]["owners"]} == {
        "infer-a-7d9f8c6b5-m8k2p",
        "infer-b-6c8d7f9b4-q2w4e",
        "infer-c-5b7c6d8f9-z7x5v",
    }


def test_idle_notebook_flagged_busy_pods_not(demo: Run) -> None:
    idle = demo.report["periscope"]["idle"]
    assert idle["precision"] == 1.0 and idle["recall"] >= 0.8, idle
    last = demo.snaps()[-1]
    assert [r["idle"] for r in pod_rows(last, "jupyter-alice")] == [True]
    for busy in ("finetune-5b7d9c4f8-9zq8r", "infer-a-7d9f8c6b5-m8k2p", "api-6d4f8b7c9-7xk2m"):
        assert [r["idle"] for r in pod_rows(last, busy)] == [False], busy
    assert {r["pod"] for r in demo.final["idle"]} >= {"jupyter-alice"}
    assert "finetune-5b7d9c4f8-9zq8r" not in {r["pod"] for r in demo.final["idle"]}


def test_policy_statuses(demo: Run) -> None:
    policy = demo.report["periscope"]["policy"]
    assert policy["share"] == 1.0, policy["mismatches"]
    got = {c["name"]: c["status"] for c in demo.final["policy"]["components"]}
    assert got["dcgmExporter"] == "disabled-as-intended"
    assert got["devicePlugin"] == "degraded"
    assert got["driver"] == "ok"
    assert demo.final["policy"]["cluster_policy"] == {"name": "cluster-policy", "state": "notReady"}


def test_mig_rows_name_the_instance_with_dcgm_util_and_memory(demo: Run) -> None:
    last = demo.snaps()[-1]
    (row,) = pod_rows(last, "train-llm-0")
    assert row["sharing"] == "mig" and row["mig"]["profile"] == "3g.40gb"
    assert row["fb_used_mib"] == pytest.approx(36000, rel=0.01)
    # NVML has no util on a MIG slice: it is the instance's graphics-engine activity from DCGM
    assert row["util_pct"] == pytest.approx(92, abs=2) and "dcgm" in row["sources"]
    assert row["sm_active_pct"] is not None and row["tensor_active_pct"] is not None


def test_mig_util_within_two_points_of_the_simulated_activity(demo: Run) -> None:
    mig = demo.report["periscope"]["mig_util"]
    assert mig["total"] > 30 and mig["share"] == 1.0, (mig, demo.report["periscope"]["examples"])
    assert mig["max_error"] <= 2.0, mig


def test_idle_mig_holder_in_v1_idle(demo: Run) -> None:
    idle = {r["pod"]: r for r in demo.final["idle"]}
    assert "eval-6f7c9d8b5-k2x9q" in idle, sorted(idle)  # stops working at 60s, on a 1g.10gb slice
    assert idle["eval-6f7c9d8b5-k2x9q"]["mig"]["profile"] == "1g.10gb"
    assert "train-llm-0" not in idle and "eval-6f7c9d8b5-p4m2z" not in idle
