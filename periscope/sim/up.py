"""`periscope up`: the embedded broker, a simulated cluster and every service, each its own process.

Order: validate the scenario (nothing starts when it is bad), start the broker and create the topics,
start the simulator (it serves the cluster frozen at scenario time 0), one probe per simulated node,
the watcher, the joiner and the API; once the API shows every simulated GPU the scenario clock
starts and the ready lines are printed. All processes share one simulated clock
(`PERISCOPE_CLOCK=sim:<origin>:<speed>`), so event times agree at any `--speed`.

Every child runs in its own process group with PR_SET_PDEATHSIG, so Ctrl-C reaches only this
orchestrator, which then stops the children in reverse order, and a killed orchestrator takes them
along. A child that dies on its own is restarted (as Kubernetes would) and counted; the fault
schedule's probe/joiner/watcher restarts are executed here with SIGTERM and a fresh start.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx

from periscope.bus.admin import ensure_topics
from periscope.bus.broker import BrokerError, EmbeddedBroker, free_port
from periscope.clock import ScaledClock
from periscope.core.duration import format_duration_ms
from periscope.sim.cluster import ClusterModel
from periscope.sim.scenario import describe
from periscope.sim.truth import rfc3339

Emit = Callable[[str], None]
_PR_SET_PDEATHSIG = 1
_MAX_CRASHES = 5
_GRACE_S = 10.0
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(frozen=True, slots=True)
class UpOptions:
    scenario: str = "demo"
    api_port: int = 8080
    broker_port: int = 9092
    speed: float = 1.0
    idle_window_ms: int = 600_000
    idle_threshold: float = 5.0
    truth: Path | None = None
    exit_at_end: bool = False
    log_level: str = "WARNING"
    ready_timeout_s: float = 120.0


def snapshots_path(truth: Path) -> Path:
    """Where `up --truth t.jsonl` records the API as the run goes: `t.api.jsonl` beside it."""
    return truth.with_name(truth.name.removesuffix(".jsonl") + ".api.jsonl")


def _die_with_parent() -> Callable[[], None] | None:
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    parent = os.getpid()

    def hook() -> None:  # in the child, between fork and exec
        # SIGKILL, not SIGTERM: with the orchestrator gone the broker goes too, and a graceful shutdown
        # would wait on it (the joiner's consumer group leave) long after nobody is left to care.
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return hook


class Child:
    """One service process; its output lines are emitted as `[name] line`."""

    def __init__(
        self, name: str, argv: list[str], env: dict[str, str], cwd: Path, emit: Emit, stdin: bool = False
    ) -> None:
        self.name, self.argv, self.env, self.cwd, self.emit = name, argv, env, cwd, emit
        self.stdin = stdin
        self.proc: subprocess.Popen[str] | None = None
        self.crashes = 0
        self.expected_exit = False

    def start(self) -> None:
        self.cwd.mkdir(parents=True, exist_ok=True)
        self.expected_exit = False
        # Spawned from the main thread only: PDEATHSIG follows the thread that forked the child.
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            cwd=self.cwd,
            text=True,
            bufsize=1,
            errors="replace",
            stdin=subprocess.PIPE if self.stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            process_group=0,
            preexec_fn=_die_with_parent(),
            close_fds=True,
        )
        threading.Thread(
            target=self._pump, args=(self.proc.stdout,), daemon=True, name=f"log-{self.name}"
        ).start()

    def _pump(self, stream: IO[str] | None) -> None:
        if stream is None:
            return
        for line in stream:
            text = _ANSI.sub("", line).rstrip()  # cursor/colour codes of Faust's console output
            if text:
                self.emit(f"[{self.name}] {text}")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def send(self, line: str) -> None:
        if self.proc is not None and self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.write(line + "\n")
                self.proc.stdin.flush()

    def terminate(self) -> None:
        """Ask the whole process group to stop (SIGTERM); `finish` waits for it."""
        proc = self.proc
        if proc is None:
            return
        self.expected_exit = True
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)

    def finish(self, deadline: float) -> None:
        """Wait until `deadline` (monotonic), then SIGKILL the group; always reaped."""
        proc = self.proc
        if proc is None:
            return
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.emit(f"[up] {self.name} did not stop in time; killing it")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # also leftovers of a group whose leader is gone
        proc.wait()
        self.proc = None

    def stop(self, grace_s: float = 8.0) -> None:
        """SIGTERM to the whole process group, SIGKILL after the grace period; always reaped."""
        self.terminate()
        self.finish(time.monotonic() + grace_s)


class Sampler(threading.Thread):
    """Records what the API says at every tick (a report after the run cannot see the past)."""

    def __init__(self, api: str, path: Path, clock: ScaledClock, tick_ms: int, start_ms: int) -> None:
        super().__init__(daemon=True, name="api-sampler")
        self.api, self.clock, self.tick_ms, self.start_ms = api, clock, tick_ms, start_ms
        self.out = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed by finish()
        self.stopping = threading.Event()
        self.samples = 0
        self.as_of: str | None = None  # the API's "newest event time in the view" of the last listing

    def _get(self, client: httpx.Client, path: str) -> Any:
        items: list[Any] = []
        url = path
        while True:
            r = client.get(url)
            r.raise_for_status()
            doc = r.json()
            if "items" not in doc:
                return doc
            if url == path:
                self.as_of = doc.get("as_of")
            items += doc["items"]
            token = doc.get("continue")
            if not token:
                return items
            url = f"{path}{'&' if '?' in path else '?'}continue={token}"

    def run(self) -> None:
        with httpx.Client(base_url=self.api, timeout=5.0) as client:
            k = 0
            while not self.stopping.is_set():
                due = self.start_ms + k * self.tick_ms
                wait_s = (due - self.clock.now_ms()) / 1000 / self.clock.speed
                if wait_s > 0 and self.stopping.wait(wait_s):
                    break
                at = self.clock.now_ms()
                k = max(k + 1, (at - self.start_ms) // self.tick_ms + 1)  # skip ticks we fell behind on
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    pods = self._get(client, "/v1/pods?active=true")
                    as_of = self.as_of
                    gpus = self._get(client, "/v1/gpus")
                    self._write(
                        {
                            "kind": "snapshot",
                            "at_ms": at,
                            "at": rfc3339(at),
                            "as_of": as_of,
                            "pods": pods,
                            "gpus": gpus,
                        }
                    )
                    self.samples += 1
            with contextlib.suppress(httpx.HTTPError, ValueError):
                at = self.clock.now_ms()
                self._write(
                    {
                        "kind": "final",
                        "at_ms": at,
                        "at": rfc3339(at),
                        "xid": self._get(client, "/v1/xid"),
                        "policy": self._get(client, "/v1/policy"),
                        "idle": self._get(client, "/v1/idle"),
                        "pods": self._get(client, "/v1/pods"),
                    }
                )

    def _write(self, row: dict[str, Any]) -> None:
        self.out.write(json.dumps(row, separators=(",", ":")) + "\n")
        self.out.flush()

    def finish(self) -> None:
        self.stopping.set()
        self.join(15)
        self.out.close()


def _py(*args: str) -> list[str]:
    return [sys.executable, "-m", *args]


def _seconds(ms: float) -> str:
    return f"{ms / 1000:.6f}".rstrip("0").rstrip(".") or "0"


class Stack:
    """Starts, supervises and stops everything one `periscope up` runs."""

    def __init__(self, opts: UpOptions, model: ClusterModel, emit: Emit) -> None:
        self.opts, self.model, self.emit = opts, model, emit
        self.scenario = model.scenario
        self.workdir = Path(tempfile.mkdtemp(prefix="periscope-up-"))
        self.clock = ScaledClock(time.time_ns() // 1_000_000, opts.speed)
        self.broker: EmbeddedBroker | None = None
        self.children: dict[str, Child] = {}
        self.order: list[str] = []
        self.api_url = ""
        self.start_ms: int | None = None
        self.sampler: Sampler | None = None
        self.crashed: list[str] = []
        # The joiner's aggregation window: fine enough that idleness is decided within a few ticks.
        self.idle_bucket_ms = max(self.scenario.tick_ms, min(60_000, opts.idle_window_ms // 5))

    # ------------------------------------------------------------------ children

    def _env(self, **settings: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PERISCOPE_")}
        env.update(
            PYTHONUNBUFFERED="1",
            PERISCOPE_CLOCK=self.clock.setting(),
            PERISCOPE_LOG_LEVEL=self.opts.log_level,
        )
        if self.broker is not None:
            env["PERISCOPE_KAFKA_BOOTSTRAP"] = self.broker.bootstrap
        env.update({f"PERISCOPE_{k.upper()}": v for k, v in settings.items()})
        return env

    def _add(self, name: str, argv: list[str], env: dict[str, str], stdin: bool = False) -> Child:
        child = Child(name, argv, env, self.workdir / "run" / name.replace("/", "-"), self.emit, stdin)
        self.children[name] = child
        self.order.append(name)
        child.start()
        return child

    def start(self) -> None:
        opts = self.opts
        self.broker = EmbeddedBroker(port=opts.broker_port, log_path=self.workdir / "broker.log")
        bootstrap = self.broker.start()
        asyncio.run(ensure_topics(bootstrap))
        config = {
            "scenario": self.scenario.source,
            "workdir": str(self.workdir / "sim"),
            "clock": self.clock.setting(),
            "truth": str(opts.truth) if opts.truth else None,
            "idle_window_ms": opts.idle_window_ms,
            "idle_threshold": opts.idle_threshold,
            "truth_meta": {"idle_bucket_ms": self.idle_bucket_ms},
        }
        (self.workdir / "sim").mkdir()
        cfg = self.workdir / "sim" / "config.json"
        cfg.write_text(json.dumps(config))
        self._add("sim", _py("periscope.sim.runner", str(cfg)), self._env(), stdin=True)
        ready = self._wait_file(self.workdir / "sim" / "ready.json", "sim", 30)
        tick_s = _seconds(self.scenario.tick_ms / opts.speed)
        for node, paths in ready["nodes"].items():
            self._add(
                f"probe/{node}",
                _py("periscope.cli.main", "probe"),
                self._env(
                    node_name=node,
                    kubelet_root=paths["kubelet_root"],
                    podresources_socket=paths["socket"],
                    checkpoint_path=paths["checkpoint"],
                    proc_root=paths["proc_root"],
                    nvml_backend=f"fake:{paths['nvml_state']}",
                    tick=tick_s,
                    allocation_interval=_seconds(5 * self.scenario.tick_ms / opts.speed),
                    health_port=str(free_port()),
                ),
            )
        self._add(
            "watcher",
            _py("periscope.cli.main", "watch"),
            self._env(kubeconfig=ready["kubeconfig"], health_port=str(free_port())),
        )
        # Event-time knobs scale with the speed: reordering between topics of up to 0.5 s of real time is
        # `speed` times that in event time. A short session timeout keeps a joiner restart quick (one
        # worker: there is no one to rebalance with).
        self._add(
            "joiner",
            _py("periscope.cli.main", "join"),
            self._env(
                app_id="periscope-up",
                web_host="127.0.0.1",
                web_port=str(free_port()),
                data_dir=str(self.workdir / "run" / "joiner" / "data"),
                window=_seconds(self.idle_bucket_ms),
                lateness=_seconds(max(1000.0, 500 * opts.speed)),
                session_timeout="3",
                idle_window=format_duration_ms(opts.idle_window_ms),
                idle_threshold=f"{opts.idle_threshold:g}",
            ),
        )
        api_port = opts.api_port or free_port()
        self.api_url = f"http://127.0.0.1:{api_port}"
        self._add(
            "api", _py("periscope.cli.main", "api"), self._env(api_host="127.0.0.1", api_port=str(api_port))
        )

    def _wait_file(self, path: Path, owner: str, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_startup(owner)
            if path.exists():
                data: dict[str, Any] = json.loads(path.read_text())
                return data
            time.sleep(0.05)
        raise UpError(f"{owner} did not come up within {timeout_s:g}s")

    def _check_startup(self, *names: str) -> None:
        for name in names or tuple(self.children):
            rc = self.children[name].exited()
            if rc is not None:
                raise UpError(f"{name} exited during startup with status {rc} (its log is above)")

    def wait_ready(self) -> None:
        """Ready = the API shows every simulated GPU: the whole pipeline carries data end to end."""
        want = {g.uuid for gpus in self.model.gpus.values() for g in gpus}
        deadline = time.monotonic() + self.opts.ready_timeout_s
        with httpx.Client(base_url=self.api_url, timeout=2.0) as client:
            while time.monotonic() < deadline:
                self._check_startup()
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError):
                    if client.get("/readyz").status_code == 200:
                        seen = {g["gpu_uuid"] for g in client.get("/v1/gpus").json()["items"]}
                        if want <= seen:
                            return
                time.sleep(0.2)
        raise UpError(f"the pipeline did not show all {len(want)} GPUs within {self.opts.ready_timeout_s:g}s")

    def begin(self) -> int:
        self.start_ms = start = self.clock.now_ms()
        self.children["sim"].send(f"start {start}")
        if self.opts.truth is not None:
            self.sampler = Sampler(
                self.api_url, snapshots_path(self.opts.truth), self.clock, self.scenario.tick_ms, start
            )
            self.sampler.start()
        return start

    # ------------------------------------------------------------------ supervision

    def supervise(self) -> None:
        """Until Ctrl-C (or the scenario's end with --exit-at-end): run faults, restart crashed children."""
        assert self.start_ms is not None
        pending = sorted(
            (
                f
                for f in self.scenario.faults
                if f.fault in ("probe-restart", "joiner-restart", "watcher-restart")
            ),
            key=lambda f: f.at_ms,
        )
        end = self.start_ms + self.scenario.duration_ms
        while True:
            now = self.clock.now_ms()
            while pending and self.start_ms + pending[0].at_ms <= now:
                f = pending.pop(0)
                name = f"probe/{f.node}" if f.fault == "probe-restart" else f.fault.removesuffix("-restart")
                old = self.children[name].pid
                self.restart(name)
                self.emit(
                    f"[up] fault at {format_duration_ms(f.at_ms)}: restarted {name} (pid {old} -> "
                    f"{self.children[name].pid})"
                )
            for name in self.order:
                child = self.children[name]
                rc = child.exited()
                if rc is not None and not child.expected_exit:
                    child.crashes += 1
                    self.crashed.append(name)
                    if name == "sim" or child.crashes > _MAX_CRASHES:
                        raise UpError(f"{name} exited with status {rc} and cannot be kept running")
                    self.emit(f"[up] {name} exited with status {rc}; restarting it")
                    child.start()
            if self.opts.exit_at_end and now >= end:
                self.emit(f"[up] scenario {self.scenario.name} ended")
                return
            time.sleep(0.05)

    def restart(self, name: str) -> None:
        child = self.children[name]
        child.stop()
        child.start()

    def stop(self) -> None:
        if self.sampler is not None:
            self.sampler.finish()
        # Services stop together (each may take a few seconds to leave its group or flush), then the
        # simulator, then the broker they all talk to.
        services = [self.children[n] for n in reversed(self.order) if n != "sim"]
        for child in services:
            child.terminate()
        deadline = time.monotonic() + _GRACE_S
        for child in services:
            child.finish(deadline)
        if "sim" in self.children:
            self.children["sim"].stop(_GRACE_S)
        if self.broker is not None:
            self.broker.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


class UpError(RuntimeError):
    """The stack could not be started or kept running; the message says which part and why."""


def banner(stack: Stack) -> list[str]:
    api = stack.api_url
    assert stack.broker is not None
    return [
        f"periscope up: {describe(stack.scenario)}, speed {stack.opts.speed:g}",
        f"api: {api}",
        f"broker: {stack.broker.bootstrap}",
        "try:",
        f"  curl -s {api}/v1/pods",
        f"  curl -s {api}/v1/gpus",
        f"  curl -s '{api}/v1/idle?window=30s'",
        f"  curl -s {api}/v1/xid",
        f"  curl -s {api}/v1/policy",
        f"  curl -s {api}/metrics",
        "Ctrl-C stops everything." if not stack.opts.exit_at_end else "stops when the scenario ends.",
    ]


def run_up(opts: UpOptions, model: ClusterModel, emit: Emit | None = None) -> int:
    """Run the stack; returns the exit status (1 when a service crashed or startup failed)."""
    lock = threading.Lock()

    def say(line: str) -> None:
        with lock, contextlib.suppress(OSError):  # a closed stdout (`| head`) must not stall the pumps
            print(line, flush=True)

    out = emit or say
    # SIGTERM (a supervisor, `timeout`, `kill`) stops everything as Ctrl-C does. SIGINT is set too:
    # a parent that started us with it ignored (a background job of a script) would otherwise leave
    # Ctrl-C without effect, as Python installs its own handler only when SIGINT was not ignored.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    stack = Stack(opts, model, out)
    started = time.monotonic()
    try:
        stack.start()
        stack.wait_ready()
        stack.begin()
        for line in banner(stack):
            out(line)
        out(f"[up] ready in {time.monotonic() - started:.1f}s; scenario clock started")
        stack.supervise()
    except KeyboardInterrupt:
        out("[up] interrupted: stopping")
    except (UpError, BrokerError) as e:
        out(f"[up] {e}")
        print(f"periscope: up: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        with _no_interrupts():
            stack.stop()
    if stack.crashed:
        out(f"[up] services that crashed during the run: {', '.join(sorted(set(stack.crashed)))}")
        return 1
    return 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _no_interrupts() -> Any:
    """A second Ctrl-C must not cut the shutdown short and leave children behind."""
    previous = [signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)]
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])
