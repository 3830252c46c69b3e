"""The accuracy report, fed with API snapshots built from the truth itself (a perfect API) and with
deliberately wrong ones, so every score is shown to move for the right reason."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from periscope.sim.cluster.model import ClusterModel
from periscope.sim.cluster.truth import TruthWriter, rfc3339
from periscope.sim.report.score import ReportOptions, Truth, build_report, gpu_views
from periscope.sim.report.text import format_report, read_jsonl
from periscope.sim.scenario import load_scenario

START = 1_700_000_000_000


def write_truth(tmp: Path, scenario: str, window_ms: int = 20_000, mig_observable: bool = False) -> Truth:
    model = ClusterModel(load_scenario(scenario))
    path = tmp / f"{scenario}-{mig_observable}.jsonl"
    w = TruthWriter(path, model, START, 1.0, window_ms, 5.0, mig_observable=mig_observable)
    w.write_tick(len(model.tick_times()) - 1)
    w.close()
    return Truth(read_jsonl(path))


def perfect(truth: Truth, lag_ticks: int = 0) -> list[dict[str, Any]]:
    """What an always-right API would have answered at each tick, its data `lag_ticks` old."""
    snaps: list[dict[str, Any]] = []
    for k in sorted(truth.ticks):
        src = max(0, k - lag_ticks)
        as_of = rfc3339(truth.start_ms + src * truth.tick_ms)
        rows = list(truth.ticks[src].values())
        pods = [
            {
                "pod_uid": r["pod_uid"],
                "namespace": r["namespace"],
                "pod": r["pod"],
                "device_id": r["device_id"],
                "util_pct": r["util_pct"] if r["util_observable"] else None,
                "idle": bool(r["idle"]),
                "active": True,
                "sample_at": as_of,
            }
            for r in rows
            if r["pod_uid"]
        ]
        gpus: dict[str, dict[str, Any]] = {}
        for r in rows:
            g = gpus.setdefault(
                r["gpu_uuid"],
                {
                    "node": r["node"],
                    "gpu_uuid": r["gpu_uuid"],
                    "sample_at": as_of,
                    "owners": [],
                    "mig_devices": [],
                },
            )
            if r["pod_uid"] is None:
                continue
            owner = {"pod_uid": r["pod_uid"], "device_id": r["device_id"]}
            if r["mig"]:
                g["mig_devices"].append({"uuid": r["mig"]["uuid"], "owners": [owner]})
            else:
                g["owners"].append(owner)
        snaps.append(
            {
                "kind": "snapshot",
                "at_ms": truth.start_ms + k * truth.tick_ms,
                "pods": pods,
                "gpus": list(gpus.values()),
            }
        )
    snaps.append(
        {
            "kind": "final",
            "at_ms": snaps[-1]["at_ms"],
            "xid": [
                {"gpu_uuid": x["gpu_uuid"], "code": x["code"], "at": x["at"], "owners": x["owners"]}
                for x in truth.xids
            ],
            "policy": {
                "components": [
                    {"name": k, "status": v}
                    for k, v in ((truth.meta.get("policy") or {}).get("components") or {}).items()
                ]
            },
        }
    )
    return snaps


def set_owner(snaps: list[dict[str, Any]], pod: str, uid: str, util: float, ticks: range) -> None:
    """Make the API show `uid` (and `util`) for every row and GPU owner of `pod` in the given snapshots."""
    for s in (snaps[i] for i in ticks):
        for row in s["pods"]:
            if row["pod"] == pod:
                old = row["pod_uid"]
                row["pod_uid"], row["util_pct"] = uid, util
                for g in s["gpus"]:
                    for o in [*g["owners"], *(o for m in g["mig_devices"] for o in m["owners"])]:
                        if o["pod_uid"] == old:
                            o["pod_uid"] = uid


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Truth:
    return write_truth(tmp_path_factory.mktemp("report"), "demo")


def test_a_perfect_api_scores_full_marks(demo: Truth) -> None:
    r = build_report(demo, perfect(demo))
    p = r["periscope"]
    for key in ("owners", "shared_util", "exclusive_util", "reused_names", "xid_owners", "policy"):
        assert p[key]["share"] == 1.0, (key, p[key])
    assert p["idle"]["precision"] == 1.0 and p["idle"]["recall"] == 1.0
    assert r["snapshots"] == 120 and r["lag_ticks"] == {"mean": 0.0, "max": 0.0}


def test_lagging_but_right_data_is_judged_as_of_its_time(demo: Truth) -> None:
    r = build_report(demo, perfect(demo, lag_ticks=3))
    assert r["periscope"]["owners"]["share"] == 1.0
    assert r["lag_ticks"]["max"] == 3.0


def test_the_name_join_baseline_goes_wrong_where_expected(demo: Truth) -> None:
    b = build_report(demo, perfect(demo))["baseline"]
    assert b["shared_util"]["share"] == 0.0  # the T4's util copied to all three sharers
    assert b["reused_names"]["share"] < 0.7  # the old api pod's 85 % shown under the new UID
    assert b["xid_owners"] == {"right": 1, "total": 2, "share": 0.5}  # XID 79 resolved after the rollout
    assert b["owners"]["share"] < 1.0
    no_lag = build_report(demo, perfect(demo), ReportOptions(baseline_lag_ms=0))["baseline"]
    assert no_lag["owners"]["share"] == 1.0  # with fresh data, name-joining owners is right ...
    assert no_lag["shared_util"]["share"] == 0.0  # ... but sharing still is not


def test_a_stale_uid_after_name_reuse_is_caught(demo: Truth) -> None:
    snaps = perfect(demo)
    old = next(r["pod_uid"] for r in demo.ticks[0].values() if r["pod"] == "api-6d4f8b7c9-7xk2m")
    set_owner(snaps, "api-6d4f8b7c9-7xk2m", old, 85.0, range(60, 80))  # the old pod, its old usage
    p = build_report(demo, snaps)["periscope"]
    assert p["owners"]["right"] == p["owners"]["total"] - 20
    assert (
        p["examples"][0].startswith("tick 60 gpu-c GPU-")
        and "truth serve/api-6d4f8b7c9-7xk2m" in p["examples"][0]
    )
    assert p["reused_names"]["total"] > 0 and p["reused_names"]["share"] == 1.0  # only rows of the right pod


def test_wrong_usage_of_a_reused_name_is_caught(demo: Truth) -> None:
    snaps = perfect(demo)
    for s in snaps[60:80]:
        for row in s["pods"]:
            if row["pod"] == "api-6d4f8b7c9-7xk2m":
                row["util_pct"] = 85.0  # right UID, the old pod's usage
    p = build_report(demo, snaps)["periscope"]
    assert p["owners"]["share"] == 1.0
    assert p["reused_names"]["right"] == p["reused_names"]["total"] - 20


def write_late_truth(tmp: Path, late_ms: dict[int, int]) -> Truth:
    """The demo's truth as a simulator writes it that put tick k's state in place `late_ms[k]` late."""
    model = ClusterModel(load_scenario("demo"))
    path = tmp / "demo-late.jsonl"
    w = TruthWriter(path, model, START, 1.0, 20_000, 5.0)
    tick = model.scenario.tick_ms
    for k in range(len(model.tick_times())):
        w.write_tick(k, START + k * tick + late_ms.get(k, 0))
    w.close()
    return Truth(read_jsonl(path))


def test_answers_from_a_simulator_behind_the_clock_are_checked_against_what_it_showed(
        demo: Truth, tmp_path: Path) -> None:
    # The simulator stalls over the api pod's replacement at 50 s and puts ticks 50-53 in place in one
    # burst at 53.5 s: samples stamped 50-53 s see the old pod on the hardware, its UID and its 85 %.
    late = write_late_truth(tmp_path, {50: 3500, 51: 2500, 52: 1500, 53: 500})
    snaps = perfect(demo)
    old = next(r["pod_uid"] for r in demo.ticks[0].values() if r["pod"] == "api-6d4f8b7c9-7xk2m")
    set_owner(snaps, "api-6d4f8b7c9-7xk2m", old, 85.0, range(50, 54))
    on_time = build_report(demo, snaps)
    assert on_time["periscope"]["owners"]["right"] == on_time["periscope"]["owners"]["total"] - 2  # 52, 53
    assert on_time["simulator_behind"] == {"ticks": 0, "max_ms": 0, "unscored": 0}
    r = build_report(late, snaps)
    p = r["periscope"]
    assert p["owners"]["share"] == 1.0 and p["reused_names"]["share"] == 1.0, p["examples"]
    assert p["owners"]["total"] == on_time["periscope"]["owners"]["total"] - 2
    # Not scored: the api pod's GPU at 52 and 53 s, and the row of the pod whose util steps up at 50 s.
    assert r["simulator_behind"] == {"ticks": 3, "max_ms": 3500, "unscored": 4}
    assert "not scored: 4 answers sampled before the simulator had their tick in place" in format_report(r)
    # Where nothing changed, a late tick is still checked: the wrong owner there is caught.
    set_owner(snaps, "api-6d4f8b7c9-7xk2m", old, 85.0, range(54, 56))
    assert build_report(late, snaps)["periscope"]["owners"]["right"] == p["owners"]["total"] - 2


def test_an_xid_the_simulator_wrote_late_is_matched_from_when_it_showed(demo: Truth, tmp_path: Path) -> None:
    snaps = perfect(demo)
    x = snaps[-1]["xid"][1]  # code 31 at 70 s, stamped by the probe when the hardware showed it
    x["at"] = rfc3339(demo.start_ms + 76_200)
    assert build_report(demo, snaps)["periscope"]["xid_owners"]["right"] == 1
    late = write_late_truth(tmp_path, {70: 6000})
    assert build_report(late, snaps)["periscope"]["xid_owners"]["right"] == 2
    x["at"] = rfc3339(demo.start_ms + 79_200)  # later than the hardware showed it, by more than allowed
    assert build_report(late, snaps)["periscope"]["xid_owners"]["right"] == 1


def test_gpu_views_read_owners_of_whole_gpus_and_mig_slices(demo: Truth) -> None:
    views = gpu_views(perfect(demo)[0], demo)
    assert len(views) == len(demo.devices)
    mig = [v for v in views if v[0].startswith("MIG-")]
    assert len(mig) == 4 and sum(1 for v in mig if v[2]) == 2  # two slices held at time 0


def test_usage_errors_are_measured(demo: Truth) -> None:
    snaps = perfect(demo)
    for s in snaps[:-1]:
        for row in s["pods"]:
            if row["pod"].startswith("infer-a"):
                row["util_pct"] += 6  # outside the 5-point tolerance
    p = build_report(demo, snaps)["periscope"]
    assert 0.5 < p["shared_util"]["share"] < 0.7 and p["shared_util"]["max_error"] == 6.0  # 1 of 3 sharers
    assert p["exclusive_util"]["share"] == 1.0


def test_idle_flags_and_xid_and_policy_mistakes(demo: Truth) -> None:
    snaps = perfect(demo)
    for s in snaps[:-1]:
        for row in s["pods"]:
            if row["pod"].startswith("finetune"):
                row["idle"] = True  # a busy pod flagged idle
    final = snaps[-1]
    final["xid"][0]["owners"] = []
    final["policy"]["components"][0]["status"] = "missing"
    p = build_report(demo, snaps)["periscope"]
    assert p["idle"]["precision"] < 1.0 and p["idle"]["recall"] == 1.0
    assert p["xid_owners"]["right"] == 1
    assert p["policy"]["share"] < 1.0 and p["policy"]["mismatches"][0]["got"] == "missing"
    text = format_report(build_report(demo, snaps))
    assert "policy driver: expected ok, API says missing" in text


def test_fault_recovery_is_counted_from_the_fault_end(tmp_path: Path) -> None:
    truth = write_truth(tmp_path, "faults")
    snaps = perfect(truth, lag_ticks=1)
    assert all(
        f["ok"] and f["recovered_ticks"] <= 2 for f in build_report(truth, snaps)["periscope"]["faults"]
    )
    joiner = next(f for f in truth.faults if f["fault"] == "joiner-restart")
    stuck = copy.deepcopy(snaps)
    for s in stuck[:-1]:  # the API shows nothing newer than the fault for 7 ticks
        if joiner["end_ms"] <= s["at_ms"] < joiner["end_ms"] + 7 * truth.tick_ms:
            for g in s["gpus"]:
                g["sample_at"] = rfc3339(joiner["end_ms"] - truth.tick_ms)
    faults = {f["fault"]: f for f in build_report(truth, stuck)["periscope"]["faults"]}
    assert faults["joiner-restart"]["ok"] is False and faults["joiner-restart"]["recovered_ticks"] == 7
    assert faults["probe-restart"]["ok"]


def test_truth_file_needs_a_meta_line() -> None:
    with pytest.raises(ValueError, match="no meta line"):
        Truth([{"kind": "xid"}])
    with pytest.raises(ValueError, match="line 2: holder without a valid 'tick'"):
        Truth([{"kind": "meta"}, {"kind": "holder"}])


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "periscope.cli.main", "report", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_report_command(demo: Truth, tmp_path: Path) -> None:
    truth = tmp_path / "t.jsonl"
    truth.write_text(
        "\n".join(
            json.dumps(r)
            for r in [demo.meta, *demo.xids, *(r for k in sorted(demo.ticks) for r in demo.ticks[k].values())]
        )
        + "\n"
    )
    (tmp_path / "t.api.jsonl").write_text("\n".join(json.dumps(s) for s in perfect(demo)) + "\n")
    text = _cli("--truth", str(truth))
    assert text.returncode == 0, text.stderr
    assert "owner right (tick x device)       100.0%" in text.stdout
    doc = json.loads(_cli("--truth", str(truth), "--json", "--baseline-lag", "0").stdout)
    assert doc["baseline_lag_ms"] == 0 and doc["periscope"]["owners"]["share"] == 1.0
    bad = _cli("--truth", str(tmp_path / "t.api.jsonl"))
    assert (
        bad.returncode == 2
        and bad.stderr.startswith("periscope: truth file ")
        and "no meta line" in bad.stderr
    )
    lag = _cli("--truth", str(truth), "--baseline-lag", "later")
    assert (
        lag.returncode == 2
        and lag.stderr == "periscope: --baseline-lag later: not a duration: 'later' (use e.g. 90s, 10m, 2h)\n"
    )


def test_mig_util_scored_when_the_run_serves_dcgm(tmp_path: Path, demo: Truth) -> None:
    assert build_report(demo, perfect(demo))["periscope"]["mig_util"]["total"] == 0  # not observable
    truth = write_truth(tmp_path, "demo", mig_observable=True)
    snaps = perfect(truth)
    p = build_report(truth, snaps)["periscope"]
    assert p["mig_util"]["total"] > 100 and p["mig_util"]["share"] == 1.0, p["mig_util"]
    assert p["exclusive_util"] == build_report(demo, perfect(demo))["periscope"]["exclusive_util"]
    for s in snaps:
        for row in s.get("pods") or []:
            if row["pod"] == "train-llm-0":
                row["util_pct"] = None  # what the API said before DCGM: no util on MIG
    wrong = build_report(truth, snaps)["periscope"]["mig_util"]
    assert 0.5 < wrong["share"] < 1.0, wrong
    assert "MIG-slice util" in format_report(build_report(truth, snaps))
