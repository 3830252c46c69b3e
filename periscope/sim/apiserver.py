"""A fake Kubernetes apiserver that speaks the real list/watch HTTP protocol.

It serves pods, nodes, apps/v1 daemonsets, nvidia.com/v1 clusterpolicies (the GPU Operator CRD, which
can be "not installed"), resource.k8s.io/v1 resourceclaims and coordination.k8s.io/v1 leases, with the
discovery endpoints the official `kubernetes` client needs. Like etcd, one revision counter spans all
kinds; watches resume from a resourceVersion, get BOOKMARK events and an ERROR 410 ("too old resource
version") once the version is compacted away. The HTTP server runs on its own event loop in a
background thread, so every public method is thread-safe and callable from any process layout.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Kind:
    plural: str
    kind: str
    group: str
    version: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


KINDS: tuple[Kind, ...] = (
    Kind("pods", "Pod", "", "v1", True),
    Kind("nodes", "Node", "", "v1", False),
    Kind("daemonsets", "DaemonSet", "apps", "v1", True),
    Kind("clusterpolicies", "ClusterPolicy", "nvidia.com", "v1", False),
    Kind("resourceclaims", "ResourceClaim", "resource.k8s.io", "v1", True),
    Kind("leases", "Lease", "coordination.k8s.io", "v1", True),
)
_BY_NAME = {n.lower(): k for k in KINDS for n in (k.plural, k.kind, k.kind.lower())}
VERSION = {"major": "1", "minor": "34", "gitVersion": "v1.34.1", "gitCommit": "sim", "gitTreeState": "clean",
           "buildDate": "2025-09-09T00:00:00Z", "goVersion": "go1.24.6", "compiler": "gc",
           "platform": "linux/amd64"}


def _status(code: int, reason: str, message: str) -> Obj:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


def rfc3339(ms: int) -> str:
    """Unix ms as a metav1.Time string (whole seconds, UTC), as the apiserver writes them."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms // 1000))


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True, eq=False)  # identity-hashed: lives in a set
class _Watch:
    kind: Kind
    namespace: str | None
    queue: asyncio.Queue[tuple[str, Any]]


class FakeApiServer:
    """In-memory apiserver: `start() -> url`, mutate with `upsert`/`delete`, `stop()`; restartable.

    `compact()` expires every resourceVersion handed out so far (open watches get ERROR 410 and any
    resume fails), which forces clients to relist. `gone_as_http=True` answers an expired watch with
    HTTP 410 instead of the in-stream ERROR event the real apiserver sends.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, bookmark_interval_s: float = 1.0,
                 history_limit: int = 10_000, crd_installed: bool = True, dra_installed: bool = True,
                 gone_as_http: bool = False, clock: Callable[[], int] = _wall_ms) -> None:
        self.host, self.port = host, port
        self.clock = clock  # Unix ms for default creationTimestamps (a simulated clock in `periscope up`)
        self.bookmark_interval_s = bookmark_interval_s
        self.history_limit = history_limit
        self.gone_as_http = gone_as_http
        self.stats: Counter[tuple[str, str]] = Counter()  # ("list"|"watch"|"gone", plural) -> count
        self._lock = threading.RLock()
        self._objects: dict[tuple[str, str, str], Obj] = {}
        self._history: list[tuple[int, Kind, str, Obj]] = []
        self._rv = 1
        self._floor = 0  # watches from a version below this get 410
        self._served = {"clusterpolicies": crd_installed, "resourceclaims": dra_installed}
        self._watches: set[_Watch] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._uids = itertools.count(1)

    # ------------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> str:
        """Serve on `port` (the same one again after a stop); returns the base URL."""
        if self._thread is not None:
            return self.url
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []
        self._loop = loop
        self._thread = threading.Thread(target=self._serve, args=(loop, ready, failure),
                                        name="fake-apiserver", daemon=True)
        self._thread.start()
        if not ready.wait(15) or failure:
            self._thread.join(5)
            self._loop = self._thread = None
            raise RuntimeError(f"fake apiserver failed to start on {self.host}:{self.port}: {failure[:1]}")
        return self.url

    def stop(self) -> None:
        """Stop serving and close every connection; objects and history are kept for a restart."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        with self._lock:
            for w in list(self._watches):
                loop.call_soon_threadsafe(w.queue.put_nowait, ("close", None))
        asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(15)
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

    def _serve(self, loop: asyncio.AbstractEventLoop, ready: threading.Event,
               failure: list[BaseException]) -> None:
        asyncio.set_event_loop(loop)

        async def boot() -> None:
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self._handle)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, self.host, self.port, shutdown_timeout=1.0)
            await site.start()
            server = getattr(site, "_server", None)
            if server is not None and server.sockets:
                self.port = server.sockets[0].getsockname()[1]

        try:
            loop.run_until_complete(boot())
        except BaseException as exc:  # reported by start()
            failure.append(exc)
            ready.set()
            loop.close()
            return
        ready.set()
        loop.run_forever()

    async def _shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ------------------------------------------------------------------ state (thread-safe)
    @property
    def resource_version(self) -> int:
        return self._rv

    def kind(self, name: str) -> Kind:
        try:
            return _BY_NAME[name.lower()]
        except KeyError:
            raise ValueError(f"unknown kind {name!r}; known: {', '.join(k.plural for k in KINDS)}") from None

    def served(self, kind: Kind) -> bool:
        return self._served.get(kind.plural, True)

    def upsert(self, kind: str, obj: Obj) -> Obj:
        """Create or replace an object; a different metadata.uid under the same name is a recreate
        (DELETED for the old object, then ADDED), as a StatefulSet pod replaced by the controller."""
        k = self.kind(kind)
        if not self.served(k):
            raise ValueError(f"{k.plural}.{k.group} is not served (CRD or API group not installed)")
        new = copy.deepcopy(obj)
        meta = new.setdefault("metadata", {})
        if not meta.get("name"):
            raise ValueError("metadata.name is required")
        if k.namespaced:
            meta["namespace"] = meta.get("namespace") or "default"
        else:
            meta.pop("namespace", None)
        key = (k.plural, meta.get("namespace", ""), meta["name"])
        with self._lock:
            old = self._objects.get(key)
            if old is not None and meta.get("uid") and meta["uid"] != old["metadata"]["uid"]:
                self._remove(key)
                old = None
            prev = old["metadata"] if old is not None else {}
            meta["uid"] = meta.get("uid") or prev.get("uid") or self._new_uid()
            meta["creationTimestamp"] = meta.get("creationTimestamp") or prev.get("creationTimestamp") \
                or rfc3339(self.clock())
            new.setdefault("apiVersion", k.api_version)
            new.setdefault("kind", k.kind)
            self._rv += 1
            meta["resourceVersion"] = str(self._rv)
            self._objects[key] = new
            self._record(k, "ADDED" if old is None else "MODIFIED", new)
            return copy.deepcopy(new)

    def delete(self, kind: str, namespace: str | None, name: str) -> bool:
        k = self.kind(kind)
        with self._lock:
            return self._remove((k.plural, (namespace or "default") if k.namespaced else "", name))

    def get(self, kind: str, namespace: str | None, name: str) -> Obj | None:
        k = self.kind(kind)
        with self._lock:
            obj = self._objects.get((k.plural, (namespace or "default") if k.namespaced else "", name))
            return copy.deepcopy(obj) if obj is not None else None

    def objects(self, kind: str, namespace: str | None = None) -> list[Obj]:
        k = self.kind(kind)
        with self._lock:
            return [copy.deepcopy(o) for key, o in sorted(self._objects.items())
                    if key[0] == k.plural and namespace in (None, key[1])]

    def set_crd_installed(self, installed: bool) -> None:
        """Install or remove the ClusterPolicy CRD; removing it deletes every ClusterPolicy."""
        self._set_served("clusterpolicies", installed)

    def set_dra_installed(self, installed: bool) -> None:
        """Serve or stop serving resource.k8s.io/v1 (a cluster without DRA)."""
        self._set_served("resourceclaims", installed)

    def compact(self) -> None:
        """Expire all versions handed out so far: open watches get ERROR 410, resumes fail."""
        with self._lock:
            self._rv += 1
            self._floor = self._rv
            self._history.clear()
            self._tell_watches(None, ("gone", None))

    def clear(self) -> None:
        """Drop every object without events (a wiped store); old versions become expired."""
        with self._lock:
            self._objects.clear()
            self._rv += 1
            self._floor = self._rv
            self._history.clear()

    def bookmark(self) -> None:
        """Send a BOOKMARK now on every watch that asked for them."""
        with self._lock:
            self._tell_watches(None, ("bookmark", self._rv))

    def watchers(self, kind: str | None = None) -> int:
        with self._lock:
            return sum(1 for w in self._watches if kind is None or w.kind is self.kind(kind))

    def write_kubeconfig(self, path: str | Path, context: str = "periscope-sim") -> Path:
        """Write a kubeconfig pointing the official client at this server (plain HTTP, no auth)."""
        cfg = {
            "apiVersion": "v1", "kind": "Config", "current-context": context, "preferences": {},
            "clusters": [{"name": context, "cluster": {"server": self.url}}],
            "users": [{"name": context, "user": {}}],
            "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
        }
        out = Path(path)
        out.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return out

    def _new_uid(self) -> str:
        # Deterministic (counter-based) so simulator runs are reproducible.
        return str(uuid.UUID(int=(0x5E << 120) | next(self._uids)))

    def _set_served(self, plural: str, served: bool) -> None:
        with self._lock:
            if not served:
                for key in [key for key in self._objects if key[0] == plural]:
                    self._remove(key)
                self._tell_watches(plural, ("close", None))
            self._served[plural] = served

    def _remove(self, key: tuple[str, str, str]) -> bool:
        obj = self._objects.pop(key, None)
        if obj is None:
            return False
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._record(_BY_NAME[key[0]], "DELETED", obj)
        return True

    def _record(self, kind: Kind, typ: str, obj: Obj) -> None:
        snap = copy.deepcopy(obj)
        self._history.append((self._rv, kind, typ, snap))
        if len(self._history) > self.history_limit:
            dropped = self._history.pop(0)
            self._floor = dropped[0] + 1
        for w in self._watches:
            if w.kind is kind and w.namespace in (None, snap["metadata"].get("namespace")):
                self._post(w, ("event", {"type": typ, "object": snap}))

    def _tell_watches(self, plural: str | None, item: tuple[str, Any]) -> None:
        for w in self._watches:
            if plural is None or w.kind.plural == plural:
                self._post(w, item)

    def _post(self, w: _Watch, item: tuple[str, Any]) -> None:
        # Always through the loop's FIFO (even from the loop thread) so items keep revision order.
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(w.queue.put_nowait, item)

    # ------------------------------------------------------------------ HTTP
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        if parts == ["version"]:
            return web.json_response(VERSION)
        if parts == ["api"]:
            cidrs = [{"clientCIDR": "0.0.0.0/0", "serverAddress": f"{self.host}:{self.port}"}]
            return web.json_response({"kind": "APIVersions", "versions": ["v1"],
                                      "serverAddressByClientCIDRs": cidrs})
        if parts == ["apis"]:
            return web.json_response({"kind": "APIGroupList", "apiVersion": "v1",
                                      "groups": [self._group(g) for g in self._groups()]})
        if parts[:1] == ["apis"] and len(parts) == 2 and parts[1] in self._groups():
            return web.json_response({"kind": "APIGroup", "apiVersion": "v1", **self._group(parts[1])})
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
            return web.json_response(self._resource_list(group, version, kinds))
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

    def _groups(self) -> list[str]:
        return sorted({k.group for k in KINDS if k.group and self.served(k)})

    def _group(self, group: str) -> Obj:
        gv = {"groupVersion": f"{group}/v1", "version": "v1"}
        return {"name": group, "versions": [gv], "preferredVersion": gv}

    @staticmethod
    def _resource_list(group: str, version: str, kinds: list[Kind]) -> Obj:
        verbs = ["create", "delete", "get", "list", "update", "watch"]
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version,
                "resources": [{"name": k.plural, "singularName": k.kind.lower(), "namespaced": k.namespaced,
                               "kind": k.kind, "verbs": verbs} for k in kinds]}

    @staticmethod
    def _error(code: int, reason: str, message: str) -> web.Response:
        return web.json_response(_status(code, reason, message), status=code)

    def _list(self, kind: Kind, namespace: str | None) -> web.Response:
        with self._lock:
            self.stats["list", kind.plural] += 1
            items = [o for key, o in sorted(self._objects.items())
                     if key[0] == kind.plural and namespace in (None, key[1])]
            body = json.dumps({"kind": f"{kind.kind}List", "apiVersion": kind.api_version,
                               "metadata": {"resourceVersion": str(self._rv)}, "items": items})
        return web.Response(text=body, content_type="application/json")

    async def _watch(self, request: web.Request, kind: Kind, namespace: str | None) -> web.StreamResponse:
        since = request.query.get("resourceVersion", "")
        bookmarks = request.query.get("allowWatchBookmarks") in ("true", "1")
        timeout = float(request.query.get("timeoutSeconds") or 1800)
        if since not in ("", "0") and not since.isdigit():
            return self._error(400, "BadRequest", f"invalid resourceVersion {since!r}")
        w = _Watch(kind, namespace, asyncio.Queue())
        with self._lock:
            self.stats["watch", kind.plural] += 1
            gone = since not in ("", "0") and int(since) < self._floor
            if gone:
                self.stats["gone", kind.plural] += 1
                expired = f"too old resource version: {since} ({self._floor})"
            elif since in ("", "0"):
                backlog = [{"type": "ADDED", "object": copy.deepcopy(o)}
                           for key, o in sorted(self._objects.items())
                           if key[0] == kind.plural and namespace in (None, key[1])]
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
                await self._send(resp, {"type": "ERROR", "object": _status(410, "Expired", expired)})
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

    async def _pump(self, resp: web.StreamResponse, w: _Watch, kind: Kind, timeout: float,
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
                expired = _status(410, "Expired", "too old resource version")
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
        ns = (namespace or "default") if kind.namespaced else ""
        if request.method == "POST" and name is None:
            body = await request.json()
            body.setdefault("metadata", {})["namespace"] = namespace
            with self._lock:
                if (kind.plural, ns, body["metadata"].get("name", "")) in self._objects:
                    name = body["metadata"].get("name")
                    return self._error(409, "AlreadyExists", f"{kind.plural} {name!r} already exists")
                return web.json_response(self.upsert(kind.plural, body), status=201)
        if name is None:
            return self._error(405, "MethodNotAllowed", f"{request.method} needs an object name")
        key = (kind.plural, ns, name)
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
