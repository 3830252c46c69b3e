"""The worker's HTTP endpoints: `/metrics` (Prometheus text), `/healthz`, `/readyz`.

Registered as the Faust app's web server (it replaces Faust's own), so it binds the joiner's WEB_HOST
and WEB_PORT, where port 0 means any free port; the bound address is printed once listening.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from mode import Service
from prometheus_client import CONTENT_TYPE_LATEST

from services.joiner.metrics import JoinerMetrics


class JoinerWeb(Service):
    def __init__(self, host: str, port: int, metrics: JoinerMetrics, ready: Callable[[], bool],
                 announce: Callable[[str], None] = print,
                 data_age: Callable[[], float] = lambda: 0.0,
                 stalled: Callable[[], list[str]] = list) -> None:
        super().__init__()
        self.host = host
        self.port = port
        self.metrics = metrics
        self.ready = ready
        self.announce = announce
        self.data_age = data_age  # seconds since the last input record was handled
        self.stalled = stalled  # nodes whose event time stopped while their records arrive
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def on_start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        self.announce(f"joiner: {self.url}")

    async def on_stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, request: web.Request) -> web.Response:
        self.metrics.ready.set(1 if self.ready() else 0)
        self.metrics.data_age.set(self.data_age())
        self.metrics.stalled_nodes.set(len(self.stalled()))
        body = self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, request: web.Request) -> web.Response:
        ok = self.ready()
        body = {"ready": ok, "data_age_s": round(self.data_age(), 3), "stalled_nodes": self.stalled()}
        return web.json_response(body, status=200 if ok else 503)
