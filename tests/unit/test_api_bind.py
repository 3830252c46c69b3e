"""The API's listening socket: accepted connections get TCP_NODELAY.

uvicorn writes a response's headers and body separately; with Nagle on, the body waits for the
client's delayed ACK (~40 ms per request). asyncio sets TCP_NODELAY on accepted connections only
when the listening socket was created with IPPROTO_TCP, so this is what bind() must do.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from services.api.server import bind


async def test_accepted_connections_have_nagle_off() -> None:
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def accepted(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.set_result(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(accepted, sock=sock)
    try:
        _r, w = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(seen, 5) != 0
        w.close()
    finally:
        server.close()
        await server.wait_closed()


def test_a_taken_port_is_an_os_error() -> None:
    first = bind("127.0.0.1", 0)
    try:
        with pytest.raises(OSError):
            socket_ = bind("127.0.0.1", first.getsockname()[1])
            socket_.close()
    finally:
        first.close()
