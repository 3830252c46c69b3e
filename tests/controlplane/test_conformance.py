"""One conformance suite, two apiservers: the simulated one (periscope/sim/apiserver) and Kubernetes'
own kube-apiserver. Each case is what the watcher or the API's access control relies on: list, chunked
list, watch and resume, bookmarks, 410 Expired after compaction (in a watch and for a continue token),
TokenReview and SubjectAccessReview, and the watcher's own ResourceWatch on top of them. Where the two
differ, the fake is fixed; the cases stay as the real apiserver answers them.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from periscope.sim.apiserver import FakeApiServer
from services.kube_watcher.watch import Changed, Listed, Notification, ResourceWatch
from tests.controlplane.conftest import USERS
from tests.controlplane.targets import Obj, Target, create, daemonset, pod


@pytest.fixture(scope="module", params=["sim", "kube"])
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    if request.param == "sim":
        with FakeApiServer(users=USERS, bookmark_interval_s=0.5) as fake:
            yield Target(
                "sim",
                lambda: httpx.Client(base_url=fake.url, timeout=30),
                fake.write_kubeconfig,
                fake.compact,
                namespace_needed=False,
            )
        return
    plane = request.getfixturevalue("kube")

    def expire() -> None:
        # A watch from version v reads from v + 1 on, and etcd keeps the revision it compacts at: two
        # writes first, so that every version handed out so far is older than the compaction.
        with plane.http() as http:
            for _ in range(2):
                create(
                    http,
                    "/api/v1/namespaces/default/configmaps",
                    {
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "metadata": {"name": f"bump-{uuid.uuid4().hex[:8]}"},
                    },
                )
        plane.compact()

    yield Target("kube", plane.http, plane.write_kubeconfig, expire, namespace_needed=True)


def watch_events(
    http: httpx.Client, path: str, *, until: int, timeout_s: int = 5, **params: str
) -> list[Obj]:
    """Events of one watch request, up to `until` of them or the server's end of the stream."""
    query = {"watch": "true", "timeoutSeconds": str(timeout_s), **params}
    events: list[Obj] = []
    with http.stream("GET", path, params=query, timeout=timeout_s + 10) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if line.strip():
                events.append(json.loads(line))
            if len(events) >= until:
                break
    return events


def names(items: list[Obj]) -> list[str]:
    return [i["metadata"]["name"] for i in items]


# ------------------------------------------------------------------ list


def test_list_answers_a_versioned_list_of_the_namespace(target: Target) -> None:
    with target.client() as http:
        ns, other = target.namespace(http), target.namespace(http)
        for n in ("b", "a", "c"):
            create(http, f"/api/v1/namespaces/{ns}/pods", pod(n))
        create(http, f"/api/v1/namespaces/{other}/pods", pod("x"))
        body = http.get(f"/api/v1/namespaces/{ns}/pods").json()
        assert body["kind"] == "PodList" and body["apiVersion"] == "v1"
        assert body["metadata"]["resourceVersion"].isdigit()
        assert names(body["items"]) == ["a", "b", "c"]  # sorted by name within a namespace
        for item in body["items"]:
            assert "kind" not in item and "apiVersion" not in item  # the list names them once
            meta = item["metadata"]
            assert meta["uid"] and meta["resourceVersion"].isdigit() and meta["namespace"] == ns
            assert meta["creationTimestamp"].endswith("Z")
        everywhere = http.get("/api/v1/pods").json()
        assert {(i["metadata"]["namespace"], i["metadata"]["name"]) for i in everywhere["items"]} >= {
            (ns, "a"),
            (ns, "b"),
            (ns, "c"),
            (other, "x"),
        }
        missing = http.get(f"/api/v1/namespaces/{ns}/pods/nope")
        assert missing.status_code == 404 and missing.json()["reason"] == "NotFound"


def test_a_chunked_list_is_one_consistent_snapshot(target: Target) -> None:
    with target.client() as http:
        ns = target.namespace(http)
        for i in range(5):
            create(http, f"/api/v1/namespaces/{ns}/pods", pod(f"p{i}"))
        path = f"/api/v1/namespaces/{ns}/pods"
        first = http.get(path, params={"limit": "2"}).json()
        assert names(first["items"]) == ["p0", "p1"]
        assert first["metadata"]["continue"] and first["metadata"]["remainingItemCount"] == 3
        create(http, path, pod("p9"))  # after the first page: not in this list
        http.delete(f"{path}/p3")
        second = http.get(path, params={"limit": "2", "continue": first["metadata"]["continue"]}).json()
        third = http.get(path, params={"limit": "2", "continue": second["metadata"]["continue"]}).json()
        assert names(second["items"]) == ["p2", "p3"] and names(third["items"]) == ["p4"]
        assert second["metadata"]["remainingItemCount"] == 1
        assert "continue" not in third["metadata"] or not third["metadata"]["continue"]
        versions = {p["metadata"]["resourceVersion"] for p in (first, second, third)}
        assert len(versions) == 1  # every page is the first page's snapshot
        assert names(http.get(path).json()["items"]) == ["p0", "p1", "p2", "p4", "p9"]


def test_a_continue_token_past_compaction_is_410_expired(target: Target) -> None:
    with target.client() as http:
        ns = target.namespace(http)
        path = f"/apis/apps/v1/namespaces/{ns}/daemonsets"
        for i in range(3):
            create(http, path, daemonset(f"ds{i}"))
        first = http.get(path, params={"limit": "1"}).json()
        target.expire()
        r = http.get(path, params={"limit": "1", "continue": first["metadata"]["continue"]})
        assert r.status_code == 410, r.text
        assert r.json()["kind"] == "Status" and r.json()["reason"] == "Expired" and r.json()["code"] == 410
        bad = http.get(path, params={"limit": "1", "continue": "not-a-token"})
        assert bad.status_code == 400 and bad.json()["reason"] == "BadRequest"


# ------------------------------------------------------------------ watch


def test_watch_from_a_list_sees_adds_modifies_and_deletes_in_order(target: Target) -> None:
    with target.client() as http:
        ns = target.namespace(http)
        path = f"/api/v1/namespaces/{ns}/pods"
        create(http, path, pod("before"))
        rv = http.get(path).json()["metadata"]["resourceVersion"]
        created = create(http, path, pod("w"))
        changed = dict(created, metadata={**created["metadata"], "labels": {"app": "changed"}})
        assert http.put(f"{path}/w", json=changed).status_code == 200
        assert http.delete(f"{path}/w").status_code == 200
        events = watch_events(http, path, until=4, resourceVersion=rv)
        # A delete is two events: the pod stamped for deletion (grace period 0: no kubelet holds an
        # unscheduled pod), then gone.
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
            ("ADDED", "w"),
            ("MODIFIED", "w"),
            ("MODIFIED", "w"),
            ("DELETED", "w"),
        ]
        assert events[1]["object"]["metadata"]["labels"] == {"app": "changed"}
        assert events[2]["object"]["metadata"]["deletionTimestamp"]
        assert events[2]["object"]["metadata"]["deletionGracePeriodSeconds"] == 0
        assert all(e["object"]["kind"] == "Pod" and e["object"]["apiVersion"] == "v1" for e in events)
        versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
        assert versions == sorted(versions) and versions[0] > int(rv)
        # Resuming from the middle replays only what came after.
        rest = watch_events(http, path, until=3, resourceVersion=str(versions[0]))
        assert [e["type"] for e in rest] == ["MODIFIED", "MODIFIED", "DELETED"]


def test_watch_without_a_version_starts_with_the_current_state(target: Target) -> None:
    with target.client() as http:
        ns = target.namespace(http)
        path = f"/api/v1/namespaces/{ns}/pods"
        create(http, path, pod("a"))
        create(http, path, pod("b"))
        events = watch_events(http, path, until=2)
        assert sorted((e["type"], e["object"]["metadata"]["name"]) for e in events) == [
            ("ADDED", "a"),
            ("ADDED", "b"),
        ]


def test_bookmarks_move_a_watch_past_changes_it_does_not_see(target: Target) -> None:
    with target.client() as http:
        ns, other = target.namespace(http), target.namespace(http)
        path = f"/api/v1/namespaces/{ns}/pods"
        rv = http.get(path).json()["metadata"]["resourceVersion"]
        elsewhere: list[Obj] = []

        def change_elsewhere() -> None:
            with target.client() as other_http:
                elsewhere.append(create(other_http, f"/api/v1/namespaces/{other}/pods", pod("elsewhere")))

        # The real apiserver sends one 2 s before the watch's own timeout (and then every minute), and
        # only for changes made after the watch started; never the version the client already has.
        timer = threading.Timer(0.5, change_elsewhere)
        timer.start()
        events = watch_events(
            http, path, until=1, timeout_s=4, resourceVersion=rv, allowWatchBookmarks="true"
        )
        timer.join()
        assert [e["type"] for e in events] == ["BOOKMARK"]
        mark = events[0]["object"]
        assert mark["kind"] == "Pod"
        assert (
            int(mark["metadata"]["resourceVersion"])
            >= int(elsewhere[0]["metadata"]["resourceVersion"])
            > int(rv)
        )


def test_a_watch_from_a_compacted_version_ends_with_an_error_event_410(target: Target) -> None:
    with target.client() as http:
        ns = target.namespace(http)
        path = f"/apis/apps/v1/namespaces/{ns}/daemonsets"
        create(http, path, daemonset("ds"))
        rv = http.get(path).json()["metadata"]["resourceVersion"]
        create(http, path, daemonset("ds2"))
        target.expire()
        events = watch_events(http, path, until=5, resourceVersion=rv)
        assert events and events[-1]["type"] == "ERROR", events
        status = events[-1]["object"]
        assert status["kind"] == "Status" and status["code"] == 410 and status["reason"] == "Expired"


# ------------------------------------------------------------------ the watcher's ResourceWatch


def _run_watch(
    target: Target, tmp_path: Path, path_ns: str, **kw: Any
) -> tuple[ResourceWatch, list[Notification]]:
    api = k8s_config.new_client_from_config(config_file=str(target.kubeconfig(tmp_path / "kubeconfig")))
    seen: list[Notification] = []
    lister = k8s.AppsV1Api(api).list_namespaced_daemon_set
    w = ResourceWatch("daemonsets", lambda **a: lister(path_ns, **a), seen.append, **kw)
    threading.Thread(target=w.run, daemon=True).start()
    return w, seen


def _wait(cond: Any, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_resource_watch_lists_in_pages_then_follows(target: Target, tmp_path: Path) -> None:
    with target.client() as http:
        ns = target.namespace(http)
        path = f"/apis/apps/v1/namespaces/{ns}/daemonsets"
        for i in range(5):
            create(http, path, daemonset(f"ds{i}"))
        w, seen = _run_watch(target, tmp_path, ns, page_size=2, watch_timeout_s=30)
        try:
            _wait(lambda: w.synced.is_set())
            listed = [n for n in seen if isinstance(n, Listed)]
            assert len(listed) == 1 and names(list(listed[0].items)) == [f"ds{i}" for i in range(5)]
            create(http, path, daemonset("late"))
            _wait(lambda: any(isinstance(n, Changed) and n.obj["metadata"]["name"] == "late" for n in seen))
        finally:
            w.stop()


def test_resource_watch_relists_after_410(target: Target, tmp_path: Path) -> None:
    with target.client() as http:
        ns = target.namespace(http)
        path = f"/apis/apps/v1/namespaces/{ns}/daemonsets"
        create(http, path, daemonset("ds"))
        w, seen = _run_watch(target, tmp_path, ns, watch_timeout_s=1)
        try:
            _wait(lambda: w.synced.is_set())
            target.expire()  # the next resume (after the 1 s watch) asks for a compacted version
            _wait(lambda: w.stats.expired >= 1 and w.stats.lists >= 2)
            last = [n for n in seen if isinstance(n, Listed)][-1]
            assert names(list(last.items)) == ["ds"]
            create(http, path, daemonset("after"))  # and it follows on from the new list
            _wait(lambda: any(isinstance(n, Changed) and n.obj["metadata"]["name"] == "after" for n in seen))
        finally:
            w.stop()


# ------------------------------------------------------------------ reviews


def _review(http: httpx.Client, kind: str, spec: Obj) -> httpx.Response:
    group = "authentication.k8s.io" if kind == "TokenReview" else "authorization.k8s.io"
    plural = "tokenreviews" if kind == "TokenReview" else "subjectaccessreviews"
    return http.post(
        f"/apis/{group}/v1/{plural}", json={"apiVersion": f"{group}/v1", "kind": kind, "spec": spec}
    )


def test_token_review_names_the_user_or_rejects_the_token(target: Target) -> None:
    with target.client() as http:
        ok = _review(http, "TokenReview", {"token": "alice-token"})
        assert ok.status_code == 201
        body = ok.json()
        assert body["kind"] == "TokenReview" and body["status"]["authenticated"] is True
        user = body["status"]["user"]
        assert user["username"] == "alice" and "system:authenticated" in user["groups"] and user["uid"]
        bad = _review(http, "TokenReview", {"token": "not-a-token"}).json()["status"]
        assert not bad.get("authenticated") and not (bad.get("user") or {}).get("username")
        empty = _review(http, "TokenReview", {"token": ""})
        assert empty.status_code == 400 and empty.json()["reason"] == "BadRequest"


def _allowed(http: httpx.Client, user: str, **attributes: Obj) -> bool:
    r = _review(http, "SubjectAccessReview", {"user": user, "groups": ["system:authenticated"], **attributes})
    assert r.status_code == 201, r.text
    status: Obj = r.json()["status"]
    return bool(status.get("allowed")) and not status.get("denied")


def _pods(verb: str, namespace: str) -> Obj:
    return {"resourceAttributes": {"verb": verb, "group": "", "resource": "pods", "namespace": namespace}}


def test_subject_access_review_answers_as_the_rbac_bindings_say(target: Target) -> None:
    with target.client() as http:
        assert _allowed(http, "alice", **_pods("list", "infer"))
        assert _allowed(http, "alice", **_pods("watch", "team-d"))
        assert not _allowed(http, "alice", **_pods("list", "ml"))
        assert not _allowed(http, "alice", **_pods("list", ""))  # every namespace: no
        assert not _allowed(http, "alice", **_pods("delete", "infer"))
        assert _allowed(http, "carol", **_pods("get", "ml"))
        assert _allowed(http, "ops", **_pods("list", ""))
        for path in ("/v1/policy", "/metrics"):
            url = {"nonResourceAttributes": {"path": path, "verb": "get"}}
            assert _allowed(http, "ops", **url) and not _allowed(http, "alice", **url)
        assert not _allowed(http, "ops", nonResourceAttributes={"path": "/v1/other", "verb": "get"})
        assert not _allowed(http, "ops", **_pods("delete", "ml"))
        secrets = {
            "resourceAttributes": {"verb": "get", "group": "", "resource": "secrets", "namespace": "ml"}
        }
        assert not _allowed(http, "ops", **secrets)
        assert not _allowed(http, "nobody", **_pods("list", "ml"))


def test_subject_access_review_validation_is_422_invalid(target: Target) -> None:
    with target.client() as http:
        no_user = _review(http, "SubjectAccessReview", _pods("list", "ml"))
        both = _review(
            http,
            "SubjectAccessReview",
            {"user": "alice", **_pods("list", "ml"), "nonResourceAttributes": {"path": "/x", "verb": "get"}},
        )
        neither = _review(http, "SubjectAccessReview", {"user": "alice"})
        for r in (no_user, both, neither):
            assert r.status_code == 422, r.text
            assert r.json()["reason"] == "Invalid" and r.json()["kind"] == "Status"
