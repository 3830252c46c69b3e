"""Table tests for the operator-intent view: every component status, from policy + DaemonSets + nodes."""

from __future__ import annotations

import pytest

from periscope.core.model import Meta, NodeEvent, OperandStatus, PolicyEvent
from periscope.core.policy import OPERANDS, ComponentStatus, Operand, component_status, policy_view

META = Meta(node="cluster", source="kube_watcher", epoch=1, seq=1, time_ms=1000)
DCGM_EXPORTER = next(o for o in OPERANDS if o.component == "dcgmExporter")  # operator default: on
NODE_STATUS = next(o for o in OPERANDS if o.component == "nodeStatusExporter")  # operator default: off


def ds(desired: int, ready: int, present: bool = True) -> OperandStatus:
    return OperandStatus("x", "x", present, desired, ready, ready)


# operand, spec enabled, DaemonSet, GPU nodes labelled on, labelled off -> status
CASES: list[tuple[str, Operand, bool | None, OperandStatus | None, int, int, str]] = [
    ("enabled, all ready", DCGM_EXPORTER, True, ds(3, 3), 3, 0, "ok"),
    ("default-on, all ready", DCGM_EXPORTER, None, ds(2, 2), 0, 0, "ok"),
    ("enabled, some pods not ready", DCGM_EXPORTER, True, ds(3, 2), 3, 0, "degraded"),
    ("enabled, not scheduled on every labelled node", DCGM_EXPORTER, True, ds(1, 1), 2, 0, "degraded"),
    ("enabled, one node labelled off is not a gap", DCGM_EXPORTER, True, ds(2, 2), 2, 1, "ok"),
    ("enabled but DaemonSet missing", DCGM_EXPORTER, True, None, 2, 0, "missing"),
    ("default-on but DaemonSet absent", DCGM_EXPORTER, None, ds(0, 0, present=False), 0, 0, "missing"),
    ("disabled and absent", DCGM_EXPORTER, False, None, 0, 0, "disabled-as-intended"),
    ("default-off and absent", NODE_STATUS, None, None, 0, 0, "disabled-as-intended"),
    ("disabled but still running", DCGM_EXPORTER, False, ds(2, 2), 0, 0, "unexpected"),
    ("default-off but running", NODE_STATUS, None, ds(1, 0), 0, 0, "unexpected"),
    ("disabled, DaemonSet left with nothing scheduled", NODE_STATUS, False, ds(0, 0), 0, 0,
     "disabled-as-intended"),
    ("enabled but labelled off on every GPU node", DCGM_EXPORTER, True, None, 0, 2, "disabled-as-intended"),
    ("labelled off everywhere yet running", DCGM_EXPORTER, True, ds(1, 1), 0, 2, "unexpected"),
]


@pytest.mark.parametrize(
    ("operand", "enabled", "daemonset", "on", "off", "want"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_component_status_table(
    operand: Operand, enabled: bool | None, daemonset: OperandStatus | None, on: int, off: int, want: str
) -> None:
    assert component_status(operand, enabled, daemonset, on, off) == want


# What the operator makes of an unset `enabled`, per component: IsEnabled() on nil in NVIDIA/gpu-operator
# api/nvidia/v1/clusterpolicy_types.go (v26.7.0); the validator has no switch (isStateEnabled always true).
OPERATOR_DEFAULTS = {
    "driver": True, "toolkit": True, "devicePlugin": True, "gfd": True, "dcgmExporter": True, "dcgm": True,
    "migManager": True, "nodeStatusExporter": False, "validator": True,
}  # fmt: skip


def test_every_operand_has_its_operator_default() -> None:
    assert {o.component: o.default_enabled for o in OPERANDS} == OPERATOR_DEFAULTS


@pytest.mark.parametrize("operand", OPERANDS, ids=lambda o: o.component)
@pytest.mark.parametrize("enabled", [True, False, None], ids=["true", "false", "absent"])
def test_each_operand_with_enabled_set_true_false_and_absent(operand: Operand, enabled: bool | None) -> None:
    wanted = OPERATOR_DEFAULTS[operand.component] if enabled is None else enabled
    if operand.component == "validator":
        wanted = True  # no `enabled` field: whatever the spec says, the operator runs it
    running, absent = ds(2, 2), ds(0, 0, present=False)
    assert component_status(operand, enabled, running, 2, 0) == ("ok" if wanted else "unexpected")
    want_absent = "missing" if wanted else "disabled-as-intended"
    assert component_status(operand, enabled, absent, 2, 0) == want_absent
    view = policy_view(
        PolicyEvent(meta=META, crd="installed", name="cp", components=((operand.component, enabled),),
                    operands=(OperandStatus(operand.daemonset, operand.component, True, 2, 2, 2),)),
        [gpu_node("a"), gpu_node("b")],
    )  # fmt: skip
    got = next(c for c in view.components if c.name == operand.component)
    assert got.status == ("ok" if wanted else "unexpected")
    assert got.intended == ("default" if enabled is None or operand.component == "validator"
                            else "enabled" if enabled else "disabled")  # fmt: skip


def node(name: str, **labels: str) -> NodeEvent:
    return NodeEvent(meta=META, name=name, labels=tuple(sorted(labels.items())))


def gpu_node(name: str, **deploy: str) -> NodeEvent:
    labels = {
        "nvidia.com/gpu.present": "true",
        **{f"nvidia.com/gpu.deploy.{k}": v for k, v in deploy.items()},
    }
    return NodeEvent(meta=META, name=name, labels=tuple(sorted(labels.items())))


def operands(**status: tuple[int, int]) -> tuple[OperandStatus, ...]:
    out = []
    for o in OPERANDS:
        desired, ready = status.get(o.component, (0, 0))
        out.append(OperandStatus(o.daemonset, o.component, o.component in status, desired, ready, ready))
    return tuple(out)


def test_policy_view_end_to_end_json() -> None:
    policy = PolicyEvent(
        meta=META,
        crd="installed",
        name="cluster-policy",
        state="notReady",
        namespace="gpu-operator",
        components=(("dcgmExporter", False), ("devicePlugin", True), ("gfd", None)),
        operands=operands(driver=(2, 2), toolkit=(2, 2), devicePlugin=(2, 1), validator=(2, 2), dcgm=(2, 2)),
        dra_available=True,
    )
    nodes = [
        gpu_node("gpu-a", **{"device-plugin": "true", "gpu-feature-discovery": "true"}),
        gpu_node("gpu-b", **{"device-plugin": "true", "gpu-feature-discovery": "paused-for-driver-upgrade"}),
        node("cpu-1", **{"nvidia.com/gpu.deploy.gpu-feature-discovery": "true"}),  # not a GPU node
    ]
    view = policy_view(policy, nodes)
    got = {
        c["name"]: (c["intended"], c["desired"], c["ready"], c["status"])
        for c in view.to_json()["components"]
    }
    assert got == {
        "driver": ("default", 2, 2, "ok"),
        "toolkit": ("default", 2, 2, "ok"),
        "devicePlugin": ("enabled", 2, 1, "degraded"),
        "gfd": ("default", 0, 0, "missing"),  # wanted on gpu-a, no DaemonSet
        "dcgmExporter": ("disabled", 0, 0, "disabled-as-intended"),
        "dcgm": ("default", 2, 2, "ok"),  # unset: the operator's IsEnabled() says on (only Helm says off)
        "validator": ("default", 2, 2, "ok"),
        "migManager": ("default", 0, 0, "missing"),
        "nodeStatusExporter": ("default", 0, 0, "disabled-as-intended"),
    }
    doc = view.to_json()
    assert doc["cluster_policy"] == {"name": "cluster-policy", "state": "notReady"}
    assert doc["crd"] == "installed" and doc["dra_available"] is True
    gfd = next(c for c in view.components if c.name == "gfd")
    assert (gfd.nodes_on, gfd.nodes_off, gfd.daemonset) == (1, 1, "gpu-feature-discovery")
    assert [c.name for c in view.components] == [o.component for o in OPERANDS]


def test_node_labels_turn_an_operand_off_cluster_wide() -> None:
    policy = PolicyEvent(
        meta=META, crd="installed", name="cp", state="ready", operands=operands(driver=(1, 1))
    )
    nodes = [gpu_node("a", **{"dcgm-exporter": "false"}), gpu_node("b", operands="false")]
    statuses = {c.name: c.status for c in policy_view(policy, nodes).components}
    assert statuses["dcgmExporter"] == "disabled-as-intended"
    deleted = NodeEvent(meta=META, name="c", labels=(("nvidia.com/gpu.present", "true"),), deleted=True)
    assert policy_view(policy, [*nodes, deleted]).components[0].nodes_on == 0


def test_no_policy_yet() -> None:
    view = policy_view(None)
    assert view.to_json()["cluster_policy"] is None and view.to_json()["components"] == []


def test_crd_not_installed_reports_only_what_runs() -> None:
    policy = PolicyEvent(
        meta=META, crd="not-installed", namespace="gpu-operator", operands=operands(devicePlugin=(3, 2))
    )
    view = policy_view(policy)
    assert view.cluster_policy is None and view.crd == "not-installed"
    assert view.components == (
        ComponentStatus(
            "devicePlugin", "default", 3, 2, "degraded", daemonset="nvidia-device-plugin-daemonset"
        ),
    )
    assert view.to_json()["cluster_policy"] is None


def test_crd_installed_without_a_cluster_policy() -> None:
    policy = PolicyEvent(meta=META, crd="installed", operands=operands(driver=(1, 1)))
    view = policy_view(policy)
    assert view.cluster_policy is None
    assert [(c.name, c.status) for c in view.components] == [("driver", "ok")]
