"""Ground-truth lines: one per tick x device, XIDs with owners at error time, idle as a perfect observer."""

from __future__ import annotations

from pathlib import Path

import pytest

from periscope.sim.cluster.model import ClusterModel
from periscope.sim.cluster.simulator import _Behind
from periscope.sim.cluster.truth import Truth, TruthWriter, read_truth, rfc3339
from periscope.sim.scenario import load_scenario

START = 1_700_000_000_000


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    model = ClusterModel(load_scenario("demo"))
    path = tmp_path_factory.mktemp("truth") / "t.jsonl"
    w = TruthWriter(path, model, START, speed=4.0, idle_window_ms=20_000, idle_threshold=5.0)
    for k in (0, 1, 29, 30, 59, 60):  # skipped ticks are filled in
        w.write_tick(k)
    w.write_tick(60)  # idempotent
    w.close()
    return list(read_truth(path))


def holders(rows: list[dict], tick: int) -> list[dict]:
    return [r for r in rows if r["kind"] == "holder" and r["tick"] == tick]


def test_meta_first(rows: list[dict]) -> None:
    meta = rows[0]
    assert meta["kind"] == "meta" and meta["scenario"] == "demo" and meta["start_ms"] == START
    assert meta["tick_ms"] == 1000 and meta["speed"] == 4.0 and meta["idle_window_ms"] == 20_000
    assert meta["policy"]["components"]["dcgmExporter"] == "disabled-as-intended"
    assert sum(len(v) for v in meta["nodes"].values()) == 5


def test_every_tick_every_device(rows: list[dict]) -> None:
    ticks = sorted({r["tick"] for r in rows if r["kind"] == "holder"})
    assert ticks == list(range(61))
    per_tick = {len(holders(rows, k)) for k in ticks}
    assert per_tick == {11}  # 4 MIG slices + 1 A100 + 4 T4 replicas + 2 H100
    r = holders(rows, 30)[0]
    assert r["at_ms"] == START + 30_000 and r["at"] == rfc3339(START + 30_000)
    assert rfc3339(START) == "2023-11-14T22:13:20.000Z"


def test_reused_name_new_uid_in_truth(rows: list[dict]) -> None:
    def api(tick: int) -> dict:
        return next(r for r in holders(rows, tick) if r["pod"] == "api-6d4f8b7c9-7xk2m")

    assert api(49)["pod_uid"] != api(50)["pod_uid"]
    assert (api(49)["util_pct"], api(50)["util_pct"]) == (85.0, 12.0)


def test_shared_and_mig_rows(rows: list[dict]) -> None:
    t4 = [r for r in holders(rows, 30) if r["node"] == "gpu-b"]
    assert {r["sharing"] for r in t4} == {"time-slicing"}
    assert sorted(r["util_pct"] for r in t4 if r["pod_uid"]) == [10.0, 25.0, 30.0]
    assert {r["gpu_util_pct"] for r in t4} == {65.0}
    assert sum(1 for r in t4 if r["pod_uid"] is None) == 1
    mig = [r for r in holders(rows, 30) if r["mig"]]
    assert len(mig) == 4 and not any(r["util_observable"] for r in mig)
    assert all(r["idle"] is None for r in mig)


def test_idle_truth(rows: list[dict]) -> None:
    def idle(tick: int, pod: str) -> bool | None:
        return next(r["idle"] for r in holders(rows, tick) if r["pod"] == pod)

    assert idle(10, "jupyter-alice") is False  # not held for a whole window yet
    assert idle(20, "jupyter-alice") is True
    assert idle(60, "jupyter-alice") is True
    assert idle(60, "finetune-5b7d9c4f8-9zq8r") is False
    assert idle(60, "api-6d4f8b7c9-7xk2m") is False  # new pod: too young to judge


def test_xids_with_owners_at_error_time(rows: list[dict]) -> None:
    xids = [r for r in rows if r["kind"] == "xid"]
    assert len(xids) == 1  # the T4 XID at 70s is beyond tick 60
    (x,) = xids
    assert x["code"] == 79 and x["at_ms"] == START + 30_000 and x["node"] == "gpu-c"
    old_api = next(r for r in holders(rows, 30) if r["pod"] == "api-6d4f8b7c9-7xk2m")
    assert [o["pod_uid"] for o in x["owners"]] == [old_api["pod_uid"]]


def test_fault_rows(tmp_path: Path) -> None:
    model = ClusterModel(load_scenario("faults"))
    w = TruthWriter(tmp_path / "f.jsonl", model, START, 1.0, 600_000, 5.0)
    w.write_tick(29)
    w.close()
    faults = [r for r in read_truth(tmp_path / "f.jsonl") if r["kind"] == "fault"]
    assert [(f["fault"], f["node"]) for f in faults] == [
        ("kubelet-restart", "fault-a"),
        ("checkpoint-corrupt", "fault-a"),
        ("probe-restart", "fault-b"),
        ("joiner-restart", None),
        ("watcher-restart", None),
    ]
    assert faults[0]["end_ms"] - faults[0]["at_ms"] == 6000


def test_read_truth_names_bad_lines(tmp_path: Path) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text('{"kind": "meta"}\nnot json\n')
    with pytest.raises(ValueError, match=r"bad.jsonl: line 2: not JSON"):
        list(read_truth(p))


def test_when_each_tick_was_in_place_and_what_the_hardware_showed_then(tmp_path: Path) -> None:
    model = ClusterModel(load_scenario("demo"))
    path = tmp_path / "t.jsonl"
    w = TruthWriter(path, model, START, speed=4.0, idle_window_ms=20_000, idle_threshold=5.0)
    # On time until 10 s; ticks 10-12 put in place together at 12.6 s; 13 on time again.
    for k, late in ((9, 0), (10, 2600), (11, 1600), (12, 600), (13, 40)):
        w.write_tick(k, START + k * 1000 + late)
    w.close()
    written = [r for r in read_truth(path) if r["kind"] == "tick"]
    assert [(r["tick"], r["applied_ms"] - r["at_ms"]) for r in written] == [
        (9, 0), (10, 2600), (11, 1600), (12, 600), (13, 40)]
    t = Truth(read_truth(path))
    at = (9_500, 10_100, 12_500, 12_700, 13_010, 13_050)
    assert [t.behind(START + ms) for ms in at] == [0, 1, 3, 0, 1, 0]
    assert t.visible_ms(START + 10_000) == START + 12_600  # an XID of 10 s showed with tick 10
    assert t.visible_ms(START + 9_400) == START + 10_000 + 2600  # fired with tick 10, the first after it
    assert t.late_ms() == [0, 2600, 1600, 600, 40]


def test_the_simulator_says_when_it_fell_behind(caplog: pytest.LogCaptureFixture) -> None:
    b = _Behind(1000)
    for t, late in ((1000, 20), (2000, 1800), (3000, 2400), (4000, 900), (5000, 10)):
        b.note(t, late)
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert said == ["simulator behind from 2 s to 4 s of scenario time (at most 2.4 s): samples taken then "
                    "see an older tick"]
