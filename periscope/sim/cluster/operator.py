"""The NVIDIA GPU operator's operands in the simulated cluster: which DaemonSets the ClusterPolicy asks
for, which exist, and what `/v1/policy` should say about each.
"""

from __future__ import annotations

from dataclasses import dataclass

from periscope.core.policy import OPERANDS
from periscope.sim.cluster.hardware import mig_capable
from periscope.sim.scenario import ComponentSpec, Scenario


@dataclass(frozen=True, slots=True)
class Operand:
    component: str  # ClusterPolicy spec key
    daemonset: str
    deploy_label: str  # nvidia.com/gpu.deploy.<this>=true selects its nodes
    present: bool  # whether the DaemonSet exists
    desired: int
    ready: int
    # what /v1/policy should say: ok | degraded | disabled-as-intended | missing | unexpected
    expected_status: str


def deploy_nodes(s: Scenario, component: str) -> list[str]:
    """GPU nodes the operator labels for an operand (mig-manager only where MIG is possible)."""
    if component == "migManager":
        return [n.name for n in s.nodes if any(mig_capable(g.model) for g in n.gpus)]
    return [n.name for n in s.nodes]


def operands(s: Scenario) -> list[Operand]:
    """The operand DaemonSets the simulated operator reconciled, each with the /v1/policy status it
    deserves (an independent statement of the rules: wanted+ready = ok, wanted+short = degraded,
    wanted+absent = missing, unwanted+absent = disabled-as-intended, unwanted+running = unexpected)."""
    if s.policy is None:
        return []
    spec: dict[str, ComponentSpec] = {str(k): v for k, v in s.policy.components.items()}
    out: list[Operand] = []
    for op in OPERANDS:
        c = spec.get(op.component) or ComponentSpec()  # every field None: the spec is silent
        wanted = op.default_enabled if c.enabled is None else c.enabled
        present = wanted if c.present is None else c.present
        nodes = len(deploy_nodes(s, op.component))
        desired = (nodes if present else 0) if c.desired is None else c.desired
        ready = desired if c.ready is None else c.ready
        if not present:
            desired = ready = 0
            status = "missing" if wanted else "disabled-as-intended"
        elif not wanted:
            status = "unexpected"
        else:
            status = "ok" if ready >= desired >= nodes else "degraded"
        out.append(Operand(op.component, op.daemonset, op.deploy_label, present, desired, ready, status))
    return out
