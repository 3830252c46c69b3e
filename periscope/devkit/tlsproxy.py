"""A TLS-terminating TCP proxy in front of the embedded broker.

The embedded broker's own TLS listener was not seen completing a handshake, so `periscope up --secure`
and the tests put this proxy in front of its plaintext listener and make the broker advertise the
proxy's address: every client connection, bootstrap and per-broker, then has to speak TLS (mutual TLS
when a client CA is given). It runs its own event loop in a daemon thread, so synchronous callers
(the `up` orchestrator, tests) can start and stop it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import threading
from collections.abc import Callable
from types import TracebackType

log = logging.getLogger(__name__)


def server_context(certfile: str, keyfile: str, client_cafile: str | None = None) -> ssl.SSLContext:
    """A server-side TLS context; with `client_cafile`, clients must present a certificate it signed."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certfile, keyfile)
    if client_cafile:
        ctx.load_verify_locations(client_cafile)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class TlsProxy:
    """Accepts TLS on host:port and relays the plaintext to target_host:target_port.

    `target` may instead be a function returning (host, port), asked at each connection, so a broker
    restarted on another port is found."""

    def __init__(self, context: ssl.SSLContext, target_host: str = "", target_port: int = 0, *,
                 host: str = "127.0.0.1", port: int = 0,
                 target: Callable[[], tuple[str, int]] | None = None) -> None:
        self.context = context
        self.target = target or (lambda: (target_host, target_port))
        self.host, self.port = host, port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> str:
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            # A client that fails the handshake (wrong CA, no certificate) is expected here, not an error.
            loop.set_exception_handler(lambda _loop, ctx: log.debug("TLS proxy: %s", ctx.get("message")))
            self._loop = loop
            try:
                self._server = loop.run_until_complete(asyncio.start_server(
                    self._accept, self.host, self.port, ssl=self.context, ssl_handshake_timeout=10))
                self.port = self._server.sockets[0].getsockname()[1]
            except BaseException as e:  # reported to start()'s caller
                failure.append(e)
                started.set()
                loop.close()
                return
            started.set()
            loop.run_forever()
            loop.run_until_complete(self._close())
            loop.close()

        self._thread = threading.Thread(target=run, name="tls-proxy", daemon=True)
        self._thread.start()
        if not started.wait(timeout_s):
            raise RuntimeError("TLS proxy did not start")
        if failure:
            raise failure[0]
        return self.address

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._thread = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            try:
                target = self.target()
                up_reader, up_writer = await asyncio.open_connection(*target)
            except OSError as e:
                log.warning("TLS proxy: broker %s:%d not reachable: %s", *target, e)
                writer.close()
                return
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            self._tasks.discard(task)

    def __enter__(self) -> TlsProxy:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    except (OSError, ssl.SSLError):  # a peer went away or failed TLS: close both sides
        pass
    finally:
        dst.close()
        with contextlib.suppress(Exception):
            await dst.wait_closed()
