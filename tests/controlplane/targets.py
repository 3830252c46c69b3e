"""The two apiservers the conformance suite runs against, behind one small interface.

A `Target` gives an HTTP client with the rights to create objects and reviews (the fake asks for no
credentials; the real one gets the administrator's token), a kubeconfig for the official client, a way
to expire every resourceVersion handed out so far (the fake's `compact`, etcd's compaction on the real
one) and a fresh namespace per test. Everything else the suite does is plain HTTP, identical for both.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

Obj = dict[str, Any]


@dataclass
class Target:
    name: str
    client: Callable[[], httpx.Client]
    kubeconfig: Callable[[Path], Path]
    expire: Callable[[], None]  # make every resourceVersion handed out so far too old
    namespace_needed: bool  # the real apiserver refuses objects in a namespace that does not exist

    def namespace(self, http: httpx.Client, prefix: str = "conf") -> str:
        ns = f"{prefix}-{uuid.uuid4().hex[:8]}"
        if self.namespace_needed:
            r = http.post(
                "/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
            )
            assert r.status_code == 201, r.text
        return ns


def pod(name: str, labels: dict[str, str] | None = None) -> Obj:
    """A pod the real apiserver accepts (not bound to a node, so a delete removes it at once)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app": "conformance"}},
        "spec": {"containers": [{"name": "main", "image": "registry.example/conformance:1"}]},
    }


def daemonset(name: str) -> Obj:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "main", "image": "registry.example/ds:1"}]},
            },
        },
    }


def create(http: httpx.Client, path: str, obj: Obj) -> Obj:
    r = http.post(path, json=obj)
    assert r.status_code == 201, r.text
    out: Obj = r.json()
    return out
