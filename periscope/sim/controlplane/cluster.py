"""A control plane prepared for `periscope up --apiserver kube`: identities, RBAC and users.

The watcher and the API run as their deploy/ ServiceAccounts would: each gets a static token whose
username and groups are that ServiceAccount's, and the RBAC objects of deploy/base are applied as they
are, so the services can do exactly what the manifests grant them. The scenario's `users:` become
static tokens too, bound with the example roles of deploy/base/api-rbac.yaml: a RoleBinding to
`periscope-namespace-viewer` in each of a user's namespaces, a ClusterRoleBinding to
`periscope-cluster-viewer` for a `cluster: true` user. The API's access control is then decided by
Kubernetes' own TokenReview and RBAC.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from periscope.sim.apiserver.reviews import user_uid
from periscope.sim.controlplane.apply import apply_documents
from periscope.sim.controlplane.build import SOURCE, ControlPlaneUnavailable
from periscope.sim.controlplane.process import ControlPlane, TokenUser, service_account_user
from periscope.sim.scenario.document import UserSpec

Obj = dict[str, Any]
DEPLOY_BASE = SOURCE.parents[1] / "deploy" / "base"
NAMESPACE = "periscope"
WATCHER_SA, API_SA = "periscope-kube-watcher", "periscope-api"
RBAC_KINDS = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def scenario_tokens(users: Iterable[UserSpec]) -> list[TokenUser]:
    return [TokenUser(u.token, u.name, uid=user_uid(u.name)) for u in users]


def user_bindings(users: Iterable[UserSpec]) -> list[Obj]:
    """Each user's namespaces and the bindings that let it read what the fake apiserver lets it read."""
    out: list[Obj] = []
    for u in users:
        subject = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": u.name}]
        if u.cluster:
            out.append(
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": f"periscope-user-{u.name}"},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": "periscope-cluster-viewer",
                    },
                    "subjects": subject,
                }
            )
            continue
        for ns in u.namespaces:
            out.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
            out.append(
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "RoleBinding",
                    "metadata": {"name": f"periscope-user-{u.name}", "namespace": ns},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": "periscope-namespace-viewer",
                    },
                    "subjects": subject,
                }
            )
    return out


def deploy_rbac(base: Path = DEPLOY_BASE) -> list[Obj]:
    """The namespaces, ServiceAccounts and RBAC objects of deploy/base, as written there, after the
    namespaces they use but do not make (the GPU Operator's, which a cluster has before Periscope)."""
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    docs = [
        d
        for entry in kustomization.get("resources", [])
        for d in yaml.safe_load_all((base / entry).read_text())
        if d
    ]
    rbac = [d for d in docs if d.get("kind") in RBAC_KINDS]
    made = {d["metadata"]["name"] for d in rbac if d["kind"] == "Namespace"}
    used = sorted({d["metadata"]["namespace"] for d in rbac if d["metadata"].get("namespace")} - made)
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}} for ns in used] + rbac


def apply_all(plane: ControlPlane, documents: Sequence[Obj]) -> None:
    with plane.http() as client:
        for doc, r in zip(documents, apply_documents(client, documents), strict=True):
            if r.status_code >= 300:
                name = f"{doc['kind']} {doc['metadata'].get('namespace', '')}/{doc['metadata']['name']}"
                raise ControlPlaneUnavailable(f"applying {name} failed: HTTP {r.status_code} {r.text[:200]}")


@dataclass
class KubeCluster:
    plane: ControlPlane
    watcher: TokenUser
    api: TokenUser

    def sim_config(self) -> dict[str, str]:
        """What the simulator process needs to write the cluster and hand out kubeconfigs."""
        return {
            "server": self.plane.server,
            "ca": self.plane.ca_file,
            "admin_token": self.plane.admin.token,
            "watcher_token": self.watcher.token,
            "api_token": self.api.token,
        }

    def stop(self) -> None:
        self.plane.stop()


def start_for_scenario(users: Sequence[UserSpec], say: Callable[[str], None] | None = None) -> KubeCluster:
    watcher = service_account_user(NAMESPACE, WATCHER_SA)
    api = service_account_user(NAMESPACE, API_SA)
    plane = ControlPlane(users=[watcher, api, *scenario_tokens(users)], say=say).start()
    try:
        apply_all(plane, [*deploy_rbac(), *user_bindings(users)])
    except BaseException:
        plane.stop()
        raise
    return KubeCluster(plane, watcher, api)
