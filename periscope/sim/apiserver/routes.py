"""The fake apiserver's HTTP surface: request routing, discovery, list, watch streams and object verbs.

`ApiRoutes` is the `ObjectStore` seen through the apiserver's REST paths: `/version`, `/api`, `/apis`
and each group version's resource list for discovery (only served kinds appear), then list, watch,
create, get, replace and delete on `/api/v1/...` and `/apis/<group>/<version>/...`, cluster-wide or
under `namespaces/<ns>`. A list reports the store's revision; a watch replays the current state or the
history since a resourceVersion, then streams newline-delimited events with periodic BOOKMARKs, and an
expired version ends it with an ERROR 410 event (or a plain HTTP 410 with `gone_as_http`). Errors are
`Status` bodies with the real apiserver's reasons (NotFound, AlreadyExists, Conflict, ...).
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections import Counter

from aiohttp import web

from periscope.sim.apiserver.kinds import KINDS, VERSION, Kind, Obj, group_document, resource_list, status
from periscope.sim.apiserver.reviews import REVIEW_PATHS, review
from periscope.sim.apiserver.store import ObjectStore, Watch
from periscope.sim.scenario.document import UserSpec


class ApiRoutes(ObjectStore):
    """Serves the store over HTTP from `_handle`; the server sets the attributes declared here."""

    host: str
    port: int
    bookmark_interval_s: float
    gone_as_http: bool
    stats: Counter[tuple[str, str]]  # ("list"|"watch"|"gone", plural) -> count
    users: tuple[UserSpec, ...]  # who TokenReview and SubjectAccessReview know

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        if request.path.rstrip("/") in REVIEW_PATHS:
            return await self._review(request)
        if parts == ["version"]:
            return web.json_response(VERSION)
        if parts == ["api"]:
            cidrs = [{"clientCIDR": "0.0.0.0/0", "serverAddress": f"{self.host}:{self.port}"}]
            return web.json_response({"kind": "APIVersions", "versions": ["v1"],
                                      "serverAddressByClientCIDRs": cidrs})
        if parts == ["apis"]:
            return web.json_response({"kind": "APIGroupList", "apiVersion": "v1",
                                      "groups": [group_document(g) for g in self._groups()]})
        if parts[:1] == ["apis"] and len(parts) == 2 and parts[1] in self._groups():
            return web.json_response({"kind": "APIGroup", "apiVersion": "v1", **group_document(parts[1])})
        if parts[:1] == ["api"] and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return self._error(404, "NotFound", "the server could not find the requested resource")
        kinds = [k for k in KINDS if (k.group, k.version) == (group, version) and self.served(k)]
        if not kinds:
            return self._error(404, "NotFound", "the server could not find the requested resource")
        if not rest:
            return web.json_response(resource_list(group, version, kinds))
        namespace: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        kind = next((k for k in kinds if k.plural == rest[0]), None)
        if kind is None or len(rest) > 2 or (namespace is not None and not kind.namespaced):
            return self._error(404, "NotFound", "the server could not find the requested resource")
        name = rest[1] if len(rest) == 2 else None
        if request.method == "GET" and name is None:
            if request.query.get("watch") in ("true", "1"):
                return await self._watch(request, kind, namespace)
            return self._list(kind, namespace)
        return await self._object(request, kind, namespace, name)

    async def _review(self, request: web.Request) -> web.Response:
        if request.method != "POST":
            return self._error(405, "MethodNotAllowed", f"{request.method} is not supported on reviews")
        try:
            body = await request.json()
        except ValueError:
            return self._error(400, "BadRequest", "the request body is not JSON")
        path = request.path.rstrip("/")
        with self._lock:
            self.stats["review", path.rsplit("/", 1)[-1]] += 1
            code, out = review(self.users, path, body)
        return web.json_response(out, status=code)

    def _groups(self) -> list[str]:
        return sorted({k.group for k in KINDS if k.group and self.served(k)})

    @staticmethod
    def _error(code: int, reason: str, message: str) -> web.Response:
        return web.json_response(status(code, reason, message), status=code)

    def _list(self, kind: Kind, namespace: str | None) -> web.Response:
        with self._lock:
            self.stats["list", kind.plural] += 1
            body = json.dumps({"kind": f"{kind.kind}List", "apiVersion": kind.api_version,
                               "metadata": {"resourceVersion": str(self._rv)},
                               "items": self._select(kind, namespace)})
        return web.Response(text=body, content_type="application/json")

    async def _watch(self, request: web.Request, kind: Kind, namespace: str | None) -> web.StreamResponse:
        since = request.query.get("resourceVersion", "")
        bookmarks = request.query.get("allowWatchBookmarks") in ("true", "1")
        timeout = float(request.query.get("timeoutSeconds") or 1800)
        if since not in ("", "0") and not since.isdigit():
            return self._error(400, "BadRequest", f"invalid resourceVersion {since!r}")
        w = Watch(kind, namespace, asyncio.Queue())
        with self._lock:
            self.stats["watch", kind.plural] += 1
            gone = since not in ("", "0") and int(since) < self._floor
            if gone:
                self.stats["gone", kind.plural] += 1
                expired = f"too old resource version: {since} ({self._floor})"
            elif since in ("", "0"):
                current = self._select(kind, namespace)
                backlog = [{"type": "ADDED", "object": copy.deepcopy(o)} for o in current]
            else:
                backlog = [{"type": t, "object": o} for rv, k, t, o in self._history
                           if rv > int(since) and k is kind
                           and namespace in (None, o["metadata"].get("namespace"))]
            if not gone:
                self._watches.add(w)
        if gone and self.gone_as_http:
            return self._error(410, "Expired", expired)
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        try:
            if gone:
                await self._send(resp, {"type": "ERROR", "object": status(410, "Expired", expired)})
                return resp
            for event in backlog:
                await self._send(resp, event)
            await self._pump(resp, w, kind, timeout, bookmarks)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            with self._lock:
                self._watches.discard(w)
        return resp

    async def _pump(self, resp: web.StreamResponse, w: Watch, kind: Kind, timeout: float,
                    bookmarks: bool) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        next_bookmark = loop.time() + self.bookmark_interval_s
        while (left := deadline - loop.time()) > 0:
            wait = min(left, next_bookmark - loop.time()) if bookmarks else left
            try:
                what, data = await asyncio.wait_for(w.queue.get(), max(wait, 0.001))
            except TimeoutError:
                if bookmarks and loop.time() >= next_bookmark:
                    next_bookmark = loop.time() + self.bookmark_interval_s
                    with self._lock:  # queued behind every event already committed
                        self._post(w, ("bookmark", self._rv))
                continue
            if what == "close":
                return
            if what == "gone":
                expired = status(410, "Expired", "too old resource version")
                await self._send(resp, {"type": "ERROR", "object": expired})
                return
            if what == "bookmark":
                if bookmarks:
                    await self._send(resp, {"type": "BOOKMARK", "object": {
                        "kind": kind.kind, "apiVersion": kind.api_version,
                        "metadata": {"resourceVersion": str(data)}}})
                continue
            await self._send(resp, data)

    @staticmethod
    async def _send(resp: web.StreamResponse, event: Obj) -> None:
        await resp.write(json.dumps(event).encode() + b"\n")

    async def _object(self, request: web.Request, kind: Kind, namespace: str | None,
                      name: str | None) -> web.Response:
        if request.method == "POST" and name is None:
            body = await request.json()
            body.setdefault("metadata", {})["namespace"] = namespace
            with self._lock:
                if self.key(kind.plural, namespace, body["metadata"].get("name", "")) in self._objects:
                    name = body["metadata"].get("name")
                    return self._error(409, "AlreadyExists", f"{kind.plural} {name!r} already exists")
                return web.json_response(self.upsert(kind.plural, body), status=201)
        if name is None:
            return self._error(405, "MethodNotAllowed", f"{request.method} needs an object name")
        key = self.key(kind.plural, namespace, name)
        if request.method == "GET":
            obj = self.get(kind.plural, namespace, name)
            if obj is None:
                return self._error(404, "NotFound", f"{kind.plural} {name!r} not found")
            return web.json_response(obj)
        if request.method == "PUT":
            body = await request.json()
            with self._lock:
                cur = self._objects.get(key)
                if cur is None:
                    return self._error(404, "NotFound", f"{kind.plural} {name!r} not found")
                want = body.get("metadata", {}).get("resourceVersion")
                if want and want != cur["metadata"]["resourceVersion"]:
                    return self._error(409, "Conflict", f"Operation cannot be fulfilled on {kind.plural} "
                                       f"{name!r}: the object has been modified")
                meta = body.setdefault("metadata", {})
                meta.update(name=name, namespace=namespace, uid=cur["metadata"]["uid"])
                return web.json_response(self.upsert(kind.plural, body))
        if request.method == "DELETE":
            if self.delete(kind.plural, namespace, name):
                return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success"})
            return self._error(404, "NotFound", f"{kind.plural} {name!r} not found")
        return self._error(405, "MethodNotAllowed", f"{request.method} is not supported")
