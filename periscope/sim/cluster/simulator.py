"""The simulated cluster process: `python -m periscope.sim.cluster.simulator CONFIG.json`, started by
`periscope up`.

A Simulator builds the cluster model from its config, serves one NodeSim per node (kubelet socket,
device-manager checkpoint, /proc tree and NVML state) and a FakeApiServer with the nodes, ClusterPolicy,
operand DaemonSets and pods, and writes `ready.json` into the work directory once all of them serve. The
cluster stays frozen at scenario time 0 until `start <sim_ms>` arrives on stdin, so every service can
come up first; then each tick applies the model at that tick (pod admissions and deletions, checkpoint,
/proc, NVML), fires the XIDs and the node faults due (kubelet-restart, checkpoint-corrupt) and writes the
ground truth. Process restarts are the orchestrator's (`periscope up` reads the same fault schedule).
stdin EOF (the orchestrator is gone), `stop`, SIGTERM or SIGINT ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from periscope.clock import ScaledClock, WallClock, clock_from_setting
from periscope.sim.apiserver import FakeApiServer
from periscope.sim.cluster.kube_objects import (
    cluster_policy_object,
    daemonset_objects,
    mps_daemon_pod_object,
    node_object,
    pod_object,
)
from periscope.sim.cluster.model import ClusterModel
from periscope.sim.cluster.node import NodeSim, node_paths
from periscope.sim.cluster.truth import TruthWriter
from periscope.sim.controlplane.process import write_kubeconfig
from periscope.sim.controlplane.writer import KubeObjects
from periscope.sim.procfs import atomic_write
from periscope.sim.scenario import load_scenario

log = logging.getLogger("periscope.sim")


class Simulator:
    def __init__(self, config: dict[str, Any]) -> None:
        self.model = ClusterModel(load_scenario(config["scenario"]))
        self.scenario = self.model.scenario
        self.clock: WallClock | ScaledClock = clock_from_setting(config.get("clock", "wall"))
        self.workdir = Path(config["workdir"])
        self.truth_path = config.get("truth")
        self.idle_window_ms = int(config.get("idle_window_ms", 600_000))
        self.idle_threshold = float(config.get("idle_threshold", 5.0))
        self.truth_meta: dict[str, Any] = dict(config.get("truth_meta") or {})
        self.nodes = {
            n.name: NodeSim(self.model, n.name, i, node_paths(self.workdir, n.name))
            for i, n in enumerate(self.scenario.nodes)
        }
        # A real kube-apiserver when `periscope up --apiserver kube` started one (config["kube"]).
        kube: dict[str, str] | None = config.get("kube")
        self.api: FakeApiServer | KubeObjects = (
            FakeApiServer("127.0.0.1", 0, users=self.scenario.users) if kube is None else
            KubeObjects(kube["server"], kube["ca"], kube["admin_token"], reader_token=kube["watcher_token"]))
        self.kube = kube
        self.created: dict[str, int] = {}
        self.start_ms: int | None = None
        self.prepared_ms = 0  # when the time-0 state was first served
        self._begin = asyncio.Event()
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ control

    def begin(self, start_ms: int) -> None:
        if self.start_ms is None:
            self.start_ms = start_ms
            self._begin.set()

    def stop(self) -> None:
        self._stop.set()
        self._begin.set()

    # ------------------------------------------------------------------ state

    def apply(self, t_ms: int, stamp_ms: int) -> None:
        # The apiserver first: a real one assigns each new pod its UID, which the pod's kubelet state
        # (checkpoint, cgroups) and the truth then carry.
        alive = [p for node in self.nodes.values() for p in node.alive.values()]
        upcoming = self.model.alive(t_ms)
        stopped = [p for p in alive if p.index not in {q.index for q in upcoming}]
        started = [p for p in upcoming if p.index not in {q.index for q in alive}]
        for p in stopped:  # deletions first: a name may be reused
            runtime = self.nodes[p.node].runtime
            self.api.upsert("pods", pod_object(p, self.created.get(p.uid, stamp_ms), stamp_ms, runtime))
            self.api.delete("pods", p.namespace, p.name)
        for p in sorted(started, key=lambda p: p.index):
            stored = self.api.upsert("pods", pod_object(p, stamp_ms, runtime=self.nodes[p.node].runtime))
            p = self.model.adopt_uid(p.index, stored["metadata"]["uid"])
            self.created[p.uid] = stamp_ms
        for node in self.nodes.values():
            node.apply(t_ms)

    def _fire_events(self, lo_ms: int, hi_ms: int) -> None:
        """XIDs and node faults with lo < at <= hi (scenario time); `lo` < 0 includes time 0."""
        for x in self.scenario.xids:
            if lo_ms < x.at_ms <= hi_ms:
                log.info(
                    "xid %d on %s GPU %d%s", x.code, x.node, x.gpu, "" if x.mig is None else f" MIG {x.mig}"
                )
                self.nodes[x.node].add_xid(x.gpu, x.code, x.mig)
        for f in self.scenario.faults:
            if not lo_ms < f.at_ms <= hi_ms or f.node is None:
                continue
            node = self.nodes[f.node]
            if f.fault == "kubelet-restart":
                log.info("fault: kubelet on %s restarts (socket gone for %d ms)", f.node, f.duration_ms)
                task = asyncio.create_task(
                    node.kubelet.restart(down_s=f.duration_ms / 1000 / self.clock.speed)
                )
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            elif f.fault == "checkpoint-corrupt":
                log.info("fault: checkpoint on %s corrupt for %d ms", f.node, f.duration_ms)
                node.corrupt_checkpoint(f.at_ms, f.duration_ms)

    # ------------------------------------------------------------------ run

    async def run(self) -> None:
        self.api.start()
        kubeconfig = self.api.write_kubeconfig(self.workdir / "kubeconfig")
        for name, node in self.nodes.items():
            self.api.upsert("nodes", node_object(self.model, name))
            if node.mps is not None:  # the device plugin's MPS daemon runs before any client
                daemon = mps_daemon_pod_object(node.mps, self.clock.now_ms(), node.runtime)
                stored = self.api.upsert("pods", daemon)
                node.mps = replace(node.mps, uid=stored["metadata"]["uid"])
        for node in self.nodes.values():
            await node.start()
        policy = cluster_policy_object(self.model)
        if policy is None:
            self.api.set_crd_installed(False)
        else:
            self.api.upsert("clusterpolicies", policy)
            for ds in daemonset_objects(self.model):
                self.api.upsert("daemonsets", ds)
        self._fire_events(-1, 0)
        self.prepared_ms = self.clock.now_ms()
        self.apply(0, self.prepared_ms)
        ready = {
            "apiserver": self.api.url,
            "kubeconfig": str(kubeconfig),
            # The API's reviews as its own identity on a real apiserver; the fake needs no credentials.
            "api_kubeconfig": str(self._api_kubeconfig() or kubeconfig),
            "pid": os.getpid(),
            "nodes": {n: s.paths.to_json() | {"dcgm_exporter_url": s.dcgm.url}
                      for n, s in self.nodes.items()},
        }
        atomic_write(self.workdir / "ready.json", json.dumps(ready).encode())
        log.info("simulated cluster %s ready (frozen at 0s until started)", self.scenario.name)
        await self._begin.wait()
        if not self._stop.is_set() and self.start_ms is not None:
            await self._ticks(self.start_ms)
        await self._stop.wait()

    def _api_kubeconfig(self) -> Path | None:
        if self.kube is None:
            return None
        kube = self.kube
        path = self.workdir / "api.kubeconfig"
        return write_kubeconfig(path, kube["server"], kube["ca"], kube["api_token"])

    async def _ticks(self, start_ms: int) -> None:
        tick = self.scenario.tick_ms
        truth = None
        if self.truth_path:
            prestart_ms = max(0, start_ms - self.prepared_ms)
            truth = TruthWriter(
                self.truth_path, self.model, start_ms, self.clock.speed, self.idle_window_ms,
                self.idle_threshold, prestart_ms, self.truth_meta, mig_observable=True,
            )
        ticks = self.model.tick_times()
        behind = _Behind(tick)
        log.info("scenario %s started (%d ticks of %d ms at speed %g)", self.scenario.name, len(ticks), tick,
                 self.clock.speed)
        try:
            for k, t in enumerate(ticks):
                delay = (start_ms + t - self.clock.now_ms()) / 1000 / self.clock.speed
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), delay)
                if self._stop.is_set():
                    return
                if k:  # the events of time 0 fired before the frozen start state was served
                    self._fire_events(t - tick, t)
                self.apply(t, start_ms + t)  # at tick 0 only the NVML sample is rewritten
                applied = self.clock.now_ms()
                behind.note(t, applied - (start_ms + t))
                if truth is not None:
                    truth.write_tick(k, applied)
            behind.note(self.scenario.duration_ms, 0)  # said even if the run ends behind
            log.info("scenario %s ended; holding the last state", self.scenario.name)
        finally:
            if truth is not None:
                truth.close()

    async def shutdown(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for node in self.nodes.values():
            await node.kubelet.stop()
            await node.dcgm.stop()
        self.api.stop()


class _Behind:
    """Says when the simulator puts a tick's state in place more than a tick late (a loaded machine):
    the fake hardware then shows an older tick than the clock, and the truth file says so."""

    def __init__(self, tick_ms: int) -> None:
        self.tick_ms, self.since, self.worst = tick_ms, -1, 0

    def note(self, t_ms: int, late_ms: int) -> None:
        if late_ms > self.tick_ms:
            if self.since < 0:
                self.since = t_ms
            self.worst = max(self.worst, late_ms)
        elif self.since >= 0:
            log.warning("simulator behind from %g s to %g s of scenario time (at most %g s): samples taken "
                        "then see an older tick", self.since / 1000, t_ms / 1000, self.worst / 1000)
            self.since, self.worst = -1, 0


def _read_commands(sim: Simulator, loop: asyncio.AbstractEventLoop) -> None:
    """Orchestrator commands on stdin: `start <sim_ms>`, `stop`; EOF means the orchestrator is gone."""
    for line in sys.stdin:
        parts = line.split()
        if parts[:1] == ["start"] and len(parts) == 2 and parts[1].isdigit():
            loop.call_soon_threadsafe(sim.begin, int(parts[1]))
        elif parts[:1] == ["stop"]:
            break
    loop.call_soon_threadsafe(sim.stop)


async def _main(config: dict[str, Any]) -> None:
    sim = Simulator(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, sim.stop)
    threading.Thread(target=_read_commands, args=(sim, loop), daemon=True, name="commands").start()
    try:
        await sim.run()
    finally:
        await sim.shutdown()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m periscope.sim.cluster.simulator CONFIG.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per write to a real apiserver
    config = json.loads(Path(args[0]).read_text())
    asyncio.run(_main(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
