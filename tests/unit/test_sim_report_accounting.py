"""The truth's GPU-hours (what each holder really held and used) and the report's accounting section."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from periscope.contract.values import rfc3339
from periscope.sim.cli import report
from periscope.sim.cluster.model import ClusterModel
from periscope.sim.cluster.truth import Truth, TruthWriter, read_truth
from periscope.sim.report.accounting import compare, format_accounting, truth_hours
from periscope.sim.scenario import load_scenario

START = 1_700_000_000_000
S = 1000


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Truth:
    model = ClusterModel(load_scenario("demo"))
    path = tmp_path_factory.mktemp("truth") / "t.jsonl"
    w = TruthWriter(path, model, START, speed=1.0, idle_window_ms=20_000, idle_threshold=5.0)
    w.write_tick(119)
    w.close()
    return Truth(read_truth(path))


def test_the_shares_of_one_gpu_never_exceed_it_and_whole_gpus_are_one(demo: Truth) -> None:
    for k in (0, 30, 60, 90):
        per_gpu: dict[str, float] = {}
        for r in demo.ticks[k].values():
            assert 0 <= r["used_share"] <= r["alloc_share"] + 1e-9
            if r["pod_uid"] is None:
                assert r["alloc_share"] == 0
                continue
            per_gpu[r["gpu_uuid"]] = per_gpu.get(r["gpu_uuid"], 0.0) + r["alloc_share"]
            if r["sharing"] == "exclusive":
                assert r["alloc_share"] == 1.0
            if r["mig"] is not None:
                assert r["alloc_share"] == pytest.approx(int(r["mig"]["profile"][0]) / 7)
        assert all(v <= 1 + 1e-6 for v in per_gpu.values()), per_gpu


def test_time_sliced_holders_hold_their_use_plus_an_equal_part_of_the_rest(demo: Truth) -> None:
    t4 = [r for r in demo.ticks[30].values() if r["sharing"] == "time-slicing" and r["pod_uid"]]
    assert len(t4) >= 2
    total = sum(r["util_pct"] for r in t4) / 100
    for r in t4:
        want = r["util_pct"] / 100 + (1 - total) / 4 if total < 1 else r["util_pct"] / 100 / total
        assert r["alloc_share"] == pytest.approx(want, abs=1e-6)


def _truth(rows: list[dict[str, Any]], window_ms: int = 3 * S, prestart_ms: int = 0) -> Truth:
    meta = {"kind": "meta", "tick_ms": S, "start_ms": START, "idle_window_ms": window_ms,
            "idle_threshold_pct": 5.0, "prestart_ms": prestart_ms}
    return Truth([meta, *rows])


def _held(k: int, util: float, ns: str = "ml", uid: str = "u1", dev: str = "GPU-0") -> dict[str, Any]:
    return {"kind": "holder", "tick": k, "at_ms": START + k * S, "node": "n", "device_id": dev,
            "gpu_uuid": dev, "pod_uid": uid, "namespace": ns, "pod": "p", "util_pct": util,
            "util_observable": True, "alloc_share": 1.0, "used_share": util / 100, "sharing": "exclusive"}


def test_idle_is_a_confirmed_run_from_its_first_tick_and_a_short_dip_is_not() -> None:
    utils = [80, 1, 1, 1, 1, 1, 80, 2, 2, 80]  # a 5-tick run (idle window 3 ticks) and a 2-tick dip
    t = _truth([_held(k, u) for k, u in enumerate(utils)])
    h = truth_hours(t, START, START + 10 * S)["ml"]
    assert h.allocated == pytest.approx(10 / 3600) and h.idle == pytest.approx(5 / 3600)
    assert h.used == pytest.approx(sum(utils) / 100 / 3600) and h.request == pytest.approx(10 / 3600)
    # Only the ticks inside the period count.
    assert truth_hours(t, START + 3 * S, START + 5 * S)["ml"].idle == pytest.approx(2 / 3600)


def test_a_run_from_before_the_start_counts_the_wait_once_confirmed() -> None:
    t = _truth([_held(k, 0.0) for k in range(6)], prestart_ms=4 * S)
    assert truth_hours(t, START, START + 6 * S)["ml"].idle == pytest.approx(10 / 3600)


def usage(groups: dict[str, dict[str, float]]) -> dict[str, Any]:
    return {"from": rfc3339(START), "to": rfc3339(START + 10 * S), "by": "namespace",
            "groups": [{"key": ns, **{f"{k}_gpu_hours": v for k, v in g.items()}}
                       for ns, g in groups.items()]}


def test_compare_is_within_tolerance_of_the_namespaces_true_allocation() -> None:
    rows = [_held(k, 50.0) for k in range(10)] + [_held(k, 1.0, "nb", "u2", "GPU-1") for k in range(10)]
    t = _truth(rows)
    h = 1 / 3600
    right = {"ml": {"allocated": 10 * h, "used": 5 * h, "idle": 0.0, "unmeasured": 0.0},
             "nb": {"allocated": 10 * h, "used": 0.1 * h, "idle": 10 * h * 0.995, "unmeasured": 0.0}}
    a = compare(t, usage(right))
    assert a["ok"] and [n["namespace"] for n in a["namespaces"]] == ["ml", "nb"]
    nb = a["namespaces"][1]
    assert nb["error_pct"]["idle"] == pytest.approx(0.5)
    assert nb["baseline"]["allocated"] == pytest.approx(10 * h, abs=1e-6)
    off = compare(t, usage({**right, "ml": {**right["ml"], "allocated": 10.2 * h}}))
    assert not off["ok"] and off["namespaces"][0]["error_pct"]["allocated"] == pytest.approx(2.0)
    missing = compare(t, usage({"ml": right["ml"]}))  # a namespace Periscope did not report is off
    assert not missing["ok"] and missing["namespaces"][1]["error_pct"]["allocated"] == pytest.approx(100.0)
    text = "\n".join(format_accounting(off))
    assert "request x hours" in text and "<-- off" in text
    with pytest.raises(ValueError, match="not grouped by namespace"):
        compare(t, {**usage(right), "by": "pod"})


def test_the_report_reads_the_usage_file_beside_the_truth(tmp_path: Path) -> None:
    truth = tmp_path / "t.jsonl"
    model = ClusterModel(load_scenario("demo"))
    w = TruthWriter(truth, model, START, speed=1.0, idle_window_ms=20_000, idle_threshold=5.0)
    w.write_tick(9)
    w.close()
    (tmp_path / "t.api.jsonl").write_text("")
    doc = {"from": rfc3339(START), "to": rfc3339(START + 5 * S), "by": "namespace", "groups": []}
    (tmp_path / "t.usage.json").write_text(json.dumps(doc))
    got = CliRunner().invoke(report, ["--truth", str(truth), "--json"])
    assert got.exit_code == 0, got.output
    assert '"accounting"' in got.output and '"ok": false' in got.output  # nothing reported: all off
    (tmp_path / "t.usage.json").write_text("[]")
    bad = CliRunner().invoke(report, ["--truth", str(truth)])
    assert bad.exit_code != 0 and "usage file" in bad.output


def test_a_tick_cut_by_the_period_counts_for_its_part_inside() -> None:
    # The period starts 0.3 s into tick 2 and ends 0.6 s into tick 7 (windows out of step with the
    # ticks): Periscope charges the time inside it, so the truth counts 0.7 + 4 + 0.6 ticks.
    t = _truth([_held(k, 1.0) for k in range(10)])
    h = truth_hours(t, START + 2300, START + 7600)["ml"]
    assert h.allocated == pytest.approx(5.3 / 3600) and h.request == pytest.approx(5.3 / 3600)
    assert h.idle == pytest.approx(5.3 / 3600) and h.used == pytest.approx(0.053 / 3600)
