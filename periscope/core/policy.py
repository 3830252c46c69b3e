"""Operator intent versus reconciled state: the `GET /v1/policy` view of the GPU Operator.

A ClusterPolicy says, per component, enabled / disabled / unset; unset means what the operator itself
makes of it, each component's `IsEnabled()` in its API types (api/nvidia/v1/clusterpolicy_types.go: nil
is true for the driver, toolkit, device plugin, GFD, DCGM exporter, DCGM and MIG manager, false for the
node status exporter), not the Helm chart's values (which set dcgm.enabled: false explicitly). The
validator has no switch: the operator always runs it (isStateEnabled "state-operator-validation").
Each component is reconciled as an operand DaemonSet in the operator namespace, scheduled on the nodes
whose `nvidia.com/gpu.deploy.<operand>` label is "true". Absence is only a problem when it was not
intended: a component disabled in the policy, or labelled off on every GPU node, is
"disabled-as-intended", not "missing".

GPU Operator v26.7 adds the DRA stack's `GPUCluster` (gpuclusters.nvidia.com/v1alpha1, a singleton named
gpu-cluster; a cluster runs it or a ClusterPolicy, never both: its controller refuses while a ClusterPolicy
exists). Its operands are the DRA driver's kubelet plugin and validator (always deployed), DCGM (off
unless `dcgm.enabled` is true: the controller does not use DCGMSpec.IsEnabled()) and the DCGM exporter
(on when `dcgmExporter` is there and its `enabled` is not false; absent means off).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from periscope.core.model import NodeEvent, OperandStatus, PolicyEvent

GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
DEPLOY_LABEL_PREFIX = "nvidia.com/gpu.deploy."
ALL_OPERANDS_LABEL = "nvidia.com/gpu.deploy.operands"


@dataclass(frozen=True, slots=True)
class Operand:
    component: str  # ClusterPolicy spec key
    daemonset: str  # DaemonSet name in the operator namespace (also its `app` label)
    deploy_label: str  # suffix of nvidia.com/gpu.deploy.<...>, the DaemonSet's nodeSelector
    default_enabled: bool  # what the operator makes of an unset `enabled` (its IsEnabled() on nil)
    switch: bool = True  # the spec has an `enabled` field for it; without one it always runs
    absent: bool | None = None  # what a spec without the component's key at all means (None: the default)

    def wanted(self, enabled: bool | None, listed: bool = True) -> bool:
        """Whether the operator deploys it, given the spec's `enabled` (None: unset) and whether the
        spec has the component's key at all."""
        if not self.switch:
            return self.default_enabled
        if not listed and self.absent is not None:
            return self.absent
        return self.default_enabled if enabled is None else enabled


OPERANDS: tuple[Operand, ...] = (
    Operand("driver", "nvidia-driver-daemonset", "driver", True),
    Operand("toolkit", "nvidia-container-toolkit-daemonset", "container-toolkit", True),
    Operand("devicePlugin", "nvidia-device-plugin-daemonset", "device-plugin", True),
    Operand("gfd", "gpu-feature-discovery", "gpu-feature-discovery", True),
    Operand("dcgmExporter", "nvidia-dcgm-exporter", "dcgm-exporter", True),
    # nil means enabled: only the Helm chart turns it off (the exporter then embeds a hostengine)
    Operand("dcgm", "nvidia-dcgm", "dcgm", True),
    Operand("validator", "nvidia-operator-validator", "operator-validator", True, switch=False),
    Operand("migManager", "nvidia-mig-manager", "mig-manager", True),
    Operand("nodeStatusExporter", "nvidia-node-status-exporter", "node-status-exporter", False),
)
# The GPUCluster's (v26.7.0 internal/state: dra_driver.go, dra_validation.go, dcgm.go, dcgm_exporter.go;
# deploy labels from controllers/state_manager.go).
GPUCLUSTER_OPERANDS: tuple[Operand, ...] = (
    Operand("draDriver", "nvidia-dra-driver-kubelet-plugin", "dra-driver", True, switch=False),
    Operand("dcgm", "nvidia-dcgm-dra", "dcgm-dra", False),
    Operand("dcgmExporter", "nvidia-dcgm-exporter-dra", "dcgm-exporter-dra", True, absent=False),
    Operand("validator", "nvidia-dra-validator", "dra-validator", True, switch=False),
)
GPUCLUSTER = "GPUCluster"
CLUSTER_POLICY = "ClusterPolicy"
# DaemonSets that belong to a component without being its primary operand.
SECONDARY_DAEMONSETS: dict[str, str] = {"nvidia-device-plugin-mps-control-daemon": "devicePlugin"}
DAEMONSET_COMPONENT: dict[str, str] = {
    **{o.daemonset: o.component for o in (*OPERANDS, *GPUCLUSTER_OPERANDS)},
    **SECONDARY_DAEMONSETS,
}


def operands_of(kind: str) -> tuple[Operand, ...]:
    """The operand table of the CR kind in force (ClusterPolicy's when none)."""
    return GPUCLUSTER_OPERANDS if kind == GPUCLUSTER else OPERANDS

INTENDED = ("enabled", "disabled", "default")
STATUSES = ("ok", "degraded", "disabled-as-intended", "missing", "unexpected")


@dataclass(frozen=True, slots=True)
class ComponentStatus:
    name: str  # ClusterPolicy spec key
    intended: str  # enabled | disabled | default
    desired: int
    ready: int
    status: str  # ok | degraded | disabled-as-intended | missing | unexpected
    daemonset: str = ""
    nodes_on: int = 0  # GPU nodes labelled gpu.deploy.<operand>=true
    nodes_off: int = 0  # GPU nodes where the operand is labelled off

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "intended": self.intended,
            "desired": self.desired,
            "ready": self.ready,
            "status": self.status,
            "daemonset": self.daemonset,
            "nodes_on": self.nodes_on,
            "nodes_off": self.nodes_off,
        }


@dataclass(frozen=True, slots=True)
class PolicyView:
    cluster_policy: tuple[str, str] | None  # (name, status.state)
    components: tuple[ComponentStatus, ...] = ()
    crd: str = ""  # installed | not-installed | error | "" (nothing observed yet)
    namespace: str = ""
    dra_available: bool = False
    detail: str = ""
    gpu_cluster: tuple[str, str] | None = None  # (name, status.state) of the GPUCluster in force
    gpu_cluster_crd: str = ""  # the GPUCluster CRD: installed | not-installed | error | ""

    def to_json(self) -> dict[str, Any]:
        def cr(named: tuple[str, str] | None) -> dict[str, str] | None:
            return None if named is None else {"name": named[0], "state": named[1]}

        return {
            "cluster_policy": cr(self.cluster_policy),
            "gpu_cluster": cr(self.gpu_cluster),
            "components": [c.to_json() for c in self.components],
            "crd": self.crd or None,
            "gpu_cluster_crd": self.gpu_cluster_crd or None,
            "namespace": self.namespace,
            "dra_available": self.dra_available,
            "detail": self.detail,
        }


def _node_counts(operand: Operand, nodes: Iterable[NodeEvent]) -> tuple[int, int]:
    """(GPU nodes that want the operand, GPU nodes where it is labelled off)."""
    on = off = 0
    for node in nodes:
        if node.deleted or node.label(GPU_PRESENT_LABEL) != "true":
            continue
        value = node.label(DEPLOY_LABEL_PREFIX + operand.deploy_label)
        # "false", "paused-for-driver-upgrade", ... keep the operand off; so does deploy.operands=false.
        if node.label(ALL_OPERANDS_LABEL) == "false" or (value and value != "true"):
            off += 1
        elif value == "true":
            on += 1
    return on, off


def component_status(
    operand: Operand, enabled: bool | None, ds: OperandStatus | None, nodes_on: int, nodes_off: int,
    listed: bool = True,
) -> str:
    """The decision table of one component (pure; every row is tested). `listed`: the spec has the
    component's key at all."""
    present = ds is not None and ds.present
    desired = ds.desired if ds is not None else 0
    ready = ds.ready if ds is not None else 0
    wanted = operand.wanted(enabled, listed)
    off_everywhere = nodes_off > 0 and nodes_on == 0
    if not wanted or off_everywhere:
        return "unexpected" if present and (desired > 0 or ready > 0) else "disabled-as-intended"
    if not present:
        return "missing"
    if ready < desired or desired < nodes_on:
        return "degraded"
    return "ok"


def _intended(operand: Operand, enabled: bool | None) -> str:
    if enabled is None or not operand.switch:
        return "default"
    return "enabled" if enabled else "disabled"


def policy_view(policy: PolicyEvent | None, nodes: Iterable[NodeEvent] = ()) -> PolicyView:
    """Compare the intent of the ClusterPolicy or GPUCluster in force with the operand DaemonSets and
    the nodes' deploy labels."""
    if policy is None:
        return PolicyView(cluster_policy=None)
    node_list = list(nodes)
    operands = {o.name: o for o in policy.operands}
    gpu_cluster = policy.kind == GPUCLUSTER
    served = policy.gpu_cluster_crd if gpu_cluster else policy.crd
    has_policy = served == "installed" and bool(policy.name)
    spec = dict(policy.components)
    components: list[ComponentStatus] = []
    # Without intent, whatever of either table runs; with it, the table of the kind in force.
    table = operands_of(policy.kind) if has_policy else (*OPERANDS, *GPUCLUSTER_OPERANDS)
    for operand in table:
        ds = operands.get(operand.daemonset)
        if not has_policy and (ds is None or not ds.present):
            continue  # no operator intent to compare with: only report what actually runs
        enabled = spec.get(operand.component) if has_policy else None
        on, off = _node_counts(operand, node_list)
        if has_policy:
            status = component_status(operand, enabled, ds, on, off, operand.component in spec)
        else:  # no intent to compare with: only readiness
            status = "degraded" if ds is not None and ds.ready < ds.desired else "ok"
        components.append(
            ComponentStatus(
                name=operand.component,
                intended=_intended(operand, enabled),
                desired=ds.desired if ds else 0,
                ready=ds.ready if ds else 0,
                status=status,
                daemonset=operand.daemonset,
                nodes_on=on,
                nodes_off=off,
            )
        )
    named = (policy.name, policy.state) if has_policy else None
    return PolicyView(
        cluster_policy=None if gpu_cluster else named,
        components=tuple(components),
        crd=policy.crd,
        namespace=policy.namespace,
        dra_available=policy.dra_available,
        detail=policy.detail,
        gpu_cluster=named if gpu_cluster else None,
        gpu_cluster_crd=policy.gpu_cluster_crd,
    )
