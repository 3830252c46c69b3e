"""The fake apiserver's discovery documents: `/version`, `/api`, `/apis`, `/apis/<group>` and each group
version's APIResourceList, listing only what is served (a CRD not installed, DRA off: absent).

DRA's resource.k8s.io can be served in several versions (newest first: v1 on 1.34+, v1beta2 on 1.33,
v1beta1 on 1.32), as `--runtime-config` chooses on a real apiserver; every other group serves v1.
"""

from __future__ import annotations

from collections.abc import Callable

from periscope.sim.apiserver.store import KINDS, Kind, Obj

VERSION = {
    "major": "1",
    "minor": "34",
    "gitVersion": "v1.34.1",
    "gitCommit": "sim",
    "gitTreeState": "clean",
    "buildDate": "2025-09-09T00:00:00Z",
    "goVersion": "go1.24.6",
    "compiler": "gc",
    "platform": "linux/amd64",
}
DRA_GROUP = "resource.k8s.io"
_VERBS = ["create", "delete", "get", "list", "update", "watch"]


def group_document(group: str, versions: tuple[str, ...] = ("v1",)) -> Obj:
    """One API group as `/apis` and `/apis/<group>` list it (the first version preferred)."""
    gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": gvs, "preferredVersion": gvs[0]}


def as_version(api_version: str, obj: Obj) -> Obj:
    """The object as served in `api_version` (DRA claims keep one stored shape across versions: the
    status the watcher reads is the same in v1, v1beta2 and v1beta1)."""
    return obj if obj.get("apiVersion") == api_version else {**obj, "apiVersion": api_version}


def list_item(kind: Kind, obj: Obj) -> Obj:
    """A list item: built-in kinds come without kind/apiVersion (the list names them once); custom
    resources, served as unstructured objects, keep both."""
    if kind.group == "nvidia.com":
        return obj
    return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}


class Discovery:
    def __init__(self, served: Callable[[Kind], bool], dra_versions: tuple[str, ...]) -> None:
        self.served, self.dra_versions = served, dra_versions

    def versions(self, group: str) -> tuple[str, ...]:
        return self.dra_versions if group == DRA_GROUP else ("v1",)

    def kinds(self, group: str, version: str) -> list[Kind]:
        """The served kinds of one group version."""
        return [k for k in KINDS if k.group == group and self.served(k) and version in self.versions(group)]

    def document(self, parts: tuple[str, ...], address: str) -> Obj | None:
        """The discovery document at this path, or None when the path is not one."""
        groups = sorted({k.group for k in KINDS if k.group and self.served(k)})
        if parts == ("version",):
            return VERSION
        if parts == ("api",):
            cidrs = [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}]
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": cidrs}
        if parts == ("apis",):
            return {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [group_document(g, self.versions(g)) for g in groups],
            }
        if len(parts) == 2 and parts[0] == "apis" and parts[1] in groups:
            return {
                "kind": "APIGroup",
                "apiVersion": "v1",
                **group_document(parts[1], self.versions(parts[1])),
            }
        return None

    @staticmethod
    def resource_list(group: str, version: str, kinds: list[Kind]) -> Obj:
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": [
                {
                    "name": k.plural,
                    "singularName": k.kind.lower(),
                    "namespaced": k.namespaced,
                    "kind": k.kind,
                    "verbs": _VERBS,
                }
                for k in kinds
            ],
        }
