"""The watcher's HTTP endpoints: /healthz (watch threads alive), /readyz (every resource listed and
the broker accepting), /metrics (Prometheus text of the watch and publish counters)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
Check = Callable[[], tuple[bool, dict[str, Any]]]


class HealthServer:
    def __init__(
        self, host: str, port: int, *, live: Check, ready: Check, metrics: Callable[[], str]
    ) -> None:
        self.host, self.port = host, port
        self._live, self._ready, self._metrics = live, ready, metrics
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        app = web.Application()
        app.router.add_get("/healthz", lambda _: self._check(self._live))
        app.router.add_get("/readyz", lambda _: self._check(self._ready))
        app.router.add_get("/metrics", self._prometheus)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, shutdown_timeout=1.0)
        await site.start()
        server = getattr(site, "_server", None)
        if server is not None and server.sockets:
            self.port = server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @staticmethod
    async def _check(check: Check) -> web.Response:
        ok, body = check()
        return web.Response(
            status=200 if ok else 503, text=json.dumps(body, sort_keys=True), content_type="application/json"
        )

    async def _prometheus(self, _: web.Request) -> web.Response:
        return web.Response(body=self._metrics().encode(), headers={"Content-Type": PROMETHEUS_TEXT})
