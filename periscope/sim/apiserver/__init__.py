"""A fake Kubernetes apiserver that speaks the real list/watch HTTP protocol.

It serves pods, nodes, apps/v1 daemonsets, nvidia.com/v1 clusterpolicies (the GPU Operator CRD, which
can be "not installed"), resource.k8s.io/v1 resourceclaims and coordination.k8s.io/v1 leases, with the
discovery endpoints the official `kubernetes` client needs. Like etcd, one revision counter spans all
kinds; watches resume from a resourceVersion, get BOOKMARK events and an ERROR 410 ("too old resource
version") once the version is compacted away. The kinds live in `kinds`, the versioned store
and its watch fan-out in `store` and the HTTP routes in `routes`; this module holds
`FakeApiServer` itself, whose HTTP server runs on its own event loop in a background thread (start,
stop, restart on the same port, kubeconfig), so every public method is thread-safe and callable from
any process layout.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import yaml
from aiohttp import web

from periscope.sim.apiserver.kinds import KINDS, VERSION, Kind, Obj
from periscope.sim.apiserver.routes import ApiRoutes
from periscope.sim.apiserver.store import rfc3339, wall_ms
from periscope.sim.scenario.document import UserSpec

__all__ = ["KINDS", "VERSION", "FakeApiServer", "Kind", "Obj", "rfc3339"]


class FakeApiServer(ApiRoutes):
    """In-memory apiserver: `start() -> url`, mutate with `upsert`/`delete`, `stop()`; restartable.

    `compact()` expires every resourceVersion handed out so far (open watches get ERROR 410 and any
    resume fails), which forces clients to relist. `gone_as_http=True` answers an expired watch with
    HTTP 410 instead of the in-stream ERROR event the real apiserver sends.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, bookmark_interval_s: float = 1.0,
                 history_limit: int = 10_000, crd_installed: bool = True, dra_installed: bool = True,
                 gone_as_http: bool = False, clock: Callable[[], int] = wall_ms,
                 users: tuple[UserSpec, ...] = ()) -> None:
        super().__init__(history_limit=history_limit, crd_installed=crd_installed,
                         dra_installed=dra_installed, clock=clock)
        self.host, self.port = host, port
        self.bookmark_interval_s = bookmark_interval_s
        self.gone_as_http = gone_as_http
        self.users = users  # TokenReview / SubjectAccessReview (periscope.sim.apiserver.reviews)
        self.stats = Counter()  # ("list"|"watch"|"gone", plural) -> count
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> str:
        """Serve on `port` (the same one again after a stop); returns the base URL."""
        if self._thread is not None:
            return self.url
        self._loop = loop = asyncio.new_event_loop()
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
            for w in list(self._watches):
                loop.call_soon_threadsafe(w.queue.put_nowait, ("close", None))
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
