"""Starting the development kit's child processes so that they die with their owner.

Every broker, control plane and `periscope up` child is started through a tiny launcher: a fresh
interpreter sets PR_SET_PDEATHSIG (SIGKILL), gives up if its owner is already gone, and execs the
program, which keeps its PID and command line. Not a preexec_fn: that runs Python (and every library's
at-fork handler) in the child of a threaded process, which the subprocess docs call unsafe, and a child
did crash there while several brokers started at once.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

_PR_SET_PDEATHSIG = 1

_LAUNCHER = (
    "import ctypes, os, sys\n"
    f"ctypes.CDLL(None).prctl({_PR_SET_PDEATHSIG}, {int(signal.SIGKILL)}, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def with_parent_death(argv: list[str]) -> list[str]:
    """`argv` behind a launcher that has Linux kill it (SIGKILL) when this process dies; as is elsewhere."""
    if not sys.platform.startswith("linux"):
        return argv
    return [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(os.getpid()), *argv]


# PR_SET_PDEATHSIG fires when the *thread* that forked the child exits. A child started from a
# short-lived worker thread would die with that thread, so such starts fork from one long-lived thread.
_spawner: ThreadPoolExecutor | None = None
_spawner_lock = threading.Lock()


def spawn(argv: list[str], log: int, *, env: dict[str, str] | None = None,
          cwd: str | None = None) -> subprocess.Popen[bytes]:
    """Start `argv` in its own session, output to the file descriptor `log`, dying with this process."""

    def popen() -> subprocess.Popen[bytes]:
        return subprocess.Popen(with_parent_death(argv), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                                env=env, cwd=cwd)

    if threading.current_thread() is threading.main_thread():
        return popen()
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = ThreadPoolExecutor(1, thread_name_prefix="devkit-spawner")
    return _spawner.submit(popen).result()


def stop_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM to the process group, SIGKILL once `grace_s` is over; always reaps."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


FIRST_PORT = 10_000  # the lowest port free_port hands out


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out to a bind to port 0 and to outgoing connections."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
            return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing holds now, for a process to listen on soon.

    Chosen below the kernel's ephemeral range where there is room: a port from a bind to port 0 is one
    the kernel also gives outgoing connections, and one of those took it before the child bound it
    ("Address already in use", seen with tests running side by side). Below the range only another
    caller of this function can take it first, and it picks at random among thousands."""
    low, _ = ephemeral_range()
    for _ in range(100 if low - FIRST_PORT >= 1000 else 0):
        port = random.randrange(FIRST_PORT, low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        chosen: int = s.getsockname()[1]
        return chosen


def listening(pid: int, port: int) -> bool | None:
    """Whether process `pid` holds a listening TCP socket on `port`; None where /proc cannot say.

    A Kafka answer on the port proves only that someone serves it: a second broker started on a taken
    port answers through the first one until its own bind fails, which can take a while under load."""
    inodes: set[str] = set()
    try:
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with contextlib.suppress(FileNotFoundError), open(table) as f:
                for line in f.readlines()[1:]:
                    fields = line.split()  # sl local_address rem_address st ... uid timeout inode
                    if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(f"socket:[{fields[9]}]")
        fds = os.listdir(f"/proc/{pid}/fd")
    except (OSError, IndexError, ValueError):
        return None
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
    return False
