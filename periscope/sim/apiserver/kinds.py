"""The resource kinds the fake apiserver serves, and the fixed documents that describe its API.

A `Kind` names one resource the way the apiserver's discovery does (plural, kind, group, version and
whether it is namespaced); `KINDS` is the whole catalogue, from core pods and nodes to the GPU
Operator's ClusterPolicy CRD, DRA resourceclaims and coordination leases, and `BY_NAME` finds one by
plural, kind or lower-case kind. Alongside them sit the documents that never depend on stored objects:
the `/version` answer, the discovery bodies for an API group and a group version's resource list, and
the `Status` body every error (and every watch ERROR event) carries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Kind:
    plural: str
    kind: str
    group: str
    version: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


KINDS: tuple[Kind, ...] = (
    Kind("pods", "Pod", "", "v1", True),
    Kind("nodes", "Node", "", "v1", False),
    Kind("daemonsets", "DaemonSet", "apps", "v1", True),
    Kind("clusterpolicies", "ClusterPolicy", "nvidia.com", "v1", False),
    Kind("resourceclaims", "ResourceClaim", "resource.k8s.io", "v1", True),
    Kind("leases", "Lease", "coordination.k8s.io", "v1", True),
)
BY_NAME = {n.lower(): k for k in KINDS for n in (k.plural, k.kind, k.kind.lower())}
VERSION = {"major": "1", "minor": "34", "gitVersion": "v1.34.1", "gitCommit": "sim", "gitTreeState": "clean",
           "buildDate": "2025-09-09T00:00:00Z", "goVersion": "go1.24.6", "compiler": "gc",
           "platform": "linux/amd64"}


def status(code: int, reason: str, message: str) -> Obj:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


def group_document(group: str) -> Obj:
    """One API group as `/apis` and `/apis/<group>` list it (a single preferred version, v1)."""
    gv = {"groupVersion": f"{group}/v1", "version": "v1"}
    return {"name": group, "versions": [gv], "preferredVersion": gv}


def resource_list(group: str, version: str, kinds: list[Kind]) -> Obj:
    """The APIResourceList of one group version, as `/api/v1` or `/apis/<group>/<version>` return it."""
    verbs = ["create", "delete", "get", "list", "update", "watch"]
    return {"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": [{"name": k.plural, "singularName": k.kind.lower(), "namespaced": k.namespaced,
                           "kind": k.kind, "verbs": verbs} for k in kinds]}
