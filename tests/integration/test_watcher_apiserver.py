"""The fake apiserver speaks the apiserver's list/watch protocol over real HTTP (checked here with
httpx, independently of the kubernetes client the watcher uses)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from periscope.sim.apiserver import FakeApiServer


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer(bookmark_interval_s=0.2) as s:
        yield s


def pod(name: str, uid: str | None = None, ns: str = "ml") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns}
    if uid:
        meta["uid"] = uid
    return {"metadata": meta, "spec": {"nodeName": "gpu-a"}}


def watch(server: FakeApiServer, path: str, stop_after: int, **params: str) -> list[dict[str, Any]]:
    """Read up to `stop_after` events from a chunked watch stream (one JSON object per line)."""
    events: list[dict[str, Any]] = []
    query = {"watch": "true", "timeoutSeconds": "5", **params}
    with httpx.stream("GET", server.url + path, params=query, timeout=10) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("application/json")
        assert resp.headers.get("transfer-encoding") == "chunked"
        for line in resp.iter_lines():
            if line:
                events.append(json.loads(line))
            if len(events) >= stop_after:
                break
    return events


def test_discovery_and_version(server: FakeApiServer) -> None:
    api = httpx.get(server.url + "/api").json()
    assert api["kind"] == "APIVersions" and api["versions"] == ["v1"]
    groups = {g["name"] for g in httpx.get(server.url + "/apis").json()["groups"]}
    assert {"apps", "nvidia.com", "resource.k8s.io", "coordination.k8s.io"} <= groups
    res = httpx.get(server.url + "/apis/nvidia.com/v1").json()
    assert res["resources"][0]["name"] == "clusterpolicies" and res["resources"][0]["namespaced"] is False
    assert httpx.get(server.url + "/version").json()["gitVersion"].startswith("v1.")
    server.set_crd_installed(False)
    server.set_dra_installed(False)
    groups = {g["name"] for g in httpx.get(server.url + "/apis").json()["groups"]}
    assert "nvidia.com" not in groups and "resource.k8s.io" not in groups
    gone = httpx.get(server.url + "/apis/nvidia.com/v1/clusterpolicies")
    assert gone.status_code == 404 and gone.json()["reason"] == "NotFound"
    with pytest.raises(ValueError, match="not served"):
        server.upsert("clusterpolicies", {"metadata": {"name": "cp"}})


def test_list_is_scoped_and_versioned(server: FakeApiServer) -> None:
    server.upsert("pods", pod("a"))
    server.upsert("pods", pod("b", ns="other"))
    server.upsert("daemonsets", {"metadata": {"name": "nvidia-dcgm-exporter", "namespace": "gpu-operator"}})
    everything = httpx.get(server.url + "/api/v1/pods").json()
    assert everything["kind"] == "PodList" and len(everything["items"]) == 2
    assert everything["metadata"]["resourceVersion"] == str(server.resource_version)
    scoped = httpx.get(server.url + "/api/v1/namespaces/other/pods").json()
    assert [p["metadata"]["name"] for p in scoped["items"]] == ["b"]
    dss = httpx.get(server.url + "/apis/apps/v1/namespaces/gpu-operator/daemonsets").json()["items"]
    assert dss[0]["metadata"]["name"] == "nvidia-dcgm-exporter" and dss[0]["metadata"]["uid"]
    assert httpx.get(server.url + "/api/v1/namespaces/ml/pods/a").json()["metadata"]["name"] == "a"
    assert httpx.get(server.url + "/api/v1/namespaces/ml/pods/zz").status_code == 404


def test_watch_replays_from_a_version_and_sends_bookmarks(server: FakeApiServer) -> None:
    first = server.upsert("pods", pod("a", "uid-1"))
    since = first["metadata"]["resourceVersion"]
    server.upsert("nodes", {"metadata": {"name": "gpu-a"}})  # another kind: not in the pod stream
    server.upsert("pods", pod("a", "uid-2"))  # recreated under the same name
    # As the real watch cache, a bookmark only carries the client past changes it does not see: here
    # a node changed after the last pod event.
    threading.Timer(0.3, lambda: server.upsert("nodes", {"metadata": {"name": "gpu-b"}})).start()
    events = watch(server, "/api/v1/pods", 3, resourceVersion=since, allowWatchBookmarks="true")
    assert [(e["type"], e["object"]["metadata"]["uid"]) for e in events[:2]] == [
        ("DELETED", "uid-1"),
        ("ADDED", "uid-2"),
    ]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and events[2]["type"] == "BOOKMARK"
    assert events[2]["object"]["metadata"]["resourceVersion"] == str(server.resource_version)
    assert int(events[2]["object"]["metadata"]["resourceVersion"]) > versions[1]


def test_watch_without_version_starts_with_the_current_state(server: FakeApiServer) -> None:
    server.upsert("pods", pod("a"))
    threading.Timer(0.3, lambda: server.delete("pods", "ml", "a")).start()
    events = watch(server, "/api/v1/pods", 3)
    # A pod is deleted as on the real apiserver: stamped for deletion (MODIFIED), then removed.
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert events[1]["object"]["metadata"]["deletionTimestamp"]


def test_expired_version_is_410(server: FakeApiServer) -> None:
    rv = server.upsert("pods", pod("a"))["metadata"]["resourceVersion"]
    server.compact()
    [event] = watch(server, "/api/v1/pods", 1, resourceVersion=rv)
    assert event["type"] == "ERROR" and event["object"]["code"] == 410
    server.gone_as_http = True
    resp = httpx.get(server.url + "/api/v1/pods", params={"watch": "1", "resourceVersion": rv})
    assert resp.status_code == 410 and resp.json()["code"] == 410
    # The version a fresh list returns is watchable again.
    fresh = httpx.get(server.url + "/api/v1/pods").json()["metadata"]["resourceVersion"]
    threading.Timer(0.2, lambda: server.upsert("pods", pod("b"))).start()
    assert watch(server, "/api/v1/pods", 1, resourceVersion=fresh)[0]["type"] == "ADDED"


def test_compaction_ends_open_watches_with_410(server: FakeApiServer) -> None:
    threading.Timer(0.3, server.compact).start()
    events = watch(server, "/api/v1/nodes", 1, resourceVersion=str(server.resource_version))
    assert events[0]["type"] == "ERROR" and events[0]["object"]["code"] == 410


def test_restart_on_the_same_port_keeps_or_drops_state(server: FakeApiServer) -> None:
    server.upsert("pods", pod("a"))
    url = server.url
    server.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/api/v1/pods")
    server.upsert("pods", pod("b"))  # mutations while down are kept
    assert server.start() == url
    assert len(httpx.get(url + "/api/v1/pods").json()["items"]) == 2
    rv = str(server.resource_version)
    assert server.restart(keep_state=False) == url
    assert httpx.get(url + "/api/v1/pods").json()["items"] == []
    [event] = watch(server, "/api/v1/pods", 1, resourceVersion=rv)
    assert event["object"]["code"] == 410  # a wiped store invalidates every version


def test_create_replace_conflict_and_delete(server: FakeApiServer) -> None:
    base = server.url + "/apis/coordination.k8s.io/v1/namespaces/default/leases"
    lease = {"metadata": {"name": "lock"}, "spec": {"holderIdentity": "a"}}
    created = httpx.post(base, json=lease)
    assert created.status_code == 201
    assert httpx.post(base, json=lease).status_code == 409
    body = created.json()
    body["spec"]["holderIdentity"] = "b"
    assert httpx.put(f"{base}/lock", json=body).status_code == 200
    stale = httpx.put(f"{base}/lock", json=body)  # same resourceVersion again: lost the race
    assert stale.status_code == 409 and stale.json()["reason"] == "Conflict"
    assert httpx.delete(f"{base}/lock").status_code == 200
    assert httpx.get(f"{base}/lock").status_code == 404


def test_kubeconfig_points_at_the_server(server: FakeApiServer, tmp_path: Any) -> None:
    cfg = yaml.safe_load(server.write_kubeconfig(tmp_path / "kc").read_text())
    assert cfg["clusters"][0]["cluster"]["server"] == server.url
    assert cfg["current-context"] == cfg["contexts"][0]["name"]
    assert server.url.startswith("http://127.0.0.1:")


def test_crd_removal_deletes_policies_and_closes_watches(server: FakeApiServer) -> None:
    server.upsert("clusterpolicies", {"metadata": {"name": "cluster-policy"}})
    rv = str(server.resource_version)
    threading.Timer(0.3, lambda: server.set_crd_installed(False)).start()
    start = time.monotonic()
    events = watch(server, "/apis/nvidia.com/v1/clusterpolicies", 10, resourceVersion=rv)
    assert [e["type"] for e in events] == ["DELETED"] and time.monotonic() - start < 4
    assert server.objects("clusterpolicies") == []
