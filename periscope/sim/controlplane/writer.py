"""The simulated cluster's objects written into a real kube-apiserver, through its REST API.

`KubeObjects` answers to the part of `FakeApiServer` the simulator uses (`upsert`, `delete`,
`set_crd_installed`, `write_kubeconfig`, `url`, `start`, `stop`), but every write goes through
Kubernetes' own validation, defaulting and admission, as a kubelet's and a controller's would:

- an object is created without what only the server may set (uid, resourceVersion, timestamps,
  status); its status follows through the `status` subresource, as a kubelet or controller writes it;
- the apiserver assigns the UID: `upsert` returns the stored object, and the simulator adopts its UID
  (the real cluster's UID is the one the kubelet, the cgroups and the truth must carry);
- a pod going away is first deleted with a grace period (deletionTimestamp set, as the kubelet sees
  it), then removed with grace 0, the kubelet's final delete;
- namespaces are created on first use; the ClusterPolicy needs its CRD (clusterpolicy-crd.yaml, the
  fields Periscope reads), installed on first use and removed by `set_crd_installed(False)`.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import yaml

from periscope.sim.controlplane.process import write_kubeconfig

Obj = dict[str, Any]
CRD_NAME = "clusterpolicies.nvidia.com"
_SERVER_FIELDS = (
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "managedFields",
)
_MERGE = {"Content-Type": "application/merge-patch+json"}


@dataclass(frozen=True, slots=True)
class Resource:
    group: str
    version: str
    plural: str
    namespaced: bool

    def path(self, namespace: str | None, name: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced:
            base += f"/namespaces/{namespace or 'default'}"
        return f"{base}/{self.plural}" + (f"/{name}" if name else "")


RESOURCES = {
    "pods": Resource("", "v1", "pods", True),
    "nodes": Resource("", "v1", "nodes", False),
    "namespaces": Resource("", "v1", "namespaces", False),
    "daemonsets": Resource("apps", "v1", "daemonsets", True),
    "clusterpolicies": Resource("nvidia.com", "v1", "clusterpolicies", False),
    "resourceclaims": Resource("resource.k8s.io", "v1", "resourceclaims", True),
    "leases": Resource("coordination.k8s.io", "v1", "leases", True),
    "customresourcedefinitions": Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", False),
}


class WriteError(RuntimeError):
    """The apiserver refused a write; the message carries its Status message."""


def clusterpolicy_crd() -> Obj:
    text = resources.files(__package__).joinpath("clusterpolicy-crd.yaml").read_text()
    doc: Obj = yaml.safe_load(text)
    return doc


def _check(r: httpx.Response, what: str) -> Obj:
    if r.status_code >= 300:
        try:
            message = r.json().get("message") or r.text
        except ValueError:
            message = r.text
        raise WriteError(f"{what}: HTTP {r.status_code}: {message}")
    out: Obj = r.json()
    return out


class KubeObjects:
    """Writes objects into the apiserver at `server` as the holder of `token` (an administrator)."""

    def __init__(self, server: str, ca_file: str, token: str, *, reader_token: str | None = None) -> None:
        self.url = server
        self.ca_file, self.token = ca_file, token
        self.reader_token = reader_token or token  # what write_kubeconfig hands the watcher
        self.http = httpx.Client(
            base_url=server, verify=ca_file, timeout=30.0, headers={"Authorization": f"Bearer {token}"}
        )
        self._namespaces: set[str] = set()
        self._crd = False

    # ------------------------------------------------------------------ FakeApiServer's surface

    def start(self) -> str:
        return self.url

    def stop(self) -> None:
        self.http.close()

    def write_kubeconfig(self, path: str | Path) -> Path:
        """The watcher's kubeconfig: the reader's token, not the writer's."""
        return write_kubeconfig(path, self.url, self.ca_file, self.reader_token)

    def upsert(self, kind: str, obj: Obj) -> Obj:
        """Create or update; returns the object as stored (with the apiserver's UID)."""
        res = RESOURCES[kind]
        meta = obj.get("metadata") or {}
        ns, name = (meta.get("namespace") or "default") if res.namespaced else None, meta["name"]
        if res.namespaced:
            self.ensure_namespace(str(ns))
        if kind == "clusterpolicies":
            self.set_crd_installed(True)
        if kind == "pods" and meta.get("deletionTimestamp"):
            return self._terminating(res, str(ns), name, obj)
        r = self.http.get(res.path(ns, name))
        current = _check(r, f"get {kind} {name}") if r.status_code != 404 else None
        want_uid = meta.get("uid")
        if current is not None and kind == "pods" and want_uid and want_uid != current["metadata"]["uid"]:
            self._remove(res, ns, name)  # a different pod under the same name: the old one is gone
            current = None
        if current is None:
            body = _for_create(obj)
            stored = _check(self.http.post(res.path(ns), json=body), f"create {kind} {name}")
        elif kind == "pods":
            stored = current  # a pod's spec is immutable; only its status moves
        else:
            patch = {
                "metadata": {"labels": meta.get("labels"), "annotations": meta.get("annotations")},
                "spec": obj.get("spec"),
            }
            stored = _check(
                self.http.patch(res.path(ns, name), json=patch, headers=_MERGE), f"update {kind} {name}"
            )
        if "status" in obj:
            stored = _check(
                self.http.patch(
                    res.path(ns, name) + "/status", json={"status": obj["status"]}, headers=_MERGE
                ),
                f"status of {kind} {name}",
            )
        return stored

    def delete(self, kind: str, namespace: str | None, name: str) -> bool:
        res = RESOURCES[kind]
        return self._remove(res, namespace if res.namespaced else None, name)

    def get(self, kind: str, namespace: str | None, name: str) -> Obj | None:
        res = RESOURCES[kind]
        r = self.http.get(res.path(namespace if res.namespaced else None, name))
        return None if r.status_code == 404 else _check(r, f"get {kind} {name}")

    def set_crd_installed(self, installed: bool) -> None:
        crds = RESOURCES["customresourcedefinitions"]
        if installed and not self._crd:
            r = self.http.post(crds.path(None), json=clusterpolicy_crd())
            if r.status_code != 409:
                _check(r, "create the ClusterPolicy CRD")
            self._wait_established()
            self._crd = True
        elif not installed:
            self._remove(crds, None, CRD_NAME)
            self._crd = False

    # ------------------------------------------------------------------ helpers

    def ensure_namespace(self, ns: str) -> None:
        if ns in self._namespaces:
            return
        r = self.http.post(
            RESOURCES["namespaces"].path(None),
            json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        )
        if r.status_code != 409:
            _check(r, f"create namespace {ns}")
        self._namespaces.add(ns)

    def _wait_established(self, timeout_s: float = 30.0) -> None:
        """Until the CRD is Established and its resource is served (discovery lags a little)."""
        crds = RESOURCES["customresourcedefinitions"]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            crd = _check(self.http.get(crds.path(None, CRD_NAME)), "read the ClusterPolicy CRD")
            conditions = (crd.get("status") or {}).get("conditions") or []
            established = any(
                c.get("type") == "Established" and c.get("status") == "True" for c in conditions
            )
            if established and self.http.get(RESOURCES["clusterpolicies"].path(None)).status_code == 200:
                return
            time.sleep(0.1)
        raise WriteError(f"the ClusterPolicy CRD was not served within {timeout_s:g}s")

    def _terminating(self, res: Resource, ns: str, name: str, obj: Obj) -> Obj:
        """The kubelet's view of a pod going away: its status, then a graceful delete (the apiserver
        stamps deletionTimestamp); the removal itself is `delete`."""
        path = res.path(ns, name)
        if "status" in obj:
            r = self.http.patch(path + "/status", json={"status": obj["status"]}, headers=_MERGE)
            if r.status_code == 404:
                return obj
            _check(r, f"status of pods {name}")
        grace = int((obj.get("metadata") or {}).get("deletionGracePeriodSeconds") or 30) or 30
        r = self.http.request(
            "DELETE", path, json={"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": grace}
        )
        return obj if r.status_code == 404 else _check(r, f"delete pods {name}")

    def _remove(self, res: Resource, ns: str | None, name: str) -> bool:
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0}
        r = self.http.request("DELETE", res.path(ns, name), json=body)
        if r.status_code == 404:
            return False
        _check(r, f"delete {res.plural} {name}")
        return True


def _for_create(obj: Obj) -> Obj:
    body = copy.deepcopy(obj)
    body.pop("status", None)
    meta = body.setdefault("metadata", {})
    for key in _SERVER_FIELDS:
        meta.pop(key, None)
    return body
