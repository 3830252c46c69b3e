"""The pure cluster model: deterministic generation, device-plugin allocation, usage, truth per device."""

from __future__ import annotations

import re

import pytest

from periscope.core.deviceid import parse_device_id
from periscope.sim.cluster.kube_objects import operands, pod_object
from periscope.sim.cluster.model import ClusterModel, Holding
from periscope.sim.scenario import Scenario, load_scenario, parse_scenario

SCENARIO = """
name: unit
seed: 5
duration: 100s
tick: 1s
nodes:
  - name: mig
    gpus:
      - {model: NVIDIA A100-SXM4-80GB, memory_mib: 81920, mig: [3g.40gb, 1g.10gb, 1g.10gb]}
      - {model: NVIDIA A100-SXM4-80GB, memory_mib: 81920}
  - name: ts
    gpus:
      - {model: Tesla T4, memory_mib: 15360}
      - {model: Tesla T4, memory_mib: 15360, uuid: GPU-11111111-2222-4333-8444-555555555555}
    sharing: {strategy: time-slicing, replicas: 3}
pods:
  - {name: big, node: mig, containers: [{name: c, resource: nvidia.com/mig-3g.40gb, util_pct: 70,
     memory_mib: 30000, processes: 2}]}
  - {name: small-pinned, node: mig, containers: [{name: c, resource: nvidia.com/mig-1g.10gb, devices: ["0:2"],
     memory_mib: 4000}]}
  - {name: small, node: mig, start: 5s,
     containers: [{name: c, resource: nvidia.com/mig-1g.10gb, memory_mib: 3000}]}
  - {name: whole, node: mig, stop: 40s,
     containers: [{name: c, util_pct: [[0s, 90], [20s, 10]], memory_mib: 50000}]}
  - {name: whole, node: mig, start: 40s, containers: [{name: c, util_pct: 33, memory_mib: 1000}]}
  - {name: a, node: ts, containers: [{name: c, util_pct: 60, memory_mib: 3000, processes: 3}]}
  - {name: b, node: ts, start: 10s, containers: [{name: c, util_pct: 70, memory_mib: 2000}]}
  - {name: c, node: ts, start: 10s, stop: 50s,
     containers: [{name: c, util_pct: 10, devices: ["1"], memory_mib: 1000}]}
  - {name: idle, node: ts, containers: [{name: c, util_pct: 0, processes: 0, devices: ["1"], memory_mib: 0}]}
events:
  - {at: 30s, xid: {node: ts, gpu: 0, code: 31}}
  - {at: 45s, xid: {node: mig, gpu: 1, code: 79}}
  - {at: 45s, xid: {node: mig, gpu: 0, code: 94, mig: 2}}
"""


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    return parse_scenario(SCENARIO, "unit.yaml")


@pytest.fixture(scope="module")
def model(scenario: Scenario) -> ClusterModel:
    return ClusterModel(scenario)


def pod(model: ClusterModel, name: str, t_ms: int) -> tuple[str, tuple[str, ...]]:
    p = next(p for p in model.alive(t_ms) if p.name == name)
    return p.uid, p.containers[0].device_ids


def holding(model: ClusterModel, device_id: str, t_ms: int) -> Holding:
    return next(h for h in model.holdings(t_ms) if h.device.id == device_id)


def test_same_scenario_same_cluster(scenario: Scenario, model: ClusterModel) -> None:
    again = ClusterModel(scenario)
    assert [p.uid for p in again.pods] == [p.uid for p in model.pods]
    assert [c.pids for p in again.pods for c in p.containers] == [
        c.pids for p in model.pods for c in p.containers
    ]
    assert again.devices.keys() == model.devices.keys()
    other = ClusterModel(scenario.model_copy(update={"seed": 6}))
    assert not {p.uid for p in other.pods} & {p.uid for p in model.pods}
    assert not other.devices.keys() & (
        model.devices.keys()
        - {
            "GPU-11111111-2222-4333-8444-555555555555::0",
            "GPU-11111111-2222-4333-8444-555555555555::1",
            "GPU-11111111-2222-4333-8444-555555555555::2",
        }
    )


def test_adding_a_pod_keeps_everyone_elses_identity(scenario: Scenario, model: ClusterModel) -> None:
    # one more time-sliced pod
    extra = scenario.pods[5].model_copy(update={"name": "late", "start_ms": 90_000})
    bigger = ClusterModel(scenario.model_copy(update={"pods": (*scenario.pods, extra)}))
    assert [p.uid for p in bigger.pods[:-1]] == [p.uid for p in model.pods]
    assert [c.container_id for p in bigger.pods[:-1] for c in p.containers] == [
        c.container_id for p in model.pods for c in p.containers
    ]


def test_generated_identifiers_look_real(model: ClusterModel) -> None:
    uuid = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
    for p in model.pods:
        assert re.fullmatch(uuid, p.uid)
        for c in p.containers:
            assert re.fullmatch(r"[0-9a-f]{64}", c.container_id)
            assert all(1000 <= pid < 3_001_100 for pid in c.pids)
    for d in model.devices.values():
        parsed = parse_device_id(d.id)
        assert parsed.kind == ("mig" if d.mig else "gpu")
        assert parsed.replica == d.replica


def test_reused_name_gets_a_new_uid(model: ClusterModel) -> None:
    old_uid, old_devs = pod(model, "whole", 39_000)
    new_uid, new_devs = pod(model, "whole", 40_000)
    assert old_uid != new_uid and old_devs == new_devs  # the freed GPU is the first free one again
    assert [p.name for p in model.alive(40_000, "mig")].count("whole") == 1


def test_allocation_mig_pins_and_first_free(model: ClusterModel) -> None:
    gpu0 = model.gpus["mig"][0]
    _, big = pod(model, "big", 0)
    _, pinned = pod(model, "small-pinned", 0)
    _, small = pod(model, "small", 5000)
    assert big == (gpu0.mig[0].uuid,)
    assert pinned == (gpu0.mig[2].uuid,)
    assert small == (gpu0.mig[1].uuid,)  # first free 1g.10gb once the pin took instance 2
    assert model.registered("mig") == {
        "nvidia.com/gpu": (model.gpus["mig"][1].uuid,),
        "nvidia.com/mig-3g.40gb": (gpu0.mig[0].uuid,),
        "nvidia.com/mig-1g.10gb": (gpu0.mig[1].uuid, gpu0.mig[2].uuid),
    }
    assert [m.memory_mib for m in gpu0.mig] == [40960, 10240, 10240]


def test_time_slicing_replicas(model: ClusterModel) -> None:
    g0, g1 = model.gpus["ts"]
    assert model.registered("ts") == {
        "nvidia.com/gpu": tuple(f"{g.uuid}::{r}" for g in (g0, g1) for r in range(3))
    }
    assert g1.uuid == "GPU-11111111-2222-4333-8444-555555555555"
    assert pod(model, "a", 0)[1] == (f"{g0.uuid}::0",)
    assert pod(model, "idle", 0)[1] == (f"{g1.uuid}::0",)
    assert pod(model, "b", 10_000)[1] == (f"{g0.uuid}::1",)
    assert pod(model, "c", 10_000)[1] == (f"{g1.uuid}::1",)  # pinned to GPU 1: its first free replica


def test_exclusive_usage_and_steps(model: ClusterModel) -> None:
    whole = model.gpus["mig"][1]
    for t, util in ((0, 90.0), (19_000, 90.0), (20_000, 10.0), (45_000, 33.0)):
        (u,) = [u for u in model.usage("mig", t) if u.gpu is whole]
        assert u.util_pct == util
        assert [p.sm_util for p in u.processes] == [util]
        assert holding(model, whole.uuid, t).util_pct == util
    hot = next(u for u in model.usage("mig", 0) if u.gpu is whole)
    cool = next(u for u in model.usage("mig", 45_000) if u.gpu is whole)
    assert hot.power_w > cool.power_w > 50.0 and hot.temp_c > cool.temp_c
    assert hot.fb_used_mib == 50_000 and cool.fb_used_mib == 1000


def test_time_sliced_usage_is_split_and_capped(model: ClusterModel) -> None:
    g0 = model.gpus["ts"][0]
    u = next(u for u in model.usage("ts", 0) if u.gpu is g0)
    assert u.util_pct == 60 and len(u.processes) == 3 and {p.sm_util for p in u.processes} == {20.0}
    assert sum(p.used_mib for p in u.processes) == 3000
    u = next(u for u in model.usage("ts", 10_000) if u.gpu is g0)  # a=60 + b=70 wants 130 %
    assert u.util_pct == 100.0
    a = holding(model, f"{g0.uuid}::0", 10_000)
    b = holding(model, f"{g0.uuid}::1", 10_000)
    assert a.util_pct == pytest.approx(60 * 100 / 130) and b.util_pct == pytest.approx(70 * 100 / 130)
    assert sum(p.sm_util or 0 for p in u.processes) == pytest.approx(100.0)
    assert u.fb_used_mib == 5000
    free = holding(model, f"{g0.uuid}::2", 10_000)
    assert free.pod is None and free.util_pct is None


def test_idle_holder_without_processes(model: ClusterModel) -> None:
    g1 = model.gpus["ts"][1]
    u = next(u for u in model.usage("ts", 60_000) if u.gpu is g1)
    assert u.util_pct == 0.0 and u.processes == ()
    h = holding(model, f"{g1.uuid}::0", 60_000)
    assert h.pod is not None and h.pod.name == "idle" and h.util_pct == 0.0


def test_mig_usage_reports_memory_not_util(model: ClusterModel) -> None:
    g0 = model.gpus["mig"][0]
    u = next(u for u in model.usage("mig", 10_000) if u.gpu is g0)
    assert u.util_pct is None
    assert [m.fb_used_mib for m in u.mig] == [30000, 3000, 4000]
    assert [len(m.processes) for m in u.mig] == [2, 1, 1]
    assert all(p.sm_util is None for m in u.mig for p in m.processes)
    assert u.fb_used_mib == 37000
    h = holding(model, g0.mig[0].uuid, 10_000)
    assert h.device.sharing == "mig" and h.util_pct == 70.0  # the truth, even if NVML cannot show it


def test_processes_carry_pod_identity_and_unique_pids(model: ClusterModel) -> None:
    for node in ("mig", "ts"):
        pids = [pid for p in model.pods if p.node == node for c in p.containers for pid in c.pids]
        assert len(pids) == len(set(pids))
    u = next(u for u in model.usage("ts", 0) if u.gpu is model.gpus["ts"][0])
    a_uid, _ = pod(model, "a", 0)
    assert {p.pod_uid for p in u.processes} == {a_uid}


def test_xid_owners_at_error_time(scenario: Scenario, model: ClusterModel) -> None:
    ts_xid, whole_xid, mig_xid = scenario.xids
    assert sorted(h.pod.name for h in model.xid_owners(ts_xid) if h.pod) == ["a", "b"]
    (owner,) = model.xid_owners(whole_xid)
    assert owner.pod is not None and owner.pod.uid == pod(model, "whole", 45_000)[0]
    (inst,) = model.xid_owners(mig_xid)
    assert inst.pod is not None and inst.pod.name == "small-pinned"


def test_holdings_cover_every_device_every_tick(model: ClusterModel) -> None:
    assert len(model.tick_times()) == 100
    for t in (0, 50_000, 99_000):
        assert sorted(h.device.id for h in model.holdings(t)) == sorted(model.devices)
    assert model.util_of(model.gpus["mig"][1].uuid, 0) == 90.0
    assert model.util_of(f"{model.gpus['ts'][0].uuid}::2", 0) == 0.0


def test_demo_policy_expectations() -> None:
    statuses = {o.component: o.expected_status for o in operands(load_scenario("demo"))}
    assert statuses["dcgmExporter"] == "disabled-as-intended"
    assert statuses["devicePlugin"] == "degraded"
    assert statuses["driver"] == statuses["gfd"] == statuses["migManager"] == "ok"
    assert statuses["dcgm"] == statuses["nodeStatusExporter"] == "disabled-as-intended"
    assert operands(parse_scenario(SCENARIO, "unit.yaml")) == []


def test_operand_statuses_from_spec() -> None:
    text = (
        SCENARIO
        + """
policy:
  components:
    dcgm: {enabled: false, present: true}
    gfd: {present: false}
    driver: {enabled: true, desired: 2, ready: 1}
    dcgmExporter: {enabled: true, desired: 1}
"""
    )
    ops = {o.component: o for o in operands(parse_scenario(text, "p.yaml"))}
    assert ops["dcgm"].expected_status == "unexpected"
    assert ops["gfd"].expected_status == "missing"
    assert ops["driver"].expected_status == "degraded"
    assert ops["dcgmExporter"].expected_status == "degraded"  # fewer desired than GPU nodes
    assert ops["migManager"].desired == 1  # only the A100 node can run MIG
    assert ops["toolkit"].expected_status == "ok" and ops["toolkit"].desired == 2


def _kubernetes_qos(pod: dict[str, object]) -> str:
    """The QoS class Kubernetes derives from a pod's spec (pkg/apis/core/v1/helper/qos): only cpu and
    memory count; no request or limit anywhere is BestEffort; a cpu and memory limit in every container,
    with requests (when given) equal to the limits, is Guaranteed; anything else Burstable."""
    containers = pod["spec"]["containers"]  # type: ignore[index]
    counted = ("cpu", "memory")
    some, guaranteed = False, True
    for c in containers:
        requests = {k: v for k, v in c["resources"].get("requests", {}).items() if k in counted}
        limits = {k: v for k, v in c["resources"].get("limits", {}).items() if k in counted}
        some = some or bool(requests or limits)
        guaranteed = (
            guaranteed and set(limits) == set(counted) and all(limits[k] == v for k, v in requests.items())
        )
    return "BestEffort" if not some else "Guaranteed" if guaranteed else "Burstable"


@pytest.mark.parametrize("qos", ["guaranteed", "burstable", "besteffort"])
def test_pod_objects_resources_give_their_qos_class(qos: str) -> None:
    """The simulated apiserver's pods carry resources from which Kubernetes would derive the very QoS class
    they state (the built-in scenarios only have burstable pods)."""
    text = SCENARIO.replace("- {name: a, node: ts,", f"- {{name: a, node: ts, qos: {qos},")
    text = text.replace(
        "containers: [{name: c, util_pct: 60, memory_mib: 3000, processes: 3}]",
        "containers: [{name: c, util_pct: 60, memory_mib: 3000, processes: 3}, {name: d, util_pct: 5}]",
    )
    model = ClusterModel(parse_scenario(text, "qos.yaml"))
    pod = next(p for p in model.pods if p.name == "a")
    obj = pod_object(pod, created_ms=1_700_000_000_000)
    stated = obj["status"]["qosClass"]
    assert stated == {"guaranteed": "Guaranteed", "burstable": "Burstable", "besteffort": "BestEffort"}[qos]
    assert _kubernetes_qos(obj) == stated
    for c, spec in zip(obj["spec"]["containers"], pod.containers, strict=True):  # the GPUs in every class
        assert c["resources"]["limits"][spec.spec.resource] == str(spec.spec.count)
