"""The joiner as deployed: real Faust workers (`python -m services.joiner` subprocesses), fed like
probes and the watcher feed it, checked against the pure core. The tests that matter run on both
brokers: the embedded one and Apache Kafka (rebalances, compacted changelogs, real end offsets).

Every test gets its own broker (so other tests' records cannot leak in) and its own app id.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner

from periscope.bus import codec
from periscope.bus import topics as T
from periscope.bus.admin import TopicPlan, ensure_topics
from periscope.bus.clients import Kafka
from periscope.bus.codec import DeadLetter
from periscope.bus.producer import Publisher
from periscope.core.engine import EngineConfig, apply, flush, new_state, output_key
from periscope.core.model import (
    AllocationEntry,
    AllocationSnapshot,
    AllocSource,
    ContainerInfo,
    DeviceInventory,
    DeviceSample,
    Finding,
    GpuInfo,
    GpuState,
    Meta,
    MigDeviceInfo,
    MigRef,
    NodeEvent,
    NodeInput,
    NodeTelemetry,
    Output,
    PodAttribution,
    PodEvent,
    PodInfo,
    ProcessSample,
    WindowStat,
)
from periscope.core.rows import RowConfig
from periscope.devkit.brokers import KINDS, LocalBroker
from tests.kafka_tier import kafka_missing

REPO = Path(__file__).resolve().parents[2]
S = 1000
T0 = 1_790_000_000_000  # event time of the scenario start (a window boundary)
WINDOW_S, LATENESS_S = 10, 3
CONFIG = EngineConfig(rows=RowConfig(window_ms=WINDOW_S * S), lateness_ms=LATENESS_S * S)
WORKER_ENV = {
    "PERISCOPE_SESSION_TIMEOUT": "3s",
    "PERISCOPE_WINDOW": f"{WINDOW_S}s",
    "PERISCOPE_LATENESS": f"{LATENESS_S}s",
    "PERISCOPE_STATE_PERSIST_INTERVAL": "2s",
    "PERISCOPE_WEB_PORT": "0",
    "PERISCOPE_LOG_LEVEL": "info",
}


# ---------------------------------------------------------------- a node with three kinds of GPU


def _uuid(prefix: str, space: int, n: int) -> str:
    return f"{prefix}{uuid.UUID(int=(space << 112) + n)}"


@dataclass
class NodeScript:
    """One node: GPU0 split into two MIG instances, GPU1 time-sliced by two pods, GPU2 exclusive."""

    name: str
    n: int
    g: list[str] = field(init=False)
    m: list[MigRef] = field(init=False)
    uids: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.g = [_uuid("GPU-", 0xA100, self.n * 16 + i) for i in range(3)]
        self.m = [MigRef(_uuid("MIG-", 0xB200, self.n * 16 + 1), "3g.40gb", 1, 0),
                  MigRef(_uuid("MIG-", 0xB200, self.n * 16 + 2), "1g.10gb", 2, 0)]
        self.uids = {p: _uuid("", 0x5A1D, self.n * 16 + i) for i, p in enumerate("abcde")}

    def meta(self, t: int, source: str = "probe") -> Meta:
        return Meta(node=self.name, source=f"{source}/{self.name}", epoch=1, seq=t, time_ms=t)

    def pod_name(self, p: str) -> str:
        return f"{dict(a='mig-a', b='mig-b', c='ts-c', d='ts-d', e='ex-e')[p]}-{self.n}"

    def state(self) -> list[tuple[T.Topic, NodeInput]]:
        gpus = (
            GpuInfo(self.g[0], 0, "NVIDIA A100-SXM4-80GB", 81920.0, mig_enabled=True, mig_devices=(
                MigDeviceInfo(self.m[0].uuid, "3g.40gb", 1, 0, 40192.0),
                MigDeviceInfo(self.m[1].uuid, "1g.10gb", 2, 0, 9856.0))),
            GpuInfo(self.g[1], 1, "NVIDIA A100-SXM4-80GB", 81920.0, minor=1),
            GpuInfo(self.g[2], 2, "NVIDIA A100-SXM4-80GB", 81920.0, minor=2),
        )
        out: list[tuple[T.Topic, NodeInput]] = [
            (T.INVENTORY, DeviceInventory(self.meta(T0), gpus, driver_version="550.54.15")),
            (T.NODES, NodeEvent(self.meta(T0, "kube_watcher"), self.name,
                                labels=(("nvidia.com/gpu.sharing-strategy", "time-slicing"),))),
        ]
        for i, p in enumerate("abcde"):
            info = PodInfo(uid=self.uids[p], namespace="ml", name=self.pod_name(p), node=self.name,
                           phase="Running", created_ms=T0, owner_kind="Job", owner_name=self.pod_name(p),
                           containers=(ContainerInfo("cuda", container_id=f"{self.n:02x}{i:062x}"),))
            out.append((T.PODS, PodEvent(Meta(self.name, "kube_watcher", 1, i + 1, T0), info)))
        holds = {"a": (self.m[0].uuid, "nvidia.com/mig-3g.40gb"),
                 "b": (self.m[1].uuid, "nvidia.com/mig-1g.10gb"),
                 "c": (f"{self.g[1]}::0", "nvidia.com/gpu"), "d": (f"{self.g[1]}::1", "nvidia.com/gpu"),
                 "e": (self.g[2], "nvidia.com/gpu")}
        entries: list[AllocationEntry] = []
        for p, (dev, res) in holds.items():
            entries.append(AllocationEntry(AllocSource.PODRESOURCES, "cuda", res, (dev,), namespace="ml",
                                           pod=self.pod_name(p)))
            entries.append(AllocationEntry(AllocSource.CHECKPOINT, "cuda", res, (dev,), pod_uid=self.uids[p]))
        out.append((T.ALLOCATIONS, AllocationSnapshot(self.meta(T0 + S), tuple(entries))))
        return out

    def telemetry(self, k: int) -> NodeTelemetry:
        """Sample k (event time T0 + (2 + k) s); utilization moves so windows and averages change."""
        u = self.uids
        busy = 60.0 + (k * 7 + self.n) % 30

        def proc(pid: int, p: str, sm: float | None, mib: float) -> ProcessSample:
            return ProcessSample(pid=pid, pod_uid=u[p], sm_util_pct=sm, used_mib=mib)

        devices = (
            DeviceSample(self.g[0], index=0, power_w=250.0, temp_c=50.0),
            DeviceSample(self.m[0].uuid, parent_uuid=self.g[0], mig=self.m[0], fb_used_mib=12000.0 + k,
                         fb_total_mib=40192.0, processes=(proc(501, "a", None, 12000.0 + k),)),
            DeviceSample(self.m[1].uuid, parent_uuid=self.g[0], mig=self.m[1], fb_used_mib=3000.0,
                         fb_total_mib=9856.0, processes=(proc(502, "b", None, 3000.0),)),
            DeviceSample(self.g[1], index=1, util_pct=80.0, fb_used_mib=7000.0, fb_total_mib=81920.0,
                         power_w=200.0, temp_c=60.0,
                         processes=(proc(601, "c", 50.0, 4000.0), proc(602, "d", 30.0, 3000.0))),
            DeviceSample(self.g[2], index=2, util_pct=busy, fb_used_mib=20000.0, fb_total_mib=81920.0,
                         power_w=300.0, temp_c=65.0, processes=(proc(701, "e", busy, 20000.0),)),
        )
        return NodeTelemetry(self.meta(T0 + (2 + k) * S), devices)


def sample_time(k: int) -> int:
    return T0 + (2 + k) * S


def nodes_on_all_partitions(count: int, partitions: int = 4) -> list[NodeScript]:
    """Node names chosen so that every partition of the inputs holds some of them."""
    part, all_ = DefaultPartitioner(), list(range(partitions))
    by_partition: dict[int, list[str]] = {}
    i = 0
    while sum(len(v) for v in by_partition.values()) < count:
        name = f"gpu-node-{i}"
        p = part(name.encode(), all_, all_)
        if len(by_partition.setdefault(p, [])) < count // partitions:
            by_partition[p].append(name)
        i += 1
    names = sorted(n for v in by_partition.values() for n in v)
    return [NodeScript(name, j + 1) for j, name in enumerate(names)]


# ---------------------------------------------------------------- reference: the pure core alone


def reference(events: list[tuple[T.Topic, NodeInput]]) -> dict[str, Output]:
    """The last output per key that the core computes over the same events (what replay would say)."""
    last: dict[str, Output] = {}
    for o in reference_outputs(events):
        last[output_key(o)] = o
    return last


def reference_outputs(events: list[tuple[T.Topic, NodeInput]]) -> list[Output]:
    """Every output the core computes over the same events, in order."""
    states: dict[str, Any] = {}
    outs: list[Output] = []
    for _, ev in events:
        node = ev.name if isinstance(ev, NodeEvent) else ev.meta.node
        state = states.setdefault(node, new_state(node))
        outs.extend(apply(state, ev, CONFIG))
    for state in states.values():
        outs.extend(flush(state, CONFIG))
    # Through the wire format and back, as a subscriber sees it.
    return [codec.decode(_topic_of(o), codec.encode(o)) for o in outs]


def _topic_of(o: Output) -> T.Topic:
    if isinstance(o, PodAttribution):
        return T.ATTRIBUTION
    return T.GPUS if isinstance(o, GpuState) else T.FINDINGS


# ---------------------------------------------------------------- the bus side of a test


@contextlib.asynccontextmanager
async def fresh_broker(kind: str, tmp: Path, partitions: int = 4) -> AsyncIterator[Kafka]:
    """A broker of its own, every topic created with `partitions` partitions."""
    if kind == "kafka" and kafka_missing():
        pytest.skip(kafka_missing())
    broker = LocalBroker(kind, tmp / f"{kind}-broker")  # type: ignore[arg-type]
    await asyncio.to_thread(broker.start)
    try:
        await ensure_topics(broker.client(), plan=TopicPlan(partitions=partitions))
        yield broker.client()
    finally:
        await asyncio.to_thread(broker.stop)


@pytest.fixture
async def bootstrap(tmp_path: Path) -> AsyncIterator[Kafka]:
    """A fresh embedded broker."""
    async with fresh_broker("embedded", tmp_path) as kafka:
        yield kafka


@pytest.fixture(params=KINDS)
async def fresh(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Kafka]:
    """A fresh broker of each kind in turn."""
    async with fresh_broker(request.param, tmp_path) as kafka:
        yield kafka


@dataclass
class Seen:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    obj: Any


class OutputLog:
    """Every record of the output and dead-letter topics, read from the beginning, in partition order."""

    TOPICS = (T.ATTRIBUTION, T.GPUS, T.FINDINGS, T.DEADLETTER)

    def __init__(self, kafka: Kafka) -> None:
        self.kafka = kafka
        self.records: list[Seen] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> OutputLog:
        admin = self.kafka.admin("test-output-log")
        await admin.start()
        try:
            described = await admin.describe_topics([t.name for t in self.TOPICS])
        finally:
            await admin.close()
        consumer = self.kafka.consumer(client_id="test-output-log")
        await consumer.start()
        consumer.assign([TopicPartition(d["topic"], p["partition"])
                         for d in described for p in d["partitions"]])
        self._task = asyncio.create_task(self._read(consumer))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _read(self, consumer: AIOKafkaConsumer) -> None:
        try:
            while True:
                batch = await consumer.getmany(timeout_ms=200)
                for tp, recs in batch.items():
                    for r in recs:
                        obj = codec.decode(T.BY_NAME[tp.topic], r.value)
                        self.records.append(Seen(tp.topic, tp.partition, r.offset, r.key, obj))
        finally:
            await consumer.stop()

    def outputs(self) -> list[Output]:
        return [s.obj for s in self.records if s.topic != T.DEADLETTER.name]

    def dead_letters(self) -> list[DeadLetter]:
        return [s.obj for s in self.records if s.topic == T.DEADLETTER.name]

    def latest(self) -> dict[str, Output]:
        last: dict[str, Output] = {}
        for o in self.outputs():
            last[output_key(o)] = o
        return last

    async def wait_for(self, what: str, cond: Callable[[OutputLog], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not cond(self):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            await asyncio.sleep(0.2)


def caught_up(nodes: list[NodeScript], k: int) -> Callable[[OutputLog], bool]:
    """True once every pod of every node has the attribution the core publishes last up to sample k
    (published on change or heartbeat: an unchanged pod's latest may be older than sample k)."""
    want: dict[str, int] = {}
    for n in nodes:
        ref = reference([*n.state(), *((T.TELEMETRY, n.telemetry(i)) for i in range(k + 1))])
        for u in n.uids.values():
            att = ref.get("pod/" + u)
            want[u] = att.as_of_ms if isinstance(att, PodAttribution) else sample_time(k)

    def cond(log: OutputLog) -> bool:
        latest = log.latest()
        return all(
            isinstance(a := latest.get("pod/" + u), PodAttribution) and a.as_of_ms >= t
            for u, t in want.items()
        )

    return cond


def published_windows(outputs: Iterable[Output], pod_uid: str) -> list[WindowStat]:
    """The closed windows of a pod's (single) row as a subscriber merges them: by start, a repeat
    replacing the earlier copy."""
    merged: dict[int, WindowStat] = {}
    for o in outputs:
        if isinstance(o, PodAttribution) and o.pod_uid == pod_uid:
            merged.update((w.start_ms, w) for w in o.rows[0].windows)
    return [merged[k] for k in sorted(merged)]


async def publish_state(pub: Publisher, nodes: list[NodeScript]) -> list[tuple[T.Topic, NodeInput]]:
    events = [e for n in nodes for e in n.state()]
    for topic, ev in events:
        await pub.send(topic, ev.name if isinstance(ev, NodeEvent) else ev.meta.node, ev)
    return events


async def publish_samples(pubs: list[Publisher], nodes: list[NodeScript], ks: range,
                          pace_s: float = 0.05) -> list[tuple[T.Topic, NodeInput]]:
    """One telemetry sample per node per step, like probes ticking (event time advances 1 s a step)."""
    events: list[tuple[T.Topic, NodeInput]] = []
    for k in ks:
        batch = [(n.name, n.telemetry(k)) for n in nodes]
        for pub in pubs:
            await pub.send_many(T.TELEMETRY, batch)
        events += [(T.TELEMETRY, t) for _, t in batch]
        await asyncio.sleep(pace_s)
    return events


# ---------------------------------------------------------------- worker processes


class Worker:
    """`python -m services.joiner` in its own process group, output in a log file."""

    def __init__(self, kafka: Kafka, app_id: str, tmp: Path, name: str) -> None:
        self.log_path = tmp / f"{name}.log"
        env = {**os.environ, **WORKER_ENV, "PERISCOPE_KAFKA_BOOTSTRAP": kafka.bootstrap,
               "PERISCOPE_KAFKA_PROFILE": kafka.profile.name, "PERISCOPE_APP_ID": app_id,
               "PERISCOPE_DATA_DIR": str(tmp / f"{name}-data")}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "services.joiner"], cwd=REPO, env=env,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.url = ""

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def ready(self, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            if self.get("/readyz")[0] == 200:
                return self.url
            if time.monotonic() > deadline:
                raise AssertionError(f"worker not ready after {timeout}s:\n{self.log()[-3000:]}")
            await asyncio.sleep(0.2)

    def get(self, path: str) -> tuple[int, str]:
        # The last address announced: a worker that restarts itself (see RecoveryWatch) binds anew.
        urls = re.findall(r"^joiner: (http://\S+)$", self.log(), re.M)
        if not urls:
            return 0, ""
        self.url = urls[-1]
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError:
            return 0, ""

    def metrics(self) -> dict[str, float]:
        """Prometheus samples as {'name{labels}': value}."""
        status, text = self.get("/metrics")
        assert status == 200
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def assignment(self) -> dict[str, set[int]]:
        """Input partitions this worker holds, per topic (from its lag gauge)."""
        held: dict[str, set[int]] = {t.name: set() for t in T.NODE_INPUTS}
        for k in self.metrics():
            if m := re.match(r'periscope_joiner_consumer_lag\{partition="(\d+)",topic="([^"]+)"\}', k):
                held[m.group(2)].add(int(m.group(1)))
        return held

    def partitions(self) -> set[int]:
        """The partition numbers this worker holds of every input topic alike (empty until it does)."""
        held = list(self.assignment().values())
        return held[0] if all(h == held[0] for h in held) else set()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout: float = 30, sig: signal.Signals = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"worker did not stop on SIGTERM:\n{self.log()[-3000:]}") from None
        return self.proc.returncode


@contextlib.contextmanager
def workers(*ws: Worker) -> Iterator[tuple[Worker, ...]]:
    """Kills the workers still running at the end; then checks that none ran with a table whose
    changelog partitions were left out of its assignment (that state was never recovered)."""
    try:
        yield ws
    finally:
        for w in ws:
            if w.proc.poll() is None:
                w.kill()
    for w in ws:
        lines = [line for line in w.log().splitlines() if "not assigned with their input partitions" in line]
        assert not lines, f"{w.log_path.name}: " + "\n".join(lines)


def summary(o: Output) -> Any:
    """What a mismatch report shows of an output."""
    if isinstance(o, PodAttribution):
        return replace(o, rows=tuple(replace(r, windows=()) for r in o.rows))
    return o


# ---------------------------------------------------------------- tests


async def test_mig_time_sliced_and_exclusive_gpus_come_out_as_pod_uid_rows(bootstrap: Kafka, tmp_path: Path,
                                                                          unique: str) -> None:
    node = NodeScript("gpu-a", 1)
    with workers(Worker(bootstrap, f"joiner-rows-{unique}", tmp_path, "w")) as (w,):
        await w.ready()
        async with Publisher(bootstrap, "test-probe") as pub, OutputLog(bootstrap) as log:
            events = await publish_state(pub, [node])
            await asyncio.sleep(0.5)  # state first, as in a live cluster; samples follow
            events += await publish_samples([pub], [node], range(12))
            await log.wait_for("the last sample's attribution", caught_up([node], 11), timeout=30)
            await asyncio.sleep(0.5)
        assert w.stop(sig=signal.SIGINT) == 0  # Ctrl-C stops it as cleanly as SIGTERM

    latest = log.latest()
    pods = [latest["pod/" + node.uids[p]] for p in "abcde"]
    assert all(isinstance(x, PodAttribution) for x in pods)
    a, b, c, d, e = (x for x in pods if isinstance(x, PodAttribution))
    assert (e.namespace, e.pod, e.node, e.owner_kind) == ("ml", "ex-e-1", "gpu-a", "Job")
    [ra], [rb], [rc], [rd], [re_] = a.rows, b.rows, c.rows, d.rows, e.rows
    # MIG: the row names the instance and resolves to the parent GPU; NVML has no util for a slice.
    assert (ra.sharing, ra.gpu_uuid, ra.mig, ra.device_id) == ("mig", node.g[0], node.m[0], node.m[0].uuid)
    assert (ra.util_pct, ra.fb_used_mib) == (None, 12011.0)
    assert (rb.sharing, rb.mig, rb.fb_used_mib) == ("mig", node.m[1], 3000.0)
    # Time-slicing: one UUID, two pods, utilization and memory split by their processes.
    assert {(r.sharing, r.share_basis, r.gpu_uuid) for r in (rc, rd)} == {
        ("time-slicing", "process", node.g[1])}
    assert (rc.util_pct, rd.util_pct, rc.fb_used_mib, rd.fb_used_mib) == (50.0, 30.0, 4000.0, 3000.0)
    assert (rc.device_id, rd.device_id) == (f"{node.g[1]}::0", f"{node.g[1]}::1")
    # Exclusive: the whole device.
    assert (re_.sharing, re_.share_basis, re_.gpu_uuid) == ("exclusive", "exclusive", node.g[2])
    assert re_.util_pct == node.telemetry(11).devices[4].util_pct
    assert set(re_.sources) >= {"checkpoint", "podresources", "process"}
    assert re_.first_seen_ms == sample_time(0) and re_.sample_ms == sample_time(11)
    # 10 s tumbling windows on event time, each published once it closed: the first (8 samples) closed
    # at sample 8; the open one (samples 8-11) is not published yet.
    assert [w.samples for w in published_windows(log.outputs(), node.uids["e"])] == [8]
    assert re_.windows == ()
    gpu1 = latest["gpu/" + node.g[1]]
    assert isinstance(gpu1, GpuState) and gpu1.sharing == "time-slicing"
    assert {o.pod_uid for o in gpu1.owners} == {node.uids["c"], node.uids["d"]}
    # The live worker says exactly what the pure core says over the same events (replay agrees).
    assert latest == reference(events)
    # Outputs are emitted on change, once per sample at most, never once per input message per key.
    per_key: dict[str, list[int]] = {}
    for o in log.outputs():
        if isinstance(o, PodAttribution):
            per_key.setdefault(o.pod_uid, []).append(o.as_of_ms)
    assert per_key[node.uids["e"]] == [sample_time(k) for k in range(12)]


async def test_garbage_on_every_input_topic_is_dead_lettered_and_processing_goes_on(
        bootstrap: Kafka, tmp_path: Path, unique: str) -> None:
    node = NodeScript("gpu-b", 2)
    garbage = b"not a protobuf \xff\x00"
    app_id = f"joiner-dlq-{unique}"
    async with Publisher(bootstrap, "test-probe") as pub, OutputLog(bootstrap) as log:
        with workers(Worker(bootstrap, app_id, tmp_path, "w")) as (w,):
            await w.ready()
            await publish_state(pub, [node])
            await asyncio.sleep(0.5)
            await publish_samples([pub], [node], range(3))
            for topic in T.NODE_INPUTS:
                await pub.send_raw(topic.name, node.name.encode(), garbage)
            # Valid protobuf, but its key names another node: it would land in the wrong state.
            await pub.send(T.TELEMETRY, "gpu-elsewhere", node.telemetry(3))
            await publish_samples([pub], [node], range(3, 8))
            await log.wait_for("samples after the garbage", caught_up([node], 7), timeout=30)
            await log.wait_for("7 dead letters", lambda lg: len(lg.dead_letters()) >= 7, timeout=10)
            metrics = w.metrics()
            assert w.stop() == 0  # SIGTERM: persists every node and commits before leaving
        # A clean restart reads nothing twice: no garbage again, no sample again.
        with workers(Worker(bootstrap, app_id, tmp_path, "again")) as (again,):
            await again.ready()
            await publish_samples([pub], [node], range(8, 11))
            await log.wait_for("samples after the restart", caught_up([node], 10), timeout=30)
            after = again.metrics()
            assert again.stop() == 0

    letters = log.dead_letters()
    assert len(letters) == 7
    bad = [x for x in letters if x.value == garbage]
    assert sorted(x.topic for x in bad) == sorted(t.name for t in T.NODE_INPUTS)
    assert all(x.key == node.name.encode() and x.service == "joiner" and x.error for x in bad)
    [wrong] = [x for x in letters if x.value != garbage]
    assert wrong.topic == T.TELEMETRY.name and wrong.key == b"gpu-elsewhere" and "gpu-b" in wrong.error
    assert codec.decode(T.TELEMETRY, wrong.value) == node.telemetry(3)
    assert sum(v for k, v in metrics.items() if k.startswith("periscope_joiner_dead_letters_total")) == 7
    assert metrics['periscope_joiner_events_in_total{topic="periscope.node.telemetry.v1"}'] == 10
    assert metrics["periscope_joiner_unattributed_samples_total"] == 0
    assert metrics["periscope_joiner_late_samples_total"] == 0
    assert metrics["periscope_joiner_ambiguous_joins_total"] == 0
    assert after['periscope_joiner_events_in_total{topic="periscope.node.telemetry.v1"}'] == 3
    assert after["periscope_joiner_node_recoveries_total"] == 1
    assert after["periscope_joiner_redelivered_events_total"] == 0
    assert not any(k.startswith("periscope_joiner_dead_letters_total") for k in after)
    # Every sample counted once across the restart: the same windows and averages as the core alone
    # over samples 0-10 (the first window closed at sample 8; samples 8-10 are in the open one).
    e = log.latest()["pod/" + node.uids["e"]]
    ref = reference_outputs([*node.state(), *((T.TELEMETRY, node.telemetry(k)) for k in range(11))])
    assert e == [o for o in ref if output_key(o) == "pod/" + node.uids["e"]][-1]
    assert sum(w.samples for w in published_windows(log.outputs(), node.uids["e"])) == 8


async def test_sigkill_mid_stream_recovers_pod_state_and_never_regresses(fresh: Kafka, tmp_path: Path,
                                                                         unique: str) -> None:
    """Two workers; one is SIGKILLed mid-stream (its nodes move to the survivor, rebuilt from the
    changelogs), then started again (the nodes are split once more)."""
    nodes = nodes_on_all_partitions(4)
    app_id = f"joiner-kill-{unique}"
    victim, survivor = (Worker(fresh, app_id, tmp_path, name) for name in ("victim", "survivor"))
    with workers(victim, survivor):
        for w in (victim, survivor):
            await w.ready()
        async with Publisher(fresh, "test-probe") as pub, OutputLog(fresh) as log:
            events = await publish_state(pub, nodes)
            await asyncio.sleep(0.5)
            stream = asyncio.create_task(publish_samples([pub], nodes, range(60), pace_s=0.1))
            await log.wait_for("outputs of sample 20", caught_up(nodes, 20), timeout=30)
            assert victim.partitions() and survivor.partitions()
            victim.kill()  # SIGKILL: no shutdown hook runs; unpersisted state and unsent outputs are lost
            killed_at = max(o.as_of_ms for o in log.outputs() if isinstance(o, PodAttribution))
            await asyncio.sleep(4)  # past the session timeout: the survivor takes every partition
            restarted = Worker(fresh, app_id, tmp_path, "restarted")
            with workers(restarted):
                events += await stream
                await restarted.ready()
                await log.wait_for("the last sample after the restart", caught_up(nodes, 59), timeout=60)
                await asyncio.sleep(1.0)
                recovered = [w.metrics()["periscope_joiner_node_recoveries_total"]
                             for w in (survivor, restarted)]
                for w in (survivor, restarted):
                    assert w.stop() == 0

    assert killed_at < sample_time(59)
    assert "state recovered" in survivor.log()  # it took over the victim's nodes from the changelogs
    assert sum(recovered) >= len(nodes) / 2
    # No subscriber ever sees a key go back in time.
    last_seen: dict[str, int] = {}
    for o in log.outputs():
        key = output_key(o)
        t = o.at_ms if isinstance(o, Finding) else o.as_of_ms
        assert t >= last_seen.get(key, 0), f"{key} went back from {last_seen[key]} to {t}"
        last_seen[key] = t
    # No pod lost its history: first_seen, every window and every sample count are those of an
    # uninterrupted run, i.e. of the pure core over the same events.
    expected, latest = reference(events), log.latest()
    assert latest.keys() == expected.keys()
    for key, want in expected.items():
        assert latest[key] == want, f"{key}:\n got  {summary(latest[key])}\n want {summary(want)}"
    # Every closed window reached subscribers (at least once; merged by start) as the core computed it.
    ref_outputs = reference_outputs(events)
    for n in nodes:
        e = latest["pod/" + n.uids["e"]]
        assert isinstance(e, PodAttribution) and e.rows[0].first_seen_ms == sample_time(0)
        windows = published_windows(log.outputs(), n.uids["e"])
        assert windows == published_windows(ref_outputs, n.uids["e"])
        assert sum(w.samples for w in windows) == 58  # samples 58 and 59 are in the open window


async def test_a_restart_on_a_backlog_reads_each_record_once(fresh: Kafka, tmp_path: Path,
                                                             unique: str) -> None:
    """A worker stops cleanly; samples pile up; its successor in the group reads the backlog from the
    committed offsets. Each record is stepped once, and none comes back as a late sample. (Records
    fetched while the seek to the committed offsets runs are the ones Faust would hand over twice: a
    race the fetch wins only now and then, so test_faust_drain pins that case down.)"""
    nodes = nodes_on_all_partitions(4)
    app_id = f"joiner-restart-{unique}"
    async with Publisher(fresh, "test-probe") as pub, OutputLog(fresh) as log:
        with workers(Worker(fresh, app_id, tmp_path, "first")) as (first,):
            await first.ready()
            await publish_state(pub, nodes)
            await asyncio.sleep(0.5)
            await publish_samples([pub], nodes, range(5))
            await log.wait_for("outputs of sample 4", caught_up(nodes, 4), timeout=60)
            assert first.stop() == 0
        await publish_samples([pub], nodes, range(5, 65), pace_s=0.0)
        with workers(Worker(fresh, app_id, tmp_path, "second")) as (second,):
            await second.ready()
            await log.wait_for("outputs of sample 64", caught_up(nodes, 64), timeout=60)
            after = second.metrics()
            assert second.stop() == 0
    assert after[f'periscope_joiner_events_in_total{{topic="{T.TELEMETRY.name}"}}'] == 60 * len(nodes)
    assert after["periscope_joiner_late_samples_total"] == 0


async def test_two_workers_split_the_nodes_and_together_say_what_one_worker_says(
        bootstrap: Kafka, tmp_path: Path, unique: str) -> None:
    nodes = nodes_on_all_partitions(8)
    async with fresh_broker("embedded", tmp_path / "other") as other:
        solo = Worker(bootstrap, f"joiner-solo-{unique}", tmp_path, "solo")
        pair = (Worker(other, f"joiner-pair-{unique}", tmp_path, "pair1"),
                Worker(other, f"joiner-pair-{unique}", tmp_path, "pair2"))
        with workers(solo, *pair):
            for w in (solo, *pair):
                await w.ready()
            deadline = time.monotonic() + 60
            while not (pair[0].partitions() and pair[1].partitions()
                       and pair[0].partitions() | pair[1].partitions() == {0, 1, 2, 3}
                       and not pair[0].partitions() & pair[1].partitions()):
                assert time.monotonic() < deadline, (
                    f"the workers never split the partitions, each holding the same numbers of every input "
                    f"topic: {pair[0].assignment()} / {pair[1].assignment()}")
                await asyncio.sleep(0.3)
            async with (Publisher(bootstrap, "test-probe") as pub_solo,
                        Publisher(other, "test-probe") as pub_pair,
                        OutputLog(bootstrap) as log_solo, OutputLog(other) as log_pair):
                events: list[tuple[T.Topic, NodeInput]] = []
                for pub in (pub_solo, pub_pair):
                    events = await publish_state(pub, nodes)
                await asyncio.sleep(0.5)
                events += await publish_samples([pub_solo, pub_pair], nodes, range(15))
                for log in (log_solo, log_pair):
                    await log.wait_for("every pod's last sample", caught_up(nodes, 14), timeout=40)
                await asyncio.sleep(0.5)
                held = [w.metrics()["periscope_joiner_nodes"] for w in pair]
            for w in (solo, *pair):
                assert w.stop() == 0

    # The pair really split the work: each held some nodes, none held all of them.
    assert sum(held) == len(nodes) and all(0 < n < len(nodes) for n in held)
    assert log_pair.latest() == log_solo.latest() == reference(events)


async def test_three_workers_on_twelve_partitions_lose_nothing_when_one_is_killed(
        tmp_path: Path, unique: str, broker_kind: str) -> None:
    """A consumer group of three on 12 partitions: the workers split the nodes with every input topic's
    same-numbered partitions together (no node's state split across workers); one is SIGKILLed
    mid-stream and the two others take its nodes over from the changelogs; what subscribers see in
    the end is what the pure core computes over the same events, and no key goes back in time."""
    partitions = 12
    nodes = nodes_on_all_partitions(12, partitions)
    app_id = f"joiner-three-{unique}"
    async with fresh_broker(broker_kind, tmp_path, partitions) as kafka:
        trio = [Worker(kafka, app_id, tmp_path, f"w{i}") for i in range(3)]
        with workers(*trio):
            for w in trio:
                await w.ready()
            deadline = time.monotonic() + 90
            while True:
                held = [w.partitions() for w in trio]
                if all(held) and set().union(*held) == set(range(partitions)) and sum(map(len, held)) == 12:
                    break  # each holds some, together all, none twice; each the same numbers on every topic
                assert time.monotonic() < deadline, f"no clean split: {[w.assignment() for w in trio]}"
                await asyncio.sleep(0.3)
            async with Publisher(kafka, "test-probe") as pub, OutputLog(kafka) as log:
                events = await publish_state(pub, nodes)
                await asyncio.sleep(0.5)
                stream = asyncio.create_task(publish_samples([pub], nodes, range(40), pace_s=0.1))
                await log.wait_for("outputs of sample 12", caught_up(nodes, 12), timeout=60)
                victim, survivors = trio[0], trio[1:]
                victim.kill()
                events += await stream
                await log.wait_for("the last sample after the rebalance", caught_up(nodes, 39), timeout=90)
                await asyncio.sleep(1.0)
                held_nodes = [w.metrics()["periscope_joiner_nodes"] for w in survivors]
                split = [w.partitions() for w in survivors]
                for w in survivors:
                    assert w.stop() == 0

    assert sum(held_nodes) == len(nodes) and all(n > 0 for n in held_nodes)
    assert set().union(*split) == set(range(partitions)) and not split[0] & split[1]
    last_seen: dict[str, int] = {}
    for o in log.outputs():
        key = output_key(o)
        t = o.at_ms if isinstance(o, Finding) else o.as_of_ms
        assert t >= last_seen.get(key, 0), f"{key} went back from {last_seen[key]} to {t}"
        last_seen[key] = t
    expected, latest = reference(events), log.latest()
    assert latest.keys() == expected.keys()
    for key, want in expected.items():
        assert latest[key] == want, f"{key}:\n got  {summary(latest[key])}\n want {summary(want)}"


async def test_a_worker_rides_out_an_apache_kafka_restart_with_its_log_directory_kept(
        tmp_path: Path, unique: str) -> None:
    """Apache Kafka stopped and started again on the same directory (and ports): every record, committed
    offset and changelog is still there, the running worker reconnects by itself, and what subscribers
    see in the end is what the pure core computes over everything that was published."""
    if kafka_missing():
        pytest.skip(kafka_missing())
    nodes = [NodeScript("gpu-restart", 1)]
    broker = LocalBroker("kafka", tmp_path / "kafka")
    await asyncio.to_thread(broker.start)
    try:
        kafka = broker.client()
        await ensure_topics(kafka)
        with workers(Worker(kafka, f"joiner-restart-{unique}", tmp_path, "w")) as (w,):
            await w.ready()
            async with Publisher(kafka, "test-probe") as pub:
                events = await publish_state(pub, nodes)
                await asyncio.sleep(0.5)
                events += await publish_samples([pub], nodes, range(10), pace_s=0.1)
            async with OutputLog(kafka) as log:
                await log.wait_for("outputs of sample 9", caught_up(nodes, 9), timeout=60)
            await asyncio.to_thread(broker.stop)
            await asyncio.to_thread(broker.start)
            async with Publisher(kafka, "test-probe-2") as pub:
                events += await publish_samples([pub], nodes, range(10, 25), pace_s=0.1)
            async with OutputLog(kafka) as log:  # read from the beginning: nothing before the stop is lost
                await log.wait_for("outputs of the last sample", caught_up(nodes, 24), timeout=90)
                await asyncio.sleep(1.0)
            assert w.stop() == 0
    finally:
        await asyncio.to_thread(broker.stop)
    assert log.latest() == reference(events)
    e = log.latest()["pod/" + nodes[0].uids["e"]]
    assert isinstance(e, PodAttribution) and e.rows[0].first_seen_ms == sample_time(0)


async def test_a_fresh_group_on_a_ten_minute_backlog_publishes_only_owners_replay_gives(
        tmp_path: Path, unique: str, broker_kind: str) -> None:
    """A new consumer group starts on ten minutes of a churning cluster's input already on the topics:
    Faust hands out every topic's records round-robin, so telemetry and XIDs arrive ahead of the
    allocations and pods of their time. With event-time alignment no GPU record names an owner the pure
    core (what replay gives) would not name at that time, and every XID names its owner at the error."""
    from periscope.devkit.workload import ClusterSpec, timeline

    # Eight nodes: the backlog is a dozen of the worker's input batches (at most TAKE_MAX records each),
    # with a hundred XIDs spread over it.
    spec = ClusterSpec(nodes=8, gpus_per_node=4, duration_ms=600_000, pod_lifetime_ms=120_000, gap_ms=5000,
                       xid_every_ms=45_000, idle_every=0, seed=7)
    events = list(timeline(spec))
    ref = reference_outputs([(t, ev) for t, ev in events])
    want_xids = sorted((f.key, f.at_ms, tuple(x.pod_uid for x in f.owners)) for f in ref
                       if isinstance(f, Finding) and f.kind == "xid-owner")

    def xids(lg: OutputLog) -> list[tuple[str, int, tuple[str, ...]]]:
        return sorted((f.key, f.at_ms, tuple(x.pod_uid for x in f.owners)) for f in lg.outputs()
                      if isinstance(f, Finding) and f.kind == "xid-owner")

    async with fresh_broker(broker_kind, tmp_path) as kafka:
        # Every run of a topic is awaited before the next: lingering would only delay each (20 ms: 75 s).
        async with Publisher(kafka, "test-probe", linger_ms=0) as pub:
            for topic, run in itertools.groupby(events, key=lambda e: e[0]):
                await pub.send_many(topic, [(_node(ev), ev) for _, ev in run])
        async with OutputLog(kafka) as log:
            with workers(Worker(kafka, f"joiner-backlog-{unique}", tmp_path, "w")) as (w,):
                await w.ready()
                last = spec.start_ms + (spec.ticks - 1) * spec.tick_ms
                await log.wait_for("every GPU's state at the last tick and every XID finding", lambda lg: all(
                    isinstance(g := lg.latest().get("gpu/" + u), GpuState) and g.as_of_ms >= last - 10 * S
                    for u in _gpus(spec)) and set(want_xids) <= set(xids(lg)), timeout=120)
                await asyncio.sleep(1.0)
                assert w.stop() == 0
    by_gpu: dict[str, list[GpuState]] = {}
    for o in ref:
        if isinstance(o, GpuState):
            by_gpu.setdefault(o.gpu_uuid, []).append(o)
    live_gpus = [o for o in log.outputs() if isinstance(o, GpuState)]
    # Every GPU record published is checked: each GPU's last state, and those published during the
    # catch-up. A worker catching up publishes only the newest state per GPU, at each persist that
    # starts while it catches up; how many start is timing. A persist is a chain of broker round trips,
    # and a worker catching up gives the event loop one turn per input batch (about 150 ms each here),
    # so its first persist has outlasted the whole two-second catch-up: none may fall inside the
    # backlog. Those publications are pinned by test_joiner_newest; here the XID findings, every one
    # published, check owners all through the backlog.
    assert {o.gpu_uuid for o in live_gpus} == set(_gpus(spec))
    wrong = []
    for o in live_gpus:
        refs = [r for r in by_gpu[o.gpu_uuid] if r.as_of_ms <= o.as_of_ms]
        want = {x.pod_uid for x in refs[-1].owners} if refs else set()
        if {x.pod_uid for x in o.owners} != want:
            wrong.append((o.gpu_uuid, o.as_of_ms, sorted(x.pod_uid for x in o.owners), sorted(want)))
    assert wrong == [], f"{len(wrong)} of {len(live_gpus)} GPU records name other owners: {wrong[:3]}"
    assert want_xids and set(xids(log)) == set(want_xids)  # and none naming another owner


def _node(ev: NodeInput) -> str:
    return ev.name if isinstance(ev, NodeEvent) else ev.meta.node


def _gpus(spec: Any) -> list[str]:
    from periscope.devkit.workload import gpu_uuid

    return [gpu_uuid(n, g) for n in range(spec.nodes) for g in range(spec.gpus_per_node)]
