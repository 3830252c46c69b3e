"""Which version of an API group the apiserver serves a resource in, found by API discovery.

DRA's ResourceClaims are served as `resource.k8s.io/v1` from Kubernetes 1.34, `v1beta2` on 1.33 and
`v1beta1` on 1.32 (and a 1.34+ cluster may have v1 switched off with `--runtime-config`). The claim
status the watcher reads (`status.allocation.devices.results[]`) has the same shape in all three, so
the watcher reads the newest version served. `ServedVersion` is a list function for `ResourceWatch`:
it asks discovery on every list (the first and each relist after an error or a 410), never on a
watch, so a watch goes on in the version its list used and an upgrade is followed at the next relist.
When no version serves the resource it answers as the apiserver does for an unknown resource: 404.
"""

from __future__ import annotations

import logging
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)

DRA_GROUP = "resource.k8s.io"
DRA_VERSIONS = ("v1", "v1beta2", "v1beta1")  # newest first


class ServedVersion:
    def __init__(self, client: k8s.ApiClient, group: str, plural: str, versions: tuple[str, ...]) -> None:
        self.group, self.plural, self.versions = group, plural, versions
        self._apis = k8s.ApisApi(client)
        self._custom = k8s.CustomObjectsApi(client)
        self.version = ""  # in use; "" until discovered, or when none is served

    def discover(self) -> str:
        """The newest of `versions` whose resource list has `plural`; "" when none has."""
        groups = self._apis.get_api_versions(_request_timeout=(5, 30)).groups or []
        group = next((g for g in groups if g.name == self.group), None)
        served = {v.version for v in (group.versions if group is not None else None) or []}
        for version in (v for v in self.versions if v in served):
            try:
                listing = self._custom.get_api_resources(self.group, version, _request_timeout=(5, 30))
            except ApiException as exc:
                if exc.status == 404:  # dropped between the two calls
                    continue
                raise
            if any(r.name == self.plural for r in listing.resources or ()):
                return version
        return ""

    def __call__(self, **kwargs: Any) -> Any:
        if not kwargs.get("watch") or not self.version:
            found = self.discover()
            if found != self.version:
                log.info("%s.%s: reading version %s", self.plural, self.group, found or "(none served)")
            self.version = found
        if not self.version:
            raise ApiException(
                status=404,
                reason=f"{self.plural}.{self.group} is not served in any of {', '.join(self.versions)}",
            )
        return self._custom.list_cluster_custom_object(self.group, self.version, self.plural, **kwargs)

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.version else ""


def dra_claims(client: k8s.ApiClient) -> ServedVersion:
    return ServedVersion(client, DRA_GROUP, "resourceclaims", DRA_VERSIONS)
