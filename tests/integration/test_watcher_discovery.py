"""The watcher finds the resource.k8s.io version a cluster serves ResourceClaims in (v1 on 1.34+,
v1beta2 on 1.33, v1beta1 on 1.32) by API discovery, here against the fake apiserver serving each set of
versions; tests/controlplane checks the same against Kubernetes' own apiserver."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from periscope.sim.apiserver import FakeApiServer
from services.kube_watcher.discovery import dra_claims


@pytest.mark.parametrize(
    ("served", "picked"),
    [(("v1", "v1beta2", "v1beta1"), "v1"), (("v1beta2", "v1beta1"), "v1beta2"), (("v1beta1",), "v1beta1")],
)
def test_the_newest_served_version_is_read(served: tuple[str, ...], picked: str, tmp_path: Path) -> None:
    with FakeApiServer(dra_versions=served) as server:
        server.upsert("resourceclaims", {"metadata": {"name": "c", "namespace": "ml"}})
        client = k8s_config.new_client_from_config(str(server.write_kubeconfig(tmp_path / "kc")))
        claims = dra_claims(client)
        resp = claims(limit=10, _preload_content=False)
        assert claims.version == picked and claims.group_version == f"resource.k8s.io/{picked}"
        assert b'"apiVersion": "resource.k8s.io/' + picked.encode() in resp.data


def test_no_served_version_is_404_and_no_version(tmp_path: Path) -> None:
    with FakeApiServer(dra_installed=False) as server:
        client = k8s_config.new_client_from_config(str(server.write_kubeconfig(tmp_path / "kc")))
        claims = dra_claims(client)
        with pytest.raises(ApiException) as err:
            claims(limit=10)
        assert err.value.status == 404 and "v1, v1beta2, v1beta1" in str(err.value.reason)
        assert claims.version == "" and claims.group_version == ""
