"""Applying manifests as `kubectl apply --server-side [--dry-run=server]` does: each document's REST
path found through the apiserver's discovery, then a server-side apply (a PATCH of type
application/apply-patch+yaml), so validation, defaulting and admission judge it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import httpx


def apply_documents(
    client: httpx.Client,
    documents: Sequence[dict[str, Any]],
    *,
    dry_run: bool = False,
    manager: str = "periscope",
) -> list[httpx.Response]:
    """Server-side apply each document (as `kubectl apply --server-side`), optionally as a dry run."""
    mapper = ResourceMapper(client)
    out = []
    for doc in documents:
        path = mapper.path(doc)
        params = {"fieldManager": manager, "force": "true", **({"dryRun": "All"} if dry_run else {})}
        body = json.dumps(doc)
        out.append(
            client.patch(
                path, content=body, params=params, headers={"Content-Type": "application/apply-patch+yaml"}
            )
        )
    return out


class ResourceMapper:
    """apiVersion + kind -> REST path, from the apiserver's discovery (what `kubectl` calls a RESTMapper)."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client
        self._lists: dict[str, dict[str, tuple[str, bool]]] = {}

    def resource(self, api_version: str, kind: str) -> tuple[str, bool]:
        """(plural, namespaced) of a kind."""
        if api_version not in self._lists:
            prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            r = self.client.get(prefix)
            found = {}
            if r.status_code == 200:
                found = {
                    x["kind"]: (x["name"], bool(x["namespaced"]))
                    for x in r.json()["resources"]
                    if "/" not in x["name"]
                }
            self._lists[api_version] = found
        try:
            return self._lists[api_version][kind]
        except KeyError:
            raise LookupError(f"{api_version} {kind} is not served") from None

    def path(self, doc: dict[str, Any], name: str | None = None) -> str:
        api_version, kind, meta = doc["apiVersion"], doc["kind"], doc.get("metadata") or {}
        plural, namespaced = self.resource(api_version, kind)
        prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        if namespaced:
            prefix += f"/namespaces/{meta.get('namespace') or 'default'}"
        object_name = meta.get("name") if name is None else name
        return f"{prefix}/{plural}" + (f"/{object_name}" if object_name else "")
