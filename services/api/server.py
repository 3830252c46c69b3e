"""Runs the API: uvicorn serving the app, and the consumer filling its view, in one event loop.

The listening socket is bound here rather than by uvicorn so that a bad host/port fails with a clear
error before anything starts, and so that port 0 (tests) reports the port actually bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Sequence

import uvicorn
from fastapi import APIRouter, FastAPI

from services.api.app import create_app
from services.api.auth import Gate
from services.api.consumer import ViewConsumer
from services.api.owners import OwnerQueries, ProcessLookup
from services.api.owners import router as owners_router
from services.api.reviews import KubeReviews, kube_configuration
from services.api.settings import ApiSettings
from services.api.view import View

log = logging.getLogger(__name__)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket; OSError (address in use, unknown host) for the caller to report."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only when the listening
    # socket says TCP, and without it uvicorn's separate header/body writes wait ~40 ms on delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class ApiServer:
    def __init__(
        self,
        settings: ApiSettings,
        view: View | None = None,
        *,
        extra_routers: Sequence[APIRouter] = (),
        consume: bool = True,
    ) -> None:
        self.settings = settings
        self.view = view if view is not None else View(settings.window_retention_ms)
        self.consumer = (
            ViewConsumer(
                self.view,
                settings.kafka(),
                settings.api_group_prefix,
                retention_ms=settings.retention_ms,
                window_retention_ms=settings.window_retention_ms,
                stale_after_s=settings.api_stale_after,
                evidence=settings.evidence(),
            )
            if consume
            else None
        )
        self.reviews: KubeReviews | None = None
        gate = None
        if settings.api_auth == "kubernetes":
            self.reviews = KubeReviews(kube_configuration(settings.kubeconfig))
            gate = Gate(self.reviews, ttl_s=settings.auth_ttl_s, max_entries=settings.api_auth_cache_size,
                        review_budget=settings.api_auth_review_budget,
                        failure_budget=settings.api_auth_failure_budget)
        limits = settings.owners_limits()
        self.replays = ProcessLookup(settings.kafka(), limits.concurrency)
        self.owner_queries = OwnerQueries(self.replays, limits)
        self.app = create_app(
            self.view,
            self.consumer.status if self.consumer else None,
            extra_routers=[*extra_routers, owners_router(self.owner_queries)],
            lifespan=self._lifespan,
            gate=gate,
        )
        self._sock: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def _lifespan(self, _: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as cleanup:
            if self.reviews is not None:
                cleanup.push_async_callback(self.reviews.close)
            cleanup.callback(self.replays.close)
            async with self._consuming():
                yield

    @contextlib.asynccontextmanager
    async def _consuming(self) -> AsyncIterator[None]:
        if self.consumer is None:
            yield
            return
        stop = asyncio.Event()
        task = asyncio.create_task(self.consumer.run(stop), name="api-consumer")
        try:
            yield
        finally:
            stop.set()
            try:
                await asyncio.wait_for(task, 10)
            except TimeoutError:
                task.cancel()

    def bind(self) -> socket.socket:
        if self._sock is None:
            self._sock = bind(self.settings.api_host, self.settings.api_port)
        return self._sock

    @property
    def port(self) -> int:
        port: int = self.bind().getsockname()[1]
        return port

    @property
    def url(self) -> str:
        host = self.settings.api_host
        host = f"[{host}]" if ":" in host else host
        return f"{'https' if self.settings.tls else 'http'}://{host}:{self.port}"

    async def serve(self) -> None:
        """Serve until stopped (SIGINT/SIGTERM or `stop()`)."""
        sock = self.bind()
        tls = self.settings
        config = uvicorn.Config(
            self.app,
            log_level=self.settings.log_level.lower(),
            access_log=False,
            lifespan="on",
            ssl_certfile=tls.api_tls_certfile or None,
            ssl_keyfile=tls.api_tls_keyfile or None,
        )
        self._server = uvicorn.Server(config)
        try:
            await self._server.serve(sockets=[sock])
        finally:
            sock.close()
            self._sock = None

    async def start(self) -> str:
        """Serve in a background task; return the base URL once it accepts requests."""
        self.bind()
        url = self.url
        self._task = asyncio.create_task(self.serve(), name="api-server")
        while self._server is None or not self._server.started:
            if self._task.done():
                self._task.result()  # re-raise why it could not start
                raise RuntimeError("api server stopped before it started")
            await asyncio.sleep(0.02)
        return url

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            await self._task
            self._task = None
