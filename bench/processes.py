"""The deployed processes the end-to-end benchmarks drive: joiner workers and the API server.

Each runs as its own `python -m ...` process (as `periscope up` and the deployment run them), in its
own process group, with output in a log file; the benchmark reads their CPU and memory from /proc.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from bench.common import kafka_env, proc_cpu_s, proc_rss_bytes

REPO = Path(__file__).resolve().parent.parent

# Deployment defaults, except a shorter consumer-group session: with the embedded broker the first
# JoinGroup is held for half of it, which only delays the start.
JOINER_ENV = {"PERISCOPE_SESSION_TIMEOUT": "3s", "PERISCOPE_WEB_PORT": "0", "PERISCOPE_LOG_LEVEL": "warning"}


class Process:
    """A child process whose stdout announces its URL as `<name>: http://...`."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path,
                 wrap: list[str] | None = None) -> None:
        self.name = name
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen([*(wrap or []), *argv], cwd=REPO, env={**os.environ, **env},
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.url = ""
        self.target_pid = self.proc.pid  # the service's own pid (differs when wrapped by a profiler)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str, timeout: float = 5) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except OSError:
            return 0, b""

    def wait_url(self, timeout: float = 90) -> str:
        """The announced URL (the service is listening; it may still be busy starting)."""
        deadline = time.monotonic() + timeout
        while not self.url:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()[-2000:]}")
            if m := re.search(rf"{self.name}: (http://[\w.:\[\]-]+)", self.log()):
                self.url = m.group(1)
            elif time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} announced no URL after {timeout}s:\n{self.log()[-2000:]}")
            else:
                time.sleep(0.05)
        return self.url

    def wait_ready(self, timeout: float = 90) -> str:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()[-2000:]}")
            if not self.url and (m := re.search(rf"{self.name}: (http://[\w.:\[\]-]+)", self.log())):
                self.url = m.group(1)
            if self.url and self.get("/readyz")[0] == 200:
                return self.url
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready after {timeout}s:\n{self.log()[-2000:]}")
            time.sleep(0.1)

    def cpu_s(self) -> float:
        return proc_cpu_s(self.target_pid)

    def rss(self) -> int:
        return proc_rss_bytes(self.target_pid)

    def metric(self, name: str) -> float:
        """Sum of one Prometheus metric's samples on /metrics."""
        status, body = self.get("/metrics")
        total = 0.0
        for line in body.decode(errors="replace").splitlines():
            if line.startswith(name) and not line.startswith("#"):
                total += float(line.rsplit(" ", 1)[1])
        return total if status == 200 else float("nan")

    def stop(self, timeout: float = 30) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def joiner(bootstrap: str, app_id: str, tmp: Path, wrap: list[str] | None = None,
           instance: int = 0) -> Process:
    """Worker `instance` of the consumer group `app_id` (each has its own data directory and log)."""
    name = app_id if instance == 0 else f"{app_id}-{instance}"
    env = {**JOINER_ENV, **kafka_env(), "PERISCOPE_KAFKA_BOOTSTRAP": bootstrap,
           "PERISCOPE_APP_ID": app_id,
           "PERISCOPE_DATA_DIR": str(tmp / f"{name}-data")}
    return Process("joiner", [sys.executable, "-m", "services.joiner"], env, tmp / f"{name}.log", wrap)


def api(bootstrap: str, tmp: Path) -> Process:
    env = {"PERISCOPE_LOG_LEVEL": "WARNING", **kafka_env()}
    argv = [sys.executable, "-m", "periscope.cli.main", "api", "--port", "0", "--bootstrap", bootstrap]
    return Process("api", argv, env, tmp / "api.log")
