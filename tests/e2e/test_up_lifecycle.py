"""`periscope up` as a user runs it: ready lines, a curl that answers, Ctrl-C or a crash leaving no
process behind, and bad input rejected before anything starts."""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.e2e.support import marked_env, marked_pids, periscope

pytestmark = pytest.mark.slow


class Up:
    """A running `periscope up` in its own process group, as a terminal would start it."""

    def __init__(self, *args: str, sigint_ignored: bool = False) -> None:
        self.token = uuid.uuid4().hex
        self.started = time.monotonic()
        # A non-interactive shell starts background jobs with SIGINT ignored, and that is inherited.
        ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
        self.proc = subprocess.Popen(
            periscope("up", "--api-port", "0", "--broker-port", "0", *args),
            env=marked_env(self.token),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            process_group=0,
            preexec_fn=ignore,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            self.seen.append(line)
            m = re.match(pattern, line)
            if m:
                return m
        raise AssertionError(f"no line matching {pattern!r}; output:\n" + "\n".join(self.seen[-60:]))

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        deadline = time.monotonic() + 20
        while marked_pids(self.token) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in marked_pids(self.token):  # never leak into the rest of the suite
            os.kill(pid, signal.SIGKILL)


def wait_gone(token: str, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = marked_pids(token)
        if not left:
            return []
        time.sleep(0.2)
    return marked_pids(token)


def test_ready_answers_curl_and_ctrl_c_leaves_nothing() -> None:
    up = Up("--speed", "2")
    try:
        api = up.wait_for(r"^api: (http://127\.0\.0\.1:\d+)$", 60).group(1)
        ready_s = time.monotonic() - up.started
        up.wait_for(r"^broker: 127\.0\.0\.1:\d+$", 5)
        assert ready_s < 45, f"ready after {ready_s:.1f}s"  # target is 20 s; leave room for a busy CI
        assert len(marked_pids(up.token)) >= 8  # broker, sim, 3 probes, watcher, joiner, api
        if shutil.which("curl"):
            out = subprocess.run(
                ["curl", "-sf", f"{api}/v1/gpus"], capture_output=True, text=True, timeout=10
            )
            assert out.returncode == 0 and '"gpu_uuid"' in out.stdout
        r = httpx.get(f"{api}/v1/gpus", timeout=10)
        assert r.status_code == 200 and len(r.json()["items"]) == 5
        os.killpg(up.proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
        assert up.proc.wait(45) == 0
        assert wait_gone(up.token, 5) == []
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{api}/healthz", timeout=2)
    finally:
        up.cleanup()


def test_ctrl_c_stops_up_even_when_it_was_started_with_sigint_ignored() -> None:
    # Python raises KeyboardInterrupt only if SIGINT was not ignored when it started; up must not
    # depend on how its parent (a CI script, `make` in the background) left the signal.
    up = Up("--speed", "2", sigint_ignored=True)
    try:
        up.wait_for(r"^api: http://", 60)
        os.killpg(up.proc.pid, signal.SIGINT)
        assert up.proc.wait(45) == 0
        assert wait_gone(up.token, 5) == []
    finally:
        up.cleanup()


def _child(token: str, needle: str) -> int:
    for pid in marked_pids(token):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if f.read().replace(b"\0", b" ").decode().rstrip().endswith(needle):
                return pid
    raise AssertionError(f"no child running {needle!r}")


def test_crashed_child_is_restarted_and_a_killed_orchestrator_takes_everything_along() -> None:
    up = Up("--speed", "2")
    dirs: list[Path] = []
    try:
        up.wait_for(r"^api: http://", 60)
        sim = _child(up.token, ".json")
        with open(f"/proc/{sim}/cmdline", "rb") as f:
            dirs.append(Path(f.read().split(b"\0")[3].decode()).parent)  # the nodes' state
        api = _child(up.token, "periscope.cli.main api")
        dirs.append(Path(os.readlink(f"/proc/{api}/cwd")).parent.parent)  # up's own: run/<child>
        os.kill(api, signal.SIGKILL)
        up.wait_for(r"^\[up\] api exited with status -9; restarting it$", 15)
        os.kill(up.proc.pid, signal.SIGKILL)  # no cleanup code runs in the orchestrator now
        up.proc.wait(10)
        assert wait_gone(up.token, 30) == [], "children outlived their orchestrator"
    finally:
        up.cleanup()
        for d in dirs:
            if d.name.startswith("periscope-up-"):
                shutil.rmtree(d, ignore_errors=True)


def test_bad_scenario_rejected_before_anything_starts(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "duration: 30s\nnodes:\n  - name: n\n    gpus: [{model: T4, memory_mib: 15360}]\n"
        "pods:\n  - {name: p, node: n, containers: [{name: c, utl_pct: 3}]}\n"
    )
    token = uuid.uuid4().hex
    started = time.monotonic()
    proc = subprocess.run(
        periscope("up", "--scenario", str(bad)),
        env=marked_env(token),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == (
        f"periscope: scenario {bad}: pods[0].containers[0].utl_pct: unknown key (did you mean util_pct?)\n"
    )
    assert time.monotonic() - started < 15
    assert marked_pids(token) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--scenario", "nosuch"), "periscope: scenario nosuch: no such file or built-in scenario"),
        (("--idle-window", "soon"), "periscope: --idle-window soon: not a duration"),
        (("--speed", "-1"), "periscope: Invalid value for '--speed'"),
        (("--truth", "/nonexistent-dir/t.jsonl"), "periscope: --truth /nonexistent-dir/t.jsonl: directory"),
    ],
)
def test_bad_flags_exit_2_with_one_line(args: tuple[str, ...], message: str) -> None:
    proc = subprocess.run(
        periscope("up", "--api-port", "0", "--broker-port", "0", *args),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith(message) and proc.stderr.count("\n") == 1, proc.stderr


def test_port_in_use_is_named() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = subprocess.run(
            periscope("up", "--api-port", str(port)), capture_output=True, text=True, timeout=30
        )
    assert proc.returncode == 2
    assert proc.stderr == (
        f"periscope: --api-port {port}: 127.0.0.1:{port} is already in use (choose another, or 0 for any)\n"
    )


def test_broker_kafka_without_its_toolchain_is_one_line_naming_what_is_missing(tmp_path: Path) -> None:
    """No java: one line naming it, exit 2, nothing started. Java but no mvn and nothing cached yet:
    one line naming mvn."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    base = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    for path, missing in ((str(bin_dir), "needs java on PATH"), (None, "needs mvn on PATH")):
        if path is None:  # java only
            java = shutil.which("java")
            if java is None:
                pytest.skip("no java here to leave on PATH")
            (bin_dir / "java").symlink_to(java)
            path = str(bin_dir)
        proc = subprocess.run(periscope("up", "--broker", "kafka", "--api-port", "0", "--broker-port", "0"),
                              capture_output=True, text=True, timeout=30, env={**base, "PATH": path})
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith("periscope: --broker kafka: ") and missing in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and "apt-get install" in proc.stderr
