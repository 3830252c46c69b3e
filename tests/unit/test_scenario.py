"""Scenario files: every built-in validates, and every kind of mistake is rejected naming its path."""

from __future__ import annotations

import copy
import json
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from periscope.sim.cluster.model import ClusterModel
from periscope.sim.scenario import (
    SHARED_RESOURCE,
    Scenario,
    ScenarioError,
    StrictLoader,
    UserSpec,
    builtin_names,
    json_schema,
    load_scenario,
    parse_scenario,
)

BASE: dict[str, Any] = {
    "name": "t",
    "seed": 3,
    "duration": "60s",
    "tick": "1s",
    "nodes": [
        {
            "name": "a",
            "gpus": [
                {"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "mig": ["3g.40gb", "1g.10gb"]},
                {"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920},
            ],
        },
        {
            "name": "b",
            "gpus": [{"model": "Tesla T4", "memory_mib": 15360}],
            "sharing": {"strategy": "time-slicing", "replicas": 4},
            "checkpoint": "v1",
        },
    ],
    "pods": [
        {
            "namespace": "ml",
            "name": "p0",
            "node": "a",
            "stop": "30s",
            "containers": [
                {"name": "c", "resource": "nvidia.com/mig-1g.10gb", "util_pct": 50, "memory_mib": 100}
            ],
        },
        {
            "namespace": "ml",
            "name": "p1",
            "node": "b",
            "containers": [{"name": "c", "util_pct": [[0, 10], ["20s", 60]], "processes": 2}],
        },
    ],
    "events": [
        {"at": "10s", "xid": {"node": "a", "gpu": 1, "code": 79}},
        {"at": "20s", "fault": "kubelet-restart", "node": "b"},
        {"at": "25s", "fault": "joiner-restart"},
    ],
    "policy": {"state": "notReady", "components": {"dcgmExporter": {"enabled": False}}},
}


def parse(doc: dict[str, Any], source: str = "x.yaml") -> Scenario:
    return parse_scenario(yaml.safe_dump(doc, sort_keys=False), source)


def edited(path: str, value: Any) -> dict[str, Any]:
    """BASE with one value replaced, or deleted for DELETE; path like 'pods.0.containers.0.count'."""
    doc = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    target: Any = doc
    for p in parents:
        target = target[int(p)] if isinstance(target, list) else target[p]
    key: Any = int(last) if isinstance(target, list) else last
    if value is DELETE:
        del target[key]
    else:
        target[key] = value
    return doc


class _Delete:
    def __repr__(self) -> str:  # in test ids, which every pytest-xdist worker must compute alike
        return "DELETE"


DELETE = _Delete()


def test_base_parses_with_defaults() -> None:
    s = parse(BASE)
    assert (s.name, s.seed, s.duration_ms, s.tick_ms) == ("t", 3, 60_000, 1000)
    assert s.nodes[1].sharing.strategy == "time-slicing" and s.nodes[1].sharing.replicas == 4
    assert s.nodes[1].checkpoint == "v1" and s.nodes[0].checkpoint == "v2"
    assert s.nodes[0].resources() == ("nvidia.com/gpu", "nvidia.com/mig-3g.40gb", "nvidia.com/mig-1g.10gb")
    c = s.pods[1].containers[0]
    assert c.util == ((0, 10.0), (20_000, 60.0)) and c.processes == 2 and c.count == 1
    assert c.util_at(19_999) == 10.0 and c.util_at(20_000) == 60.0
    assert s.pods[0].stop_ms == 30_000 and s.pods[1].stop_ms is None and s.pods[0].qos == "burstable"
    assert [x.code for x in s.xids] == [79] and [f.fault for f in s.faults] == [
        "kubelet-restart",
        "joiner-restart",
    ]
    assert s.faults[0].duration_ms == 2000 and s.faults[1].node is None
    assert s.policy is not None and dict(s.policy.components)["dcgmExporter"].enabled is False


@pytest.mark.parametrize("name", ["demo", "churn", "faults"])
def test_builtin_scenarios_validate_and_allocate(name: str) -> None:
    assert name in builtin_names()
    model = ClusterModel(load_scenario(name))
    assert model.pods and all(c.device_ids for p in model.pods for c in p.containers)


BAD: list[tuple[str, Any, str]] = [
    ("pods.0.containers.0.utl_pct", 3, "pods[0].containers[0].utl_pct: unknown key (did you mean util_pct?)"),
    ("colour", "red", "colour: unknown key"),
    ("nodes.0.gpus.0.mig.1", "9g.10gb", "nodes[0].gpus[0].mig[1]: '9g.10gb' is not a MIG profile"),
    ("nodes.0.gpus.0.mig", ["7g.80gb", "1g.10gb"], "nodes[0].gpus[0].mig: needs 8 compute slices"),
    ("nodes.0.gpus.0.memory_mib", "lots", "nodes[0].gpus[0].memory_mib: expected an integer, got 'lots'"),
    ("nodes.0.gpus.0.uuid", "GPU-XYZ", "nodes[0].gpus[0].uuid: 'GPU-XYZ' is not a GPU UUID"),
    ("nodes.0.gpus", [], "nodes[0].gpus: must not be empty"),
    ("nodes.1.name", "a", "nodes[1].name: node 'a' is listed twice"),
    ("nodes.1.name", "Bad_Name", "nodes[1].name: 'Bad_Name' is not a valid node name"),
    (
        "nodes.1.sharing.strategy",
        "vgpu",
        "nodes[1].sharing.strategy: 'vgpu' is not one of none, time-slicing, mps",
    ),
    ("nodes.1.sharing.replicas", 1, "nodes[1].sharing.replicas: 1 is out of range"),
    ("nodes.1.sharing", {"strategy": "mps"}, "nodes[1].sharing.replicas: required"),
    ("nodes.1.checkpoint", "v3", "nodes[1].checkpoint: 'v3' is not one of v2, v1, none"),
    ("duration", "soon", "duration: not a duration: 'soon'"),
    ("duration", DELETE, "duration: required"),
    ("duration", "0s", "duration: must be longer than 0s"),
    ("tick", "2m", "tick: must be between 10ms and the duration"),
    ("seed", True, "seed: expected an integer, got boolean true"),
    ("nodes", [], "nodes: must not be empty"),
    ("pods.0.node", "zzz", "pods[0].node: no node 'zzz' in nodes (nodes: a, b)"),
    (
        "pods.0.containers.0.resource",
        "nvidia.com/mig-2g.20gb",
        "pods[0].containers[0].resource: node a does not advertise nvidia.com/mig-2g.20gb",
    ),
    ("pods.1.containers.0.resource", SHARED_RESOURCE, None),  # valid: infers rename (checked below)
    (
        "pods.0.containers.0.util_pct",
        101,
        "pods[0].containers[0].util_pct: 101 is out of range (must be 0..100)",
    ),
    (
        "pods.0.containers.0.util_pct",
        [[0, 10], [0, 20]],
        "pods[0].containers[0].util_pct[1][0]: step offsets must increase",
    ),
    (
        "pods.0.containers.0.util_pct",
        [[0]],
        "pods[0].containers[0].util_pct[0]: expected a step [offset, pct]",
    ),
    ("pods.0.containers.0.util_pct", [], "pods[0].containers[0].util_pct: must not be empty"),
    ("pods.0.containers.0.processes", 0, "pods[0].containers[0].util_pct: a container with processes: 0"),
    ("pods.0.containers.0.count", 0, "pods[0].containers[0].count: 0 is out of range"),
    ("pods.0.containers.0.memory_mib", 20000, "pods[0].containers[0].memory_mib: 20000 MiB does not fit"),
    (
        "pods.0.containers.0.devices",
        ["0:1", "0:0"],
        "pods[0].containers[0].devices: pins 2 devices but count is 1",
    ),
    (
        "pods.0.containers.0.devices",
        ["0:7"],
        "pods[0].containers[0].devices[0]: GPU 0 of a has no MIG instance 7",
    ),
    (
        "pods.0.containers.0.devices",
        ["0:0"],
        "pods[0].containers[0].devices[0]: MIG instance 0:0 is a 3g.40gb",
    ),
    ("pods.0.containers.0.devices", ["0"], "pods[0].containers[0].devices[0]: GPU 0 of a is in MIG mode"),
    ("pods.0.containers.0.devices", ["5"], "pods[0].containers[0].devices[0]: node a has no GPU 5"),
    ("pods.0.containers.0.devices", ["x"], "pods[0].containers[0].devices[0]: 'x' is not a GPU index"),
    ("pods.0.containers.0.name", "C!", "pods[0].containers[0].name: 'C!' is not a valid container name"),
    ("pods.0.containers", [], "pods[0].containers: must not be empty"),
    ("pods.0.containers.0.name", DELETE, "pods[0].containers[0].name: required"),
    ("pods.0.start", "90s", "pods[0].start: 90s is not before the end (1m)"),
    ("pods.0.stop", "0s", "pods[0].stop: must be after start"),
    ("pods.0.uid", "nope", "pods[0].uid: 'nope' is not a pod UID"),
    ("pods.0.owner", {"kind": "Job"}, "pods[0].owner.name: required"),
    ("pods.0.qos", "gold", "pods[0].qos: 'gold' is not one of guaranteed, burstable, besteffort"),
    (
        "pods.1.containers.0.count",
        2,
        "pods[1].containers[0].count: one replica per container on a shared GPU",
    ),
    ("pods.0", "not-a-pod", "pods[0]: expected a mapping, got 'not-a-pod'"),
    ("events.0.xid.gpu", 3, "events[0].xid.gpu: node a has no GPU 3"),
    ("events.0.xid.code", 0, "events[0].xid.code: 0 is out of range"),
    ("events.0.xid.mig", 0, "events[0].xid.mig: GPU 1 of a has no MIG instance 0"),
    ("events.0.at", "2m", "events[0].at: 2m is not before the end"),
    ("events.1.fault", "meteor", "events[1].fault: 'meteor' is not one of kubelet-restart"),
    ("events.1.node", DELETE, "events[1].node: required"),
    ("events.2.node", "a", "events[2].node: joiner-restart is cluster-wide and takes no node"),
    ("events.2.duration", "3s",
     "events[2].duration: only applies to kubelet-restart, checkpoint-corrupt, joiner-stop"),
    ("events.0.fault", "probe-restart", "events[0]: needs exactly one of xid or fault"),
    ("events.0.node", "a", "events[0].node: only applies to faults"),
    ("policy.state", "great", "policy.state: 'great' is not one of ready, notReady, ignored"),
    (
        "policy.components.dcgmExpoter",
        {"enabled": True},
        "policy.components.dcgmExpoter: unknown key (did you mean dcgmExporter?)",
    ),
    (
        "policy.components.dcgmExporter.enabled",
        "no",
        "policy.components.dcgmExporter.enabled: expected true or false",
    ),
    (
        "policy.components.devicePlugin",
        {"desired": 2, "ready": 3},
        "policy.components.devicePlugin.ready: 3 is more than desired (2)",
    ),
]


@pytest.mark.parametrize(("path", "value", "message"), BAD, ids=[f"{p}={v!r}"[:60] for p, v, _ in BAD])
def test_bad_value_is_named(path: str, value: Any, message: str | None) -> None:
    doc = edited(path, value)
    if message is None:
        parse(doc)
        return
    with pytest.raises(ScenarioError) as err:
        parse(doc)
    assert str(err.value).startswith("scenario x.yaml: ")
    assert message in str(err.value)


def test_shared_resource_name_follows_the_pods_or_rename() -> None:
    s = parse(edited("pods.1.containers.0.resource", SHARED_RESOURCE))
    assert s.nodes[1].sharing.rename is True and s.nodes[1].resources() == (SHARED_RESOURCE,)
    explicit = edited("nodes.1.sharing", {"strategy": "mps", "replicas": 2, "rename": False})
    explicit["pods"][1]["containers"][0]["resource"] = SHARED_RESOURCE
    with pytest.raises(ScenarioError, match=r"pods\[1\].containers\[0\].resource: node b does not advertise"):
        parse(explicit)


def test_checkpoint_corrupt_needs_a_checkpoint() -> None:
    doc = edited("nodes.1.checkpoint", "none")
    doc["events"][1]["fault"] = "checkpoint-corrupt"
    with pytest.raises(ScenarioError, match=r"events\[1\].node: node b has no checkpoint file"):
        parse(doc)


def test_sharing_needs_a_whole_gpu() -> None:
    doc = edited("nodes.0.sharing", {"strategy": "time-slicing", "replicas": 2})
    doc["nodes"][0]["gpus"] = [doc["nodes"][0]["gpus"][0]]
    with pytest.raises(ScenarioError, match=r"nodes\[0\].sharing: time-slicing needs a GPU without MIG"):
        parse(doc)


def test_reused_name_must_wait_for_the_old_pod() -> None:
    doc = copy.deepcopy(BASE)
    doc["pods"].append(
        {
            "namespace": "ml",
            "name": "p0",
            "node": "a",
            "start": "29s",
            "containers": [{"name": "c", "resource": "nvidia.com/mig-1g.10gb"}],
        }
    )
    with pytest.raises(ScenarioError, match=r"pods\[2\]: pod ml/p0 still exists at 29s \(pods\[0\]\)"):
        parse(doc)
    doc["pods"][2]["start"] = "30s"
    s = parse(doc)
    assert s.pods[2].start_ms == 30_000


def test_duplicate_pod_uid_rejected() -> None:
    doc = copy.deepcopy(BASE)
    uid = "5a1d0c52-8f3e-4c55-9d6e-0b2f1c3d4e5f"
    doc["pods"][0]["uid"] = doc["pods"][1]["uid"] = uid
    with pytest.raises(ScenarioError, match=r"pods\[1\].uid: .* is also the UID of pods\[0\]"):
        parse(doc)


def test_yaml_problems() -> None:
    with pytest.raises(
        ScenarioError, match=r"scenario y.yaml: invalid YAML at line 3: expected the node content"
    ):
        parse_scenario("name: x\nnodes: [\n", "y.yaml")
    with pytest.raises(ScenarioError, match=r"duplicate key 'seed'"):
        parse_scenario("seed: 1\nseed: 2\nduration: 1s\nnodes: []\n", "y.yaml")
    with pytest.raises(ScenarioError, match=r"scenario y.yaml: invalid YAML at line 2: found unhashable key"):
        parse_scenario("seed: 1\n? [1]\n: 2\n", "y.yaml")
    with pytest.raises(
        ScenarioError, match=r"scenario y.yaml: \(top level\): expected a mapping, got a list"
    ):
        parse_scenario("- 1\n", "y.yaml")
    with pytest.raises(
        ScenarioError, match=r"scenario y.yaml: \(top level\): expected a mapping, got nothing"
    ):
        parse_scenario("", "y.yaml")


def test_mig_pair_unquoted_stays_a_pair() -> None:
    # YAML 1.1 reads 1:0 as the base-60 number 60; the scenario loader keeps it a "GPU:MIG" pin.
    text = """
duration: 10s
nodes:
  - name: a
    gpus:
      - {model: NVIDIA A100-SXM4-80GB, memory_mib: 81920}
      - {model: NVIDIA A100-SXM4-80GB, memory_mib: 81920, mig: [1g.10gb]}
pods:
  - {name: p, node: a, containers: [{name: c, resource: nvidia.com/mig-1g.10gb, devices: [1:0]}]}
"""
    s = parse_scenario(text, "x.yaml")
    assert s.pods[0].containers[0].devices == ("1:0",)
    assert s.name == "x" and s.seed == 0 and s.tick_ms == 1000  # defaults: file stem, 0, 1s
    with pytest.raises(ScenarioError, match=r"devices\[0\]: GPU 1 of a is in MIG mode"):
        parse_scenario(text.replace("[1:0]", "[1]"), "x.yaml")


def test_numbers_are_seconds_and_durations_strings() -> None:
    s = parse(edited("duration", 90))
    assert s.duration_ms == 90_000
    s = parse(edited("tick", "500ms"))
    assert s.tick_ms == 500


def test_load_from_path_and_unknown_name(tmp_path: Path) -> None:
    p = tmp_path / "mine.yaml"
    p.write_text(yaml.safe_dump(BASE))
    assert load_scenario(str(p)).name == "t"
    with pytest.raises(
        ScenarioError, match=r"scenario nosuch: no such file or built-in scenario \(built-in: .*demo"
    ):
        load_scenario("nosuch")
    with pytest.raises(ScenarioError, match=r"scenario .*missing.yaml: cannot read"):
        load_scenario(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bin.yaml"
    bad.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ScenarioError, match="not a UTF-8 text file"):
        load_scenario(str(bad))


def test_no_free_device_is_a_scenario_error() -> None:
    doc = copy.deepcopy(BASE)
    doc["pods"].append(
        {
            "namespace": "ml",
            "name": "p2",
            "node": "a",
            "start": "5s",
            "containers": [{"name": "c", "resource": "nvidia.com/mig-1g.10gb"}],
        }
    )
    with pytest.raises(
        ScenarioError,
        match=r"pods\[2\].containers\[0\]: no free nvidia.com/mig-1g.10gb device on "
        r"node a at 5s",
    ):
        ClusterModel(parse(doc))
    doc["pods"][2]["start"] = "30s"  # p0 stops at 30s: its slice is free again
    assert (
        ClusterModel(parse(doc)).pods[2].containers[0].device_ids
        == ClusterModel(parse(BASE)).pods[0].containers[0].device_ids
    )


def test_published_json_schema_is_the_models_schema() -> None:
    # docs/scenario.schema.json is what editors check scenario files against; regenerate it with
    # `python -m periscope.sim.scenario > docs/scenario.schema.json` when the format changes.
    published = json.loads((Path(__file__).parents[2] / "docs" / "scenario.schema.json").read_text())
    assert published == json_schema()
    jsonschema.Draft202012Validator.check_schema(published)


@pytest.mark.parametrize("name", ["demo", "churn", "faults"])
def test_builtin_scenarios_validate_against_the_published_schema(name: str) -> None:
    text = (resources.files("periscope.sim") / "scenarios" / f"{name}.yaml").read_text("utf-8")
    validator = jsonschema.Draft202012Validator(json_schema())
    assert [e.message for e in validator.iter_errors(yaml.load(text, Loader=StrictLoader))] == []


def test_published_json_schema_rejects_what_the_validator_rejects() -> None:
    validator = jsonschema.Draft202012Validator(json_schema())
    for path, value in [
        ("colour", "red"),
        ("duration", "soon"),
        ("nodes.0.gpus.0.mig.1", "9g.10gb"),
        ("pods.0.containers.0.util_pct", 101),
        ("pods.0.containers.0.utl_pct", 3),
        ("policy.components.dcgmExpoter", {}),
        ("seed", True),
        ("pods.0.qos", "gold"),
    ]:
        assert list(validator.iter_errors(edited(path, value))), path
        with pytest.raises(ScenarioError):
            parse(edited(path, value))
    assert list(validator.iter_errors(BASE)) == []


def test_users_section() -> None:
    doc = edited(
        "users",
        [
            {"name": "alice", "token": "t-a", "namespaces": ["ml"]},
            {"name": "ops", "token": "t-o", "cluster": True},
        ],
    )
    s = parse(doc)
    assert s.users == (
        UserSpec(name="alice", token="t-a", namespaces=("ml",)),
        UserSpec(name="ops", token="t-o", cluster=True),
    )
    assert parse(BASE).users == ()
    doc["users"][1]["token"] = "t-a"
    with pytest.raises(ScenarioError, match=r"users\[1\].token: the same token as users\[0\]$"):
        parse(doc)
    with pytest.raises(ScenarioError, match=r"users\[0\].namespaces\[0\]: 'ML!' is not a valid namespace"):
        parse(edited("users", [{"name": "a", "token": "t", "namespaces": ["ML!"]}]))
    with pytest.raises(ScenarioError, match=r"users\[0\].admin: unknown key"):
        parse(edited("users", [{"name": "a", "token": "t", "admin": True}]))
