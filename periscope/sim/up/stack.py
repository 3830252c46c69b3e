"""Everything one `periscope up` runs, as a whole: the `Stack` and the options it is started with.

The stack starts the broker (the embedded one, or Apache Kafka with `--broker kafka`; see
periscope.devkit.brokers) and creates the topics, then the simulator (it serves the
cluster frozen at scenario time 0), one probe per simulated node, the watcher, the joiner and the
API, each a `Child` sharing one simulated clock (`PERISCOPE_CLOCK=sim:<origin>:<speed>`) so event
times agree at any `--speed`. It waits until the API shows every simulated GPU, starts the scenario
clock (and the `Sampler` when a truth file is asked for), then supervises: the fault schedule's
probe/joiner/watcher restarts are executed with SIGTERM and a fresh start, and a child that dies on
its own is restarted with back-off until it crashes more often than its crash budget allows
(periscope.sim.up.restarts: five crashes in ten minutes by default). History is bounded by
`--retention`: Apache Kafka deletes older records itself; the embedded broker applies no retention
(periscope.bus.profile), so once per retention period the stack renews it (the services stop, a fresh
broker takes the same address, the topics are created again and the services start again, while the
simulated cluster runs on), which bounds its memory. Stopping takes the services
down together, then the simulator, then the broker. `UpError` says which part could not be started or
kept running, and `banner` is what the user reads once it is ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from periscope.bus.admin import TopicPlan, ensure_topics
from periscope.bus.settings import ServiceSettings
from periscope.clock import ScaledClock
from periscope.config import SettingsError, env_for
from periscope.contract.values import rfc3339
from periscope.core.duration import format_duration_ms
from periscope.devkit.brokers import BrokerKind, LocalBroker
from periscope.devkit.launch import free_port
from periscope.sim.cluster.model import ClusterModel
from periscope.sim.controlplane.build import ControlPlaneUnavailable
from periscope.sim.controlplane.cluster import KubeCluster, start_for_scenario
from periscope.sim.scenario import describe
from periscope.sim.up.child import Child, Emit
from periscope.sim.up.restarts import CrashBudget, CrashPolicy
from periscope.sim.up.sampler import Sampler, snapshots_path, usage_path
from periscope.sim.up.services import JOINER_APP_ID, Tuning, py, services

# Services get this long to stop before they are killed, then the simulator, then the broker: Ctrl-C
# (or a dead broker) ends `periscope up` within 10 s even when a service cannot reach the broker.
SERVICES_GRACE_S = 6.0
SIM_GRACE_S = 2.0
BROKER_GRACE_S = 1.0
# How long a --truth run's final listings wait for the API's view to reach the scenario's end.
SETTLE_S = 30.0
KAFKA_GRACE_S = 5.0  # a clean shutdown of Apache Kafka writes its checkpoints; a kill only costs recovery


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
    secure: bool = False  # the broker only over TLS (see periscope.devkit.brokers)
    api_auth: bool = False  # access control against the simulated apiserver's scenario users
    broker: BrokerKind = "embedded"
    apiserver: str = "sim"  # "kube": the cluster is written into a real kube-apiserver built from source
    crash_policy: CrashPolicy = field(default_factory=CrashPolicy)  # restart a crashed child, or give up
    retention_ms: int = 3_600_000  # history the broker keeps (0: all of it, unbounded)


class UpError(RuntimeError):
    """The stack could not be started or kept running; the message says which part and why."""


class Stack:
    """Starts, supervises and stops everything one `periscope up` runs."""

    def __init__(self, opts: UpOptions, model: ClusterModel, emit: Emit) -> None:
        self.opts, self.model, self.emit = opts, model, emit
        self.scenario = model.scenario
        self.workdir = Path(tempfile.mkdtemp(prefix="periscope-up-"))
        self.simdir: Path | None = None  # the simulated nodes' state, made when the simulator starts
        self.clock = ScaledClock(time.time_ns() // 1_000_000, opts.speed)
        self.broker: LocalBroker | None = None
        self.bootstrap = ""  # what clients connect to: the broker, or its TLS proxy with --secure
        self.credentials: Path | None = None  # with --broker kafka --secure: the principals' settings
        self.children: dict[str, Child] = {}
        self.api_url = ""
        self.start_ms: int | None = None
        self.sampler: Sampler | None = None
        self.crashed: list[str] = []
        self.budgets: dict[str, CrashBudget] = {}  # per child, its crashes within the policy's window
        self.restart_at: dict[str, float] = {}  # crashed children waiting out their back-off (monotonic)
        self.kube: KubeCluster | None = None
        self.renew_at: float | None = None  # when the embedded broker is next renewed (monotonic)
        self.engine_settings: dict[str, str] = {}  # the joiner's engine settings, for `periscope usage`

    # ------------------------------------------------------------------ children

    def _add(self, name: str, argv: list[str], settings: dict[str, str], stdin: bool = False) -> None:
        """Start a child with our environment less its PERISCOPE_* settings, then the shared ones (clock,
        log level, how its principal reaches the broker) and `settings` (lower-case, without the prefix)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PERISCOPE_")}
        assert self.broker is not None
        principal = name.split("/")[0] if name != "sim" else "admin"
        # The connection and log level are checked with the class every service's settings derive from;
        # the clock only the probes and the API read (the joiner's clock is its records' event time).
        shared = env_for(ServiceSettings, log_level=self.opts.log_level, **self.broker.settings(principal))
        shared["clock"] = self.clock.setting()
        env |= {f"PERISCOPE_{k.upper()}": v for k, v in (shared | settings).items()}
        env["PYTHONUNBUFFERED"] = "1"
        child = Child(name, argv, env, self.workdir / "run" / name.replace("/", "-"), self.emit, stdin)
        self.children[name] = child  # in start order
        child.start()

    def start(self) -> None:
        opts = self.opts
        self.broker = LocalBroker(opts.broker, self.workdir, port=opts.broker_port, secure=opts.secure,
                                  joiner_app_id=JOINER_APP_ID)
        self.bootstrap = self.broker.start()
        self.credentials = self.broker.credentials(self.workdir / "kafka-credentials")
        asyncio.run(ensure_topics(self.broker.client("admin"), plan=self.topic_plan()))
        if opts.apiserver == "kube":
            try:
                self.kube = start_for_scenario(self.scenario.users, say=self._say)
            except ControlPlaneUnavailable as e:
                raise UpError(f"--apiserver kube: {e}") from None
        tune = self._tuning()
        sim = self.simdir = memory_dir() or self.workdir / "sim"
        config = {
            "scenario": self.scenario.location,  # the simulator runs in another directory
            "workdir": str(sim),
            "clock": self.clock.setting(),
            "truth": str(opts.truth) if opts.truth else None,
            "idle_window_ms": opts.idle_window_ms,
            "idle_threshold": opts.idle_threshold,
            "truth_meta": {"idle_bucket_ms": tune.idle_bucket_ms},
            "kube": self.kube.sim_config() if self.kube is not None else None,
        }
        sim.mkdir(exist_ok=True)
        (sim / "config.json").write_text(json.dumps(config))
        self._add("sim", py("periscope.sim.cluster.simulator", str(sim / "config.json")), {}, stdin=True)
        self._poll((sim / "ready.json").exists, 30, 0.05, "sim did not come up within 30s", "sim")
        ready = json.loads((sim / "ready.json").read_text())
        self.api_url = f"http://127.0.0.1:{opts.api_port or free_port()}"
        try:
            children = services(opts, self.scenario, ready, self.api_url, tune)
        except SettingsError as e:
            raise UpError(str(e)) from None
        for name, argv, settings in children:
            self._add(name, argv, settings)
            if name == "joiner":
                keep = ("window", "idle_window", "idle_threshold", "lateness", "heartbeat")
                self.engine_settings = {k: settings[k] for k in keep}

    def topic_plan(self) -> TopicPlan:
        """Every topic keeps `--retention` of history (Kafka: with segments short enough for it to apply)."""
        ms = self.opts.retention_ms
        if not ms:
            return TopicPlan()
        return TopicPlan(retention_ms={"input": ms, "output": ms, "deadletter": ms},
                         segment_ms=max(60_000, ms // 4))

    def _say(self, line: str) -> None:
        self.emit(f"[up] {line}")

    def _tuning(self) -> Tuning:
        return Tuning.derive(self.workdir / "run", self.scenario.tick_ms, self.opts)

    def _poll(self, done: Callable[[], bool], limit_s: float, every_s: float, late: str, *names: str) -> None:
        """Poll `done` until the deadline (then UpError `late`), failing as soon as a child (`names`, or
        any) exits. A fixed short interval, not backoff (or a retry library for it): everything is local
        and each poll is cheap, so backing off would only make startup slower."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            for name in names or tuple(self.children):
                rc = self.children[name].exited()
                if rc is not None:
                    raise UpError(f"{name} exited during startup with status {rc} (its log is above)")
            if done():
                return
            time.sleep(every_s)
        raise UpError(late)

    def wait_ready(self) -> None:
        """Ready = the API shows every simulated GPU: the whole pipeline carries data end to end."""
        want = {g.uuid for gpus in self.model.gpus.values() for g in gpus}
        with httpx.Client(base_url=self.api_url, timeout=2.0, headers=self.api_headers()) as client:

            def shows_all() -> bool:
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError):
                    if client.get("/readyz").status_code == 200:
                        return want <= {g["gpu_uuid"] for g in client.get("/v1/gpus").json()["items"]}
                return False

            late = f"the pipeline did not show all {len(want)} GPUs within {self.opts.ready_timeout_s:g}s"
            self._poll(shows_all, self.opts.ready_timeout_s, 0.2, late)

    def api_headers(self) -> dict[str, str]:
        """With --api-auth, the stack itself reads the API as the first cluster-wide scenario user."""
        ops = next((u for u in self.scenario.users if u.cluster), None)
        return {"Authorization": f"Bearer {ops.token}"} if self.opts.api_auth and ops else {}

    def begin(self) -> None:
        start = self.clock.now_ms()
        if self.kube is not None:
            # A real apiserver stamps whole seconds (creation, deletion): the scenario starts on one, so
            # that its pods come and go at the instants those stamps name.
            start = -(-start // 1000) * 1000
            time.sleep(max(0, start - self.clock.now_ms()) / 1000 / self.clock.speed)
        self.start_ms = start
        self.children["sim"].send(f"start {start}")
        assert self.broker is not None
        if self.opts.retention_ms and not self.broker.client().profile.retention_applied:
            self.renew_at = time.monotonic() + self.opts.retention_ms / 1000
        if self.opts.truth is not None:
            path = snapshots_path(self.opts.truth)
            self.sampler = Sampler(self.api_url, path, self.clock, self.scenario.tick_ms, start,
                                   headers=self.api_headers())
            self.sampler.start()

    # ------------------------------------------------------------------ supervision

    def supervise(self) -> None:
        """Until Ctrl-C (or the scenario's end with --exit-at-end): run faults, restart crashed children."""
        assert self.start_ms is not None
        restarts = ("probe-restart", "joiner-restart", "watcher-restart", "joiner-stop")
        pending = sorted((f for f in self.scenario.faults if f.fault in restarts), key=lambda f: f.at_ms)
        down: dict[str, int] = {}  # a stopped child -> when (event time) it starts again
        end = self.start_ms + self.scenario.duration_ms
        while True:
            lost = self.broker.lost() if self.broker is not None else None
            if lost is not None:
                raise UpError(lost)
            now = self.clock.now_ms()
            while pending and self.start_ms + pending[0].at_ms <= now:
                f = pending.pop(0)
                name = f"probe/{f.node}" if f.fault == "probe-restart" else f.fault.split("-")[0]
                child, old = self.children[name], self.children[name].pid
                self.restart_at.pop(name, None)  # a crashed child waiting out its back-off starts now
                child.stop()
                at = format_duration_ms(f.at_ms)
                if f.fault == "joiner-stop":
                    down[name] = self.start_ms + f.at_ms + f.duration_ms
                    self.emit(f"[up] fault at {at}: stopped {name} for {format_duration_ms(f.duration_ms)}")
                    continue
                child.start()
                self.emit(f"[up] fault at {at}: restarted {name} (pid {old} -> {child.pid})")
            for name, until in list(down.items()):
                if now >= until:
                    del down[name]
                    self.children[name].start()
                    self.emit(f"[up] {name} started again (pid {self.children[name].pid})")
            self._restart_crashed()
            if self.renew_at is not None and time.monotonic() >= self.renew_at:
                self.renew_broker()
            if self.opts.exit_at_end and now >= end:
                self.emit(f"[up] scenario {self.scenario.name} ended")
                self._settle(end)
                return
            time.sleep(0.05)

    def _settle(self, end_ms: int) -> None:
        """With --truth, once the scenario ended: wait (at most SETTLE_S) until the API's view reached
        the end, so that the final listings (taken at stop) and the accounting hold the whole run; a
        joiner still catching up has not published the end of it yet."""
        if self.sampler is None:
            return
        waited, behind = self.sampler.settle(end_ms, SETTLE_S)
        if behind is None or waited >= SETTLE_S:
            how = "with no view" if behind is None else f"{behind / 1000:g}s of scenario time behind"
            self._say(f"the API was still {how} after {SETTLE_S:g}s: the final listings are what it served")
        elif waited >= 1:
            self._say(f"the API caught up with the scenario's end {waited:.1f}s after it")

    def record_usage(self) -> None:
        """With --truth, once the scenario ended: `periscope usage` by namespace over the run's whole
        windows (the joiner's engine settings, this broker), kept as `<truth>.usage.json` for the
        accounting section of `periscope report`. A failure is said, not fatal: the run itself is fine."""
        if self.opts.truth is None or self.start_ms is None or self.broker is None:
            return
        w = self._tuning().idle_bucket_ms
        first, end = -(-self.start_ms // w) * w, (self.start_ms + self.scenario.duration_ms) // w * w
        if first >= end:
            return
        env = {k: v for k, v in os.environ.items() if not k.startswith("PERISCOPE_")}
        settings = {**self.broker.settings("admin"), **self.engine_settings, "clock": self.clock.setting(),
                    "replay_workers": "1"}
        env |= {f"PERISCOPE_{k.upper()}": v for k, v in settings.items()}
        argv = py("periscope.cli.main", "usage", "--from", rfc3339(first), "--to", rfc3339(end), "--by",
                  "namespace", "--format", "json", "--quiet")
        try:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180, check=False)
        except subprocess.TimeoutExpired:
            self._say("periscope usage over the run took longer than 180s; no accounting for the report")
            return
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or [f"status {done.returncode}"])[-1]
            self._say(f"periscope usage over the run failed: {why}")
            return
        path = usage_path(self.opts.truth)
        path.write_text(done.stdout, encoding="utf-8")
        self._say(f"GPU-hours of the run ({rfc3339(first)} .. {rfc3339(end)}) written to {path}")

    def renew_broker(self) -> None:
        """A fresh embedded broker at the same address: the services stop, the broker (and all it holds)
        is replaced, the topics are created again and the services start again; the simulated cluster
        runs on, so they publish its current state within a few ticks. UpError if it is not ready again."""
        assert self.broker is not None
        keep = format_duration_ms(self.opts.retention_ms)
        self._say(f"embedded broker: replacing it after {keep} (--retention): it keeps every record in "
                  "memory and applies no retention; the services restart and the history starts again")
        started = time.monotonic()
        services = [c for name, c in self.children.items() if name != "sim"]
        for child in services:
            child.terminate()
        deadline = time.monotonic() + SERVICES_GRACE_S
        for child in services:
            child.finish(deadline)
        self.restart_at.clear()  # what waited out a back-off starts with the others
        self.broker.renew(BROKER_GRACE_S)
        asyncio.run(ensure_topics(self.broker.client("admin"), plan=self.topic_plan()))
        for child in services:
            child.start()
        self.wait_ready()
        self.renew_at = time.monotonic() + self.opts.retention_ms / 1000
        took = time.monotonic() - started
        self._say(f"embedded broker replaced; the pipeline is ready again after {took:.1f}s")

    def _restart_crashed(self) -> None:
        """Notice children that exited on their own and restart them, each after its back-off; UpError
        when one has spent its crash budget (or is the simulator, whose state a restart would lose)."""
        now = time.monotonic()
        for name, child in self.children.items():
            if name in self.restart_at:
                if now >= self.restart_at[name]:
                    del self.restart_at[name]
                    child.start()
                continue
            rc = child.exited()
            if rc is None or child.expected_exit:
                continue
            self.crashed.append(name)
            policy = self.opts.crash_policy
            delay = self.budgets.setdefault(name, CrashBudget(policy)).crashed(now) if name != "sim" else None
            if delay is None:
                why = f"more than {policy.describe()}" if name != "sim" else "the simulator is not restarted"
                raise UpError(f"{name} exited with status {rc} and cannot be kept running ({why})")
            if delay == 0:
                self.emit(f"[up] {name} exited with status {rc}; restarting it")
                child.start()
            else:
                self.emit(f"[up] {name} exited with status {rc}; restarting it in {delay:g}s "
                          f"(crash {len(self.budgets[name].recent)} of {policy.describe()})")
                self.restart_at[name] = now + delay

    def stop(self) -> None:
        if self.sampler is not None:
            self.sampler.finish()
        # Services stop together (each may take a few seconds to leave its group or flush), then the
        # simulator, then the broker they all talk to.
        services = [self.children[n] for n in reversed(self.children) if n != "sim"]
        for child in services:
            child.terminate()
        deadline = time.monotonic() + SERVICES_GRACE_S
        for child in services:
            child.finish(deadline)
        if "sim" in self.children:
            self.children["sim"].stop(SIM_GRACE_S)
        if self.kube is not None:
            self.kube.stop()
        if self.broker is not None:
            self.broker.stop(BROKER_GRACE_S if self.opts.broker == "embedded" else KAFKA_GRACE_S)
        if self.simdir is not None:
            shutil.rmtree(self.simdir, ignore_errors=True)
        shutil.rmtree(self.workdir, ignore_errors=True)


MEMORY_DIR_FREE = 512 * 1024 * 1024  # a /proc tree of 5000 pods takes some 100 MiB there (4 KiB a file)


def memory_dir(root: Path = Path("/dev/shm"), need: int = MEMORY_DIR_FREE) -> Path | None:
    """A fresh directory on the machine's memory file system, for the simulated nodes' state (None when
    there is none, or too little of it: a container's is often 64 MiB). /proc and NVML live in memory on
    a real node; on a journaled disk that another process keeps busy with fsync, the simulator's few
    small writes per tick can each wait seconds for the journal, and the fake hardware then falls behind
    the clock."""
    try:
        fs = os.statvfs(root)
        if fs.f_bavail * fs.f_frsize < need or not os.access(root, os.W_OK | os.X_OK):
            return None
        return Path(tempfile.mkdtemp(prefix="periscope-up-sim-", dir=root))
    except OSError:
        return None


def banner(stack: Stack) -> list[str]:
    api = stack.api_url
    assert stack.broker is not None
    # With --api-auth the examples carry a cluster-wide user's token, and every user is listed.
    token = stack.api_headers().get("Authorization")
    curl = f"curl -s -H '{token}'" if token else "curl -s"
    lines = [
        f"web: {api}/",
        f"periscope up: {describe(stack.scenario)}, speed {stack.opts.speed:g}",
        f"api: {api}",
        f"broker: {stack.bootstrap}" + (f" ({how})" if (how := stack.broker.describe()) else ""),
        *([f"apiserver: {stack.kube.plane.server} (kube-apiserver with etcd, built from source)"]
          if stack.kube is not None else []),
        "try:",
        f"  {curl} {api}/v1/pods",
        f"  {curl} {api}/v1/gpus",
        f"  {curl} '{api}/v1/idle?window=30s'",
        f"  {curl} {api}/v1/xid",
        f"  {curl} {api}/v1/policy",
        f"  {curl} {api}/metrics",
        f"  periscope top --api {api}",
        "Ctrl-C stops everything." if not stack.opts.exit_at_end else "stops when the scenario ends.",
    ]
    if stack.credentials is not None:
        lines.insert(4, f"kafka credentials: {stack.credentials}")
    if stack.opts.api_auth:
        users = [
            f"  {u.name} ({'cluster-wide' if u.cluster else ', '.join(u.namespaces) or 'nothing'}): "
            f"Authorization: Bearer {u.token}"
            for u in stack.scenario.users
        ]
        lines[4:4] = ["access control on; the simulated cluster's users:", *users]
    return lines
