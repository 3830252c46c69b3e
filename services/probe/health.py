"""The probe's HTTP endpoints: /healthz (loops alive), /readyz (sources and broker), /metrics.

A DaemonSet probe needs three GET routes and nothing else, so this is a minimal HTTP/1.1 server on
asyncio streams (one request per connection) rather than a web framework.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


class HealthServer:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        live: Callable[[], tuple[bool, dict[str, Any]]],
        ready: Callable[[], tuple[bool, dict[str, Any]]],
        metrics: Callable[[], bytes],
    ) -> None:
        self.host, self.port = host, port
        self._live, self._ready, self._metrics = live, ready, metrics
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None

    def _route(self, method: str, path: str) -> tuple[int, str, bytes]:
        if method not in ("GET", "HEAD"):
            return 405, "application/json", b'{"error": "only GET"}'
        path = path.split("?", 1)[0]
        if path == "/metrics":
            return 200, PROMETHEUS_TEXT, self._metrics()
        if path in ("/healthz", "/readyz"):
            ok, body = (self._live if path == "/healthz" else self._ready)()
            return (200 if ok else 503), "application/json", json.dumps(body, sort_keys=True).encode()
        return 404, "application/json", b'{"error": "not found"}'

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
            if len(parts) != 3:
                status, ctype, body = 400, "text/plain", b"bad request"
            else:
                status, ctype, body = self._route(parts[0], parts[1])
            header = (
                f"HTTP/1.1 {status} {_REASONS.get(status, 'Bad Request')}\r\n"
                f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            ).encode()
            writer.write(header + (b"" if parts[:1] == ["HEAD"] else body))
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
