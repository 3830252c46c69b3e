"""Probe CPU per tick for a node with 8 GPUs and 64 GPU processes, on the fake NVML and a fake /proc.

Each of 8 pods owns one GPU and runs 8 processes on it. Two measurements:

* service: `python -m services.probe` as its own process against the fake NVML state file, a /proc
  tree, a kubelet checkpoint file and a PodResources server on a unix socket (served from this
  process), publishing to the broker (embedded or Apache Kafka). Its CPU time (user + system,
  /proc/<pid>/stat) over a span of ticks, divided by the ticks: everything the probe does per tick
  (telemetry sample, /proc, a stat of the checkpoint, PodResources `List` on its own period (default
  two ticks; at once when the checkpoint changes, which it does not here), encoding, Kafka producer,
  event loop, the XID wait thread).
* sample: the telemetry tick's own work in this thread (`Probe._sample`, building the NodeTelemetry and
  encoding it), with a breakdown by step.

The fake NVML answers from a parsed JSON state (re-read only when the file changes); real NVML calls are
ioctls into the driver, so the NVML share of these figures says little about real hardware. The fake's
`nvmlEventSetWait` polls its state file every 20 ms where the driver blocks, so the probe's XID thread
costs CPU here that it does not on a GPU node: the service setup names that share
(`fake_xid_wait_ms_per_tick`, the same wait timed in this thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import (
    CpuTimer,
    Figure,
    Goal,
    broker_label,
    end_offsets,
    kafka_env,
    median,
    proc_cpu_s,
)
from bench.workload import (
    NAMESPACE,
    RESOURCE,
    NodeShape,
    container_id,
    gpu_uuid,
    node_name,
    pod_name,
    pod_uid,
)
from periscope.bus import codec, topics
from periscope.core.model import NodeTelemetry
from periscope.devkit.launch import free_port
from periscope.kubelet.checkpoint import CheckpointEntry, render_checkpoint
from periscope.sim.kubelet import FakeContainer, FakeDevices, FakeKubelet, FakePod
from periscope.sim.nvml import write_nvml_state
from periscope.sim.procfs import FakeProcfs

GOAL = Goal("<", 10.0, "< 10 ms CPU per tick")
SHAPE = NodeShape(gpus=8, procs_per_gpu=8)
NODE = 0


def _pid(g: int, j: int) -> int:
    return 20_000 + g * 100 + j


def prepare(root: Path, shape: NodeShape = SHAPE, node: int = NODE) -> dict[str, str]:
    """Write node `node`'s fake NVML state, /proc tree and checkpoint (pod g owns GPU g and runs its
    processes on it, identities as in bench.workload); return the probe's env settings."""
    gpus = []
    for g in range(shape.gpus):
        procs = [{"pid": _pid(g, j), "used_mib": 2048 + j, "sm_util": 10 + j, "mem_util": 5}
                 for j in range(shape.procs_per_gpu)]
        gpus.append({"uuid": gpu_uuid(node, g), "name": "NVIDIA H100 80GB HBM3", "minor": g,
                     "pci_bus_id": f"00000000:{0x18 + g:02X}:00.0", "memory_total_mib": 81559,
                     "memory_used_mib": 2048 * shape.procs_per_gpu, "util_pct": 80, "mem_util_pct": 30,
                     "power_w": 450.5, "temp_c": 60, "processes": procs})
    state = root / "nvml.json"
    write_nvml_state(state, {"driver_version": "550.54.15", "cuda_driver_version": 12040, "gpus": gpus})
    procfs = FakeProcfs(root / "proc")
    for g in range(shape.gpus):
        for j in range(shape.procs_per_gpu):
            procfs.add_pod_process(_pid(g, j), pod_uid=pod_uid(node, g), container_id=container_id(node, g),
                                   qos="guaranteed")
    kubelet_root = root / "kubelet"
    ckpt = kubelet_root / "device-plugins" / "kubelet_internal_checkpoint"
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    entries = [CheckpointEntry(pod_uid(node, g), "main", RESOURCE, (gpu_uuid(node, g),))
               for g in range(shape.gpus)]
    ckpt.write_bytes(render_checkpoint(entries, {RESOURCE: [gpu_uuid(node, g) for g in range(shape.gpus)]}))
    return {
        "PERISCOPE_NODE_NAME": node_name(node),
        "PERISCOPE_NVML_BACKEND": f"fake:{state}",
        "PERISCOPE_PROC_ROOT": str(root / "proc"),
        "PERISCOPE_KUBELET_ROOT": str(kubelet_root),
        "PERISCOPE_HEALTH_PORT": "0",
        "PERISCOPE_LOG_LEVEL": "WARNING",
    }


def fake_pods(shape: NodeShape = SHAPE, node: int = NODE, namespace: str = NAMESPACE) -> list[FakePod]:
    return [FakePod(namespace, pod_name(node, g),
                    (FakeContainer("main", (FakeDevices(RESOURCE, (gpu_uuid(node, g),)),)),))
            for g in range(shape.gpus)]


def sample_cpu(root: Path, ticks: int, repeats: int) -> tuple[Figure, dict[str, Any]]:
    """CPU of the telemetry tick's work, in this thread, with a per-step breakdown."""
    from periscope.settings.probe import ProbeSettings
    from services.probe.service import Probe

    env = prepare(root)
    fields: dict[str, Any] = {k.removeprefix("PERISCOPE_").lower(): v for k, v in env.items()}
    settings = ProbeSettings(**fields)
    probe = Probe(settings)
    probe.nvml.open()
    probe.nvml.refresh()
    probe._sample()  # warm: the first tick reads every /proc/<pid>/cgroup, later ticks only stat
    per_tick, nvml_ms, proc_ms, enc_ms = [], [], [], []
    for _ in range(repeats):
        with CpuTimer() as whole:
            for _ in range(ticks):
                tel = NodeTelemetry(meta=probe._meta(), devices=probe._sample())
                codec.encode(tel)
        per_tick.append(whole.seconds / ticks * 1000)
        identify, probe.nvml.identify = probe.nvml.identify, None  # NVML alone, without /proc
        with CpuTimer() as t_nvml:
            for _ in range(ticks):
                devices = probe.nvml.sample()
        probe.nvml.identify = identify
        nvml_ms.append(t_nvml.seconds / ticks * 1000)
        with CpuTimer() as t_proc:
            for _ in range(ticks):
                for d in devices:
                    for p in d.processes:
                        probe.procs.lookup(p.pid)
        proc_ms.append(t_proc.seconds / ticks * 1000)
        with CpuTimer() as t_enc:
            for _ in range(ticks):
                codec.encode(tel)
        enc_ms.append(t_enc.seconds / ticks * 1000)
    probe.nvml.close()
    devices_n = len(tel.devices)
    procs_n = sum(len(d.processes) for d in tel.devices)
    breakdown = {"fake_nvml_sample_ms": median(nvml_ms), "procfs_lookups_ms": median(proc_ms),
                 "encode_ms": median(enc_ms), "telemetry_bytes": len(codec.encode(tel))}
    setup = {"gpus": devices_n, "processes": procs_n, "ticks": ticks, "repeats": repeats,
             "what": "Probe._sample (fake NVML, each process labelled from /proc as it is built, with the "
                     "start-time cache) + NodeTelemetry + protobuf encode, thread CPU time", **breakdown}
    fig = Figure("probe_sample_cpu_ms_per_tick", median(per_tick), "ms CPU/tick", setup,
                 "Python work per process: NVML wrappers (the fake's dict walks), a /proc/<pid>/stat read "
                 "per process per tick, protobuf encode", GOAL, per_tick,
                 "8 GPUs x 64 processes: fake NVML sample + /proc lookups + encode, thread CPU, median of "
                 f"{repeats} x {ticks} ticks")
    return fig, breakdown


class Kubelets:
    """Fake PodResources servers on one event loop thread of this process, so probes in other
    processes get answers while this process waits or runs its own loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.kubelets: list[FakeKubelet] = []

    def add(self, env: dict[str, str], node: int, namespace: str = NAMESPACE,
            shape: NodeShape = SHAPE) -> None:
        """Serve node `node`'s pods on the socket under the probe settings' kubelet root."""
        sock = Path(env["PERISCOPE_KUBELET_ROOT"]) / "pod-resources" / "kubelet.sock"
        kubelet = FakeKubelet(sock, rate_limit=False)
        kubelet.set_pods(fake_pods(shape, node, namespace))
        kubelet.set_allocatable([(RESOURCE, gpu_uuid(node, g)) for g in range(shape.gpus)])
        asyncio.run_coroutine_threadsafe(kubelet.start(), self.loop).result(30)
        self.kubelets.append(kubelet)

    def __enter__(self) -> Kubelets:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for k in self.kubelets:
            asyncio.run_coroutine_threadsafe(k.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def start_probe(env: dict[str, str], bootstrap: str, tick_s: float, log: Path) -> subprocess.Popen[bytes]:
    """`python -m services.probe` with these settings, its output in `log`."""
    env = {**os.environ, **env, **kafka_env(), "PERISCOPE_KAFKA_BOOTSTRAP": bootstrap,
           "PERISCOPE_TICK": f"{tick_s}",
           "PERISCOPE_HEALTH_PORT": str(free_port())}
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "services.probe"], env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT)


def stop_probe(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def fake_xid_wait_ms_per_s(state: str, seconds: float = 2.0) -> float:
    """Thread CPU per second of waiting for XIDs on the fake NVML, as the probe's XID thread waits
    (every GPU registered, 250 ms waits that time out): the fake's share of the service figure."""
    from periscope.sim.nvml import fake_pynvml

    nv = fake_pynvml(state)
    nv.nvmlInit()
    es = nv.nvmlEventSetCreate()
    for i in range(nv.nvmlDeviceGetCount()):
        nv.nvmlDeviceRegisterEvents(nv.nvmlDeviceGetHandleByIndex(i), nv.nvmlEventTypeXidCriticalError, es)
    start = time.monotonic()
    with CpuTimer() as cpu:
        while time.monotonic() - start < seconds:
            with contextlib.suppress(nv.NVMLError):  # Timeout: no XID, as on a healthy node
                nv.nvmlEventSetWait(es, 250)
    wall = time.monotonic() - start
    nv.nvmlEventSetFree(es)
    nv.nvmlShutdown()
    return cpu.seconds / wall * 1000


def service_cpu(root: Path, bootstrap: str, tick_s: float, warm_s: float, span_s: float) -> Figure:
    """CPU of the whole probe process per tick, running against the fakes and the broker."""
    env = prepare(root)
    xid_ms_per_s = fake_xid_wait_ms_per_s(env["PERISCOPE_NVML_BACKEND"].removeprefix("fake:"))
    log = root / "probe.log"
    with Kubelets() as kubelets:
        kubelets.add(env, NODE)
        proc = start_probe(env, bootstrap, tick_s, log)
        try:
            time.sleep(warm_s)
            if proc.poll() is not None:
                raise RuntimeError(f"probe exited: {log.read_text(errors='replace')[-500:]}")
            n0 = asyncio.run(end_offsets(bootstrap, topics.TELEMETRY.name))
            c0 = proc_cpu_s(proc.pid)
            time.sleep(span_s)
            c1 = proc_cpu_s(proc.pid)
            n1 = asyncio.run(end_offsets(bootstrap, topics.TELEMETRY.name))
        finally:
            stop_probe(proc)
    ticks = n1 - n0  # telemetry records the probe published meanwhile
    if ticks <= 0:
        raise RuntimeError("the probe published no telemetry")
    ms = (c1 - c0) / ticks * 1000
    setup = {"gpus": SHAPE.gpus, "processes": SHAPE.processes, "tick": f"{tick_s}s", "ticks": ticks,
             "span_s": span_s,
             "what": "whole `python -m services.probe` process CPU (user+system) per tick after "
                     f"{warm_s:.0f}s warm-up: fake NVML state file, /proc tree, checkpoint file, "
                     f"PodResources on a unix socket, publishing to {broker_label()}",
             "note": "allocations: a stat of the checkpoint every tick; PodResources List (and the "
                     f"snapshot compare) every podresources_interval, by default 2 ticks = {2 * tick_s:g}s "
                     "here, at once when the checkpoint changes (it does not here); "
                     "GetAllocatableResources every allocation_interval (5s); the unchanged snapshot is "
                     "re-sent every 5s. The XID thread's wait on the fake NVML polls a file (see "
                     "fake_xid_wait_ms_per_tick); the real driver blocks without CPU",
             "fake_xid_wait_ms_per_tick": round(xid_ms_per_s * tick_s, 3)}
    return Figure("probe_cpu_ms_per_tick", ms, "ms CPU/tick", setup,
                  "per-tick Python work: telemetry sample (fake NVML + /proc stat reads), protobuf encode, "
                  "Kafka producer round trip, event-loop and thread hand-offs; PodResources List every "
                  f"other tick; here also the fake NVML's polling XID wait (~{xid_ms_per_s * tick_s:.1f} ms "
                  "of each tick)", GOAL, [ms],
                  f"whole probe process, 8 GPUs x 64 processes, fake NVML + /proc + kubelet, publishing to "
                  f"{broker_label()}, {ticks} ticks", baseline="probe_sample_cpu_ms_per_tick")
