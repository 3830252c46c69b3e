"""The fake apiserver's HTTP server: discovery, list, watch streams and object verbs over the store.

`FakeApiServer` is the `ObjectStore` seen through the apiserver's REST paths: discovery (`discovery`:
only served kinds appear), then list, watch, create, get, replace and delete on `/api/v1/...` and
`/apis/<group>/<version>/...`, cluster-wide or under `namespaces/<ns>`, plus the reviews of `reviews`.
A list reports the store's revision, in pages with `limit` (`paging`: one snapshot, 410 once
compacted); a watch replays the current state or the history since a resourceVersion, then streams
newline-delimited events with BOOKMARKs for changes it does not show; an expired version ends it with
an ERROR 410 event (HTTP 410 with `gone_as_http`). Errors are `Status` bodies with the real reasons.
It runs on its own event loop in a background thread (start, stop, restart on the same port).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import threading
from collections import Counter
from pathlib import Path

import yaml
from aiohttp import web

from periscope.sim.apiserver.discovery import Discovery, as_version, list_item
from periscope.sim.apiserver.paging import BadContinue, ContinueExpired, Pages
from periscope.sim.apiserver.reviews import REVIEW_PATHS, review
from periscope.sim.apiserver.store import Kind, Obj, ObjectStore, status
from periscope.sim.scenario.document import UserSpec


def _error(code: int, reason: str, message: str) -> web.Response:
    return web.json_response(status(code, reason, message), status=code)


_NO_RESOURCE = (404, "NotFound", "the server could not find the requested resource")

class FakeApiServer(ObjectStore):
    """In-memory apiserver: `start() -> url`, mutate with `upsert`/`delete`, `stop()`; restartable.

    `compact()` expires every resourceVersion handed out so far (open watches get ERROR 410 and any
    resume fails), which forces clients to relist. `gone_as_http=True` answers an expired watch with
    HTTP 410 instead of the in-stream ERROR event the real apiserver sends.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, bookmark_interval_s: float = 1.0,
                 crd_installed: bool = True, dra_installed: bool = True, gone_as_http: bool = False,
                 users: tuple[UserSpec, ...] = (), dra_versions: tuple[str, ...] = ("v1",)) -> None:
        super().__init__(crd_installed=crd_installed, dra_installed=dra_installed)
        self.dra_versions = dra_versions  # resource.k8s.io versions served, newest first (1.32: v1beta1)
        self.pages = Pages()
        self.discovery = Discovery(self.served, dra_versions)
        self.host, self.port = host, port
        self.bookmark_interval_s = bookmark_interval_s
        self.gone_as_http = gone_as_http
        self.users = users  # who TokenReview and SubjectAccessReview know
        self.stats: Counter[tuple[str, str]] = Counter()  # ("list"|"watch"|"gone"|"review", name) -> count
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> str:
        """Serve on `port` (the same one again after a stop); returns the base URL."""
        if self._thread is not None:
            return self.url
        self._loop = loop = asyncio.new_event_loop()
        self._closing, self._tick = False, asyncio.Event()  # a fresh loop, fresh watch signals
        self._thread = threading.Thread(target=loop.run_forever, name="fake-apiserver", daemon=True)
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._boot(), loop).result(15)
        except Exception as e:
            self._runner = None
            self._halt()
            raise RuntimeError(f"fake apiserver failed to start on {self.host}:{self.port}: {e!r}") from e
        return self.url

    async def _boot(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port, shutdown_timeout=1.0).start()
        self.port = self._runner.addresses[0][1]

    def stop(self) -> None:
        """Stop serving and close every connection; objects and history are kept for a restart."""
        loop = self._loop
        if loop is None or self._thread is None:
            return
        with self._lock:
            self._closing = True  # every open watch stream ends
            self._notify()
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), loop).result(15)
            self._runner = None
        self._halt()

    def _halt(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()
        self._loop = self._thread = None

    def restart(self, keep_state: bool = True) -> str:
        self.stop()
        if not keep_state:
            self.clear()
        return self.start()

    def __enter__(self) -> FakeApiServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def write_kubeconfig(self, path: str | Path, context: str = "periscope-sim") -> Path:
        """Write a kubeconfig pointing the official client at this server (plain HTTP, no auth; the
        reviews it serves need no caller credentials either)."""
        cfg = {
            "apiVersion": "v1", "kind": "Config", "current-context": context, "preferences": {},
            "clusters": [{"name": context, "cluster": {"server": self.url}}],
            "users": [{"name": context, "user": {}}],
            "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
        }
        out = Path(path)
        out.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return out

    # ------------------------------------------------------------------ routes

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.path.rstrip("/") in REVIEW_PATHS:
            return await self._review(request)
        parts = [p for p in request.path.split("/") if p]
        if (document := self.discovery.document(tuple(parts), f"{self.host}:{self.port}")) is not None:
            return web.json_response(document)
        if parts[:1] == ["api"] and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return _error(*_NO_RESOURCE)
        kinds = self.discovery.kinds(group, version)
        if not kinds:
            return _error(*_NO_RESOURCE)
        if not rest:
            return web.json_response(self.discovery.resource_list(group, version, kinds))
        namespace: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        kind = next((k for k in kinds if k.plural == rest[0]), None)
        if kind is None or len(rest) > 2 or (namespace is not None and not kind.namespaced):
            return _error(*_NO_RESOURCE)
        name = rest[1] if len(rest) == 2 else None
        api_version = f"{group}/{version}" if group else version
        if request.method == "GET" and name is None:
            if request.query.get("watch") in ("true", "1"):
                return await self._watch(request, kind, namespace, api_version)
            return self._list(request, kind, namespace, api_version)
        return await self._object(request, kind, namespace, name)

    def _list(self, request: web.Request, kind: Kind, namespace: str | None,
              api_version: str) -> web.Response:
        limit_text, token = request.query.get("limit", "0"), request.query.get("continue", "")
        if not limit_text.isdigit():
            return _error(400, "BadRequest", f"limit: Invalid value: {limit_text!r}")
        scope = f"{api_version}/{kind.plural}/{namespace or ''}"
        with self._lock:
            self.stats["list", kind.plural] += 1
            try:
                page = (self.pages.next(scope, token, int(limit_text), self._floor) if token else
                        self.pages.first(scope, [list_item(kind, o) for o in self._select(kind, namespace)],
                                         self._rv, int(limit_text)))
            except ContinueExpired as e:
                return _error(410, "Expired", str(e))
            except BadContinue as e:
                return _error(400, "BadRequest", str(e))
        return web.json_response({"kind": f"{kind.kind}List", "apiVersion": api_version,
                                  "metadata": page.metadata(), "items": page.items})

    async def _review(self, request: web.Request) -> web.Response:
        if request.method != "POST":
            return _error(405, "MethodNotAllowed", f"{request.method} is not supported on reviews")
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "BadRequest", "the request body is not JSON")
        path = request.path.rstrip("/")
        with self._lock:
            self.stats["review", path.rsplit("/", 1)[-1]] += 1
            code, out = review(self.users, path, body)
        return web.json_response(out, status=code)

    async def _watch(self, request: web.Request, kind: Kind, namespace: str | None,
                     api_version: str) -> web.StreamResponse:
        since = request.query.get("resourceVersion", "")
        resume = since not in ("", "0")  # else: the current state first, as ADDED events
        bookmarks = request.query.get("allowWatchBookmarks") in ("true", "1")
        timeout = float(request.query.get("timeoutSeconds") or 1800)
        if resume and not since.isdigit():
            return _error(400, "BadRequest", f"invalid resourceVersion {since!r}")
        with self._lock:
            self.stats["watch", kind.plural] += 1
            if resume:
                events = self._since(int(since), kind, namespace)
            else:
                events = [("ADDED", copy.deepcopy(o)) for o in self._select(kind, namespace)]
            expired = resume and int(since) < self._floor
            gone = f"too old resource version: {since} ({self._floor})" if expired else ""
            rv = self._rv  # the revision the stream has reached
            # Bookmarks carry a watch past changes made after it started (as the real watch cache does:
            # it counts a new watch as being at the cache's version then, and sends none before).
            reported = rv
            if gone:
                self.stats["gone", kind.plural] += 1
        if gone and self.gone_as_http:
            return _error(410, "Expired", gone)
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        next_bookmark = loop.time() + self.bookmark_interval_s
        ended = False
        try:
            while not gone:
                for typ, obj in events:
                    await self._send(resp, {"type": typ, "object": as_version(api_version, obj)})
                    reported = int(obj["metadata"]["resourceVersion"])
                if ended or loop.time() >= deadline:
                    return resp
                tick = self._tick  # taken before reading, so that no later change goes unnoticed
                with self._lock:
                    if self._closing:
                        return resp
                    if rv < self._floor:  # compacted under an open watch
                        gone = "too old resource version"
                        break
                    events, rv = self._since(rv, kind, namespace), self._rv
                    ended = not self.served(kind)  # uninstalled: its DELETED events, then the end
                if events or ended:
                    continue
                wait = min(deadline, next_bookmark if bookmarks else deadline) - loop.time()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(tick.wait(), max(wait, 0.001))
                if bookmarks and loop.time() >= next_bookmark and rv > reported:
                    next_bookmark, reported = loop.time() + self.bookmark_interval_s, rv
                    await self._send(resp, {"type": "BOOKMARK", "object": {
                        "kind": kind.kind, "apiVersion": api_version,
                        "metadata": {"resourceVersion": str(rv)}}})
            await self._send(resp, {"type": "ERROR", "object": status(410, "Expired", gone)})
        except (ConnectionError, asyncio.CancelledError):
            pass
        return resp

    @staticmethod
    async def _send(resp: web.StreamResponse, event: Obj) -> None:
        await resp.write(json.dumps(event).encode() + b"\n")

    async def _object(self, request: web.Request, kind: Kind, namespace: str | None,
                      name: str | None) -> web.Response:
        if request.method == "POST" and name is None:
            body = await request.json()
            body.setdefault("metadata", {})["namespace"] = namespace
            name = body["metadata"].get("name", "")
            with self._lock:
                if self.key(kind.plural, namespace, name) in self._objects:
                    return _error(409, "AlreadyExists", f"{kind.plural} {name!r} already exists")
                return web.json_response(self.upsert(kind.plural, body), status=201)
        if name is None:
            return _error(405, "MethodNotAllowed", f"{request.method} needs an object name")
        if request.method not in ("GET", "DELETE", "PUT"):
            return _error(405, "MethodNotAllowed", f"{request.method} is not supported")
        body = await request.json() if request.method == "PUT" else {}
        key = self.key(kind.plural, namespace, name)
        with self._lock:
            cur = self._objects.get(key)
            if cur is None:
                return _error(404, "NotFound", f"{kind.plural} {name!r} not found")
            if request.method == "GET":
                return web.json_response(cur)  # serialised at once, under the lock
            if request.method == "DELETE":  # a pod answers with itself, as stamped for deletion
                self.delete(kind.plural, namespace, name)
                if kind.plural == "pods":
                    return web.json_response(cur)
                return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success"})
            want = body.get("metadata", {}).get("resourceVersion")
            if want and want != cur["metadata"]["resourceVersion"]:
                return _error(409, "Conflict", f"Operation cannot be fulfilled on {kind.plural} "
                              f"{name!r}: the object has been modified")
            body.setdefault("metadata", {}).update(name=name, namespace=namespace, uid=cur["metadata"]["uid"])
            return web.json_response(self.upsert(kind.plural, body))
