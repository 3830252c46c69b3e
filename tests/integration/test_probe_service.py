"""The probe end to end: fake kubelet (gRPC over a unix socket), NVML stand-in, /proc tree, real broker.

The probe runs in-process with the real Publisher; what it published is read back from the broker
and decoded with the bus codec.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from periscope.bus import topics
from periscope.bus.admin import ensure_topics
from periscope.bus.clients import Kafka
from periscope.core.deviceid import parse_device_id
from periscope.core.model import (
    AllocationSnapshot,
    AllocSource,
    DeviceInventory,
    NodeTelemetry,
    XidEvent,
)
from periscope.devkit.consumer import ConsumerStats, consume
from periscope.devkit.embedded import EmbeddedBroker
from periscope.devkit.launch import free_port
from periscope.kubelet.checkpoint import CheckpointEntry, render_checkpoint
from periscope.settings.probe import ProbeSettings
from periscope.sim.kubelet import FakeClaim, FakeClaimDevice, FakeContainer, FakeDevices, FakeKubelet, FakePod
from periscope.sim.nvml import add_xid, write_nvml_state
from periscope.sim.procfs import FakeProcfs
from services.probe.buffer import Kind
from services.probe.service import Probe
from tests.kafka_tier import embedded, settings_of

T = TypeVar("T")
GPU0 = "GPU-0a0a0a0a-1111-2222-3333-444455556666"
GPU1 = "GPU-1b1b1b1b-1111-2222-3333-444455556666"
MIG_A = "MIG-2c2c2c2c-1111-2222-3333-444455556666"
MIG_B = "MIG-3d3d3d3d-1111-2222-3333-444455556666"
UID_A = "aaaaaaaa-0000-4000-8000-000000000001"
UID_B = "bbbbbbbb-0000-4000-8000-000000000002"
CID_A = "a1" * 32
CID_B = "b2" * 32
CID_C = "c3" * 32
NODE_TOPICS = (topics.ALLOCATIONS, topics.TELEMETRY, topics.XID, topics.INVENTORY)


def nvml_state() -> dict[str, Any]:
    return {
        "driver_version": "550.54.15",
        "cuda_driver_version": 12040,
        "gpus": [
            {
                "uuid": GPU0,
                "name": "NVIDIA A100-SXM4-80GB",
                "minor": 0,
                "memory_total_mib": 81920,
                "memory_used_mib": 30000,
                "util_pct": 80,
                "power_w": 300,
                "temp_c": 60,
                "processes": [
                    {"pid": 1001, "used_mib": 20000, "sm_util": 50},
                    {"pid": 1002, "used_mib": 10000, "sm_util": 30},
                    {"pid": 1003, "used_mib": 5},
                ],
            },
            {
                "uuid": GPU1,
                "name": "NVIDIA A100-SXM4-80GB",
                "minor": 1,
                "memory_total_mib": 81920,
                "power_w": 100,
                "temp_c": 45,
                "mig": [
                    {
                        "uuid": MIG_A,
                        "profile": "1g.10gb",
                        "gi": 9,
                        "ci": 0,
                        "profile_id": 19,
                        "placement_start": 0,
                        "placement_size": 1,
                        "memory_total_mib": 9856,
                        "memory_used_mib": 4000,
                        "processes": [{"pid": 2001, "used_mib": 4000}],
                    },
                    {
                        "uuid": MIG_B,
                        "profile": "3g.40gb",
                        "gi": 2,
                        "ci": 0,
                        "profile_id": 9,
                        "placement_start": 4,
                        "placement_size": 4,
                        "memory_total_mib": 40192,
                    },
                ],
            },
        ],
    }


POD_A = FakePod(
    "ml", "train-0", (FakeContainer("cuda", (FakeDevices("nvidia.com/gpu", (GPU0 + "::1",), (0,)),)),)
)
POD_B = FakePod(
    "ml", "infer-0", (FakeContainer("infer", (FakeDevices("nvidia.com/mig-1g.10gb", (MIG_A,), (1,)),)),)
)
POD_C = FakePod(
    "serve",
    "dra-0",
    (
        FakeContainer(
            "main",
            claims=(FakeClaim("gpu-claim", "serve", (FakeClaimDevice("gpu.nvidia.com", "node", "gpu-0"),)),),
        ),
    ),
)
POD_D = FakePod(
    "ml", "train-1", (FakeContainer("cuda", (FakeDevices("nvidia.com/gpu", (GPU0 + "::2",), (0,)),)),)
)
CHECKPOINT = [
    CheckpointEntry(UID_A, "cuda", "nvidia.com/gpu", (GPU0 + "::1",), numa={"0": (GPU0 + "::1",)}),
    CheckpointEntry(UID_B, "infer", "nvidia.com/mig-1g.10gb", (MIG_A,), numa={"1": (MIG_A,)}),
]


class Node:
    """Everything one simulated node offers the probe."""

    def __init__(self, root: Path, name: str) -> None:
        self.name = name
        self.kubelet_root = root / "kubelet"
        self.kubelet = FakeKubelet(self.kubelet_root / "pod-resources" / "kubelet.sock")
        self.checkpoint = self.kubelet_root / "device-plugins" / "kubelet_internal_checkpoint"
        self.checkpoint.parent.mkdir(parents=True)
        self.nvml_path = root / "nvml.json"
        self.nvml = nvml_state()
        write_nvml_state(self.nvml_path, self.nvml)
        self.procfs = FakeProcfs(root / "proc")
        self.procfs.add_pod_process(
            1001, pod_uid=UID_A, container_id=CID_A, qos="burstable", runtime="containerd", driver="systemd"
        )
        self.procfs.add_pod_process(
            1002,
            pod_uid=UID_B,
            container_id=CID_B,
            qos="besteffort",
            runtime="crio",
            driver="cgroupfs",
            cgroup_version=1,
        )
        self.procfs.add_host_process(1003)
        self.procfs.add_pod_process(
            2001, pod_uid=UID_B, container_id=CID_C, qos="guaranteed", runtime="crio", driver="systemd"
        )

    async def start(self) -> None:
        await self.kubelet.start()
        self.kubelet.set_pods([POD_A, POD_B, POD_C])
        self.kubelet.set_allocatable(
            [
                *(("nvidia.com/gpu", f"{GPU0}::{i}") for i in range(4)),
                ("nvidia.com/mig-1g.10gb", MIG_A),
                ("nvidia.com/mig-3g.40gb", MIG_B),
            ]
        )
        self.checkpoint.write_bytes(render_checkpoint(CHECKPOINT, {"nvidia.com/gpu": [GPU0 + "::1"]}))

    def settings(self, kafka: Kafka, **kw: Any) -> ProbeSettings:
        values: dict[str, Any] = dict(
            node_name=self.name,
            kubelet_root=str(self.kubelet_root),
            proc_root=str(self.procfs.root),
            nvml_backend=f"fake:{self.nvml_path}",
            tick=0.2,
            allocation_interval=1.0,
            health_port=0,
            **settings_of(kafka),
            send_timeout=1.0,
        )
        values.update(kw)
        return ProbeSettings(**values)


class Collector:
    """Reads this node's records from the node topics, decoded, with their arrival time."""

    def __init__(self, kafka: Kafka, node: str) -> None:
        self.kafka, self.node = kafka, node
        self.records: list[tuple[float, Any]] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[ConsumerStats] | None = None

    async def start(self) -> None:
        stats = ConsumerStats()

        async def handle(topic: Any, key: str | None, obj: Any, record: Any) -> None:
            if key == self.node:
                self.records.append((time.monotonic(), obj))

        self._task = asyncio.create_task(
            consume(
                self.kafka, NODE_TOPICS, None, handle, service="probe-test", stop=self._stop, stats=stats
            )
        )
        await asyncio.wait_for(stats.ready.wait(), 30)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.wait_for(self._task, 10)

    def of(self, cls: type[T], since: float = 0.0) -> list[T]:
        return [o for t, o in self.records if isinstance(o, cls) and t >= since]

    async def wait(self, pred: Callable[[], T | None], timeout: float = 10.0) -> T:
        deadline = time.monotonic() + timeout
        while True:
            value = pred()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError("condition not met in time")
            await asyncio.sleep(0.05)


@pytest.fixture
async def node(tmp_path: Path, unique: str) -> AsyncIterator[Node]:
    n = Node(tmp_path, f"gpu-{unique}")
    await n.start()
    yield n
    await n.kubelet.stop()


@pytest.fixture
async def collector(broker: Kafka, node: Node) -> AsyncIterator[Collector]:
    c = Collector(broker, node.name)
    await c.start()
    yield c
    await c.stop()


def health(snapshot: AllocationSnapshot | DeviceInventory) -> dict[str, str]:
    return {h.source: h.state for h in snapshot.health}


def latest_with(c: Collector, cls: type[T], pred: Callable[[T], bool], since: float = 0.0) -> T | None:
    return next((o for o in reversed(c.of(cls, since)) if pred(o)), None)


async def test_allocations_from_both_sources_resolve_to_inventory(
    broker: Kafka, node: Node, collector: Collector
) -> None:
    ticks = itertools.count()
    clock = lambda: 1_800_000_000_000 + 7 * next(ticks)  # noqa: E731
    probe = Probe(node.settings(broker), clock=clock)
    await probe.start()
    try:
        snap = await collector.wait(
            lambda: latest_with(collector, AllocationSnapshot, lambda s: bool(s.entries))
        )
        inv = await collector.wait(lambda: latest_with(collector, DeviceInventory, lambda i: bool(i.gpus)))
    finally:
        await probe.stop()

    pr = {
        (e.namespace, e.pod, e.container, e.resource, e.device_ids)
        for e in snap.entries
        if e.source is AllocSource.PODRESOURCES
    }
    assert pr == {
        ("ml", "train-0", "cuda", "nvidia.com/gpu", (GPU0 + "::1",)),
        ("ml", "infer-0", "infer", "nvidia.com/mig-1g.10gb", (MIG_A,)),
    }
    assert all(not e.pod_uid for e in snap.entries if e.source is AllocSource.PODRESOURCES)
    cp = {
        (e.pod_uid, e.container, e.resource, e.device_ids)
        for e in snap.entries
        if e.source is AllocSource.CHECKPOINT
    }
    assert cp == {
        (UID_A, "cuda", "nvidia.com/gpu", (GPU0 + "::1",)),
        (UID_B, "infer", "nvidia.com/mig-1g.10gb", (MIG_A,)),
    }
    (dra,) = [e for e in snap.entries if e.source is AllocSource.DRA]
    assert (dra.namespace, dra.pod, dra.claim_name, dra.driver, dra.pool, dra.device, dra.device_ids) == (
        "serve",
        "dra-0",
        "gpu-claim",
        "gpu.nvidia.com",
        "node",
        "gpu-0",
        (GPU0,),
    )
    assert ("nvidia.com/gpu", GPU0 + "::3") in snap.allocatable and len(snap.allocatable) == 6
    assert health(snap)["podresources"] == "ok" and health(snap)["checkpoint"] == "ok"

    # Every kubelet device ID (time-slice replica, MIG) names hardware the inventory reports.
    gpus = {g.uuid: g for g in inv.gpus}
    migs = {m.uuid: g.uuid for g in inv.gpus for m in g.mig_devices}
    for e in snap.entries:
        for raw in e.device_ids:
            dev = parse_device_id(raw)
            physical = migs.get(dev.uuid or "") if dev.kind == "mig" else dev.uuid
            assert physical in gpus, raw
    assert parse_device_id(GPU0 + "::1").replica == 1 and migs[MIG_A] == GPU1
    assert {(m.uuid, m.profile, m.gi) for m in gpus[GPU1].mig_devices} == {
        (MIG_A, "1g.10gb", 9),
        (MIG_B, "3g.40gb", 2),
    }
    assert health(inv) == {
        "podresources": "ok",
        "checkpoint": "ok",
        "dra": "ok",
        "nvml": "ok",
        "mig": "ok",  # a MIG node: GPU-instance placement was readable
        "procfs": "ok",
    }
    assert inv.driver_version == "550.54.15"

    # Event meta: one source, epoch = start, times from the injected clock, seq increasing per topic.
    metas = [o.meta for _, o in collector.records]
    assert {m.source for m in metas} == {f"probe/{node.name}"} and {m.epoch for m in metas} == {
        1_800_000_000_000
    }
    assert all(m.time_ms > 1_800_000_000_000 and (m.time_ms - 1_800_000_000_000) % 7 == 0 for m in metas)
    for seqs in (
        [s.meta.seq for s in collector.of(AllocationSnapshot)],
        [t.meta.seq for t in collector.of(NodeTelemetry)],
    ):
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


async def test_processes_carry_pod_identity_and_xids_arrive_at_once(
    broker: Kafka, node: Node, collector: Collector
) -> None:
    probe = Probe(node.settings(broker))
    await probe.start()
    try:
        tel = await collector.wait(
            lambda: latest_with(collector, NodeTelemetry, lambda t: len(t.devices) == 4)
        )
        add_xid(node.nvml, GPU1, 31, gi=9, ci=0)
        write_nvml_state(node.nvml_path, node.nvml)
        written = time.monotonic()
        xid = await collector.wait(lambda: next(iter(collector.of(XidEvent)), None), timeout=5)
        xid_at = next(t for t, o in collector.records if o is xid)
    finally:
        await probe.stop()

    devices = {d.uuid: d for d in tel.devices}
    assert set(devices) == {GPU0, GPU1, MIG_A, MIG_B}
    procs = {p.pid: p for p in devices[GPU0].processes}
    assert (procs[1001].pod_uid, procs[1001].container_id, procs[1001].qos) == (
        UID_A,
        CID_A,
        "burstable",
    )  # containerd
    assert (procs[1002].pod_uid, procs[1002].container_id, procs[1002].qos) == (
        UID_B,
        CID_B,
        "besteffort",
    )  # CRI-O
    assert (procs[1003].pod_uid, procs[1003].container_id) == ("", "")  # host process
    assert procs[1001].sm_util_pct == 50.0 and procs[1001].used_mib == 20000.0
    (mig_proc,) = devices[MIG_A].processes
    assert (mig_proc.pid, mig_proc.pod_uid, mig_proc.container_id, mig_proc.qos) == (
        2001,
        UID_B,
        CID_C,
        "guaranteed",
    )
    assert devices[MIG_A].util_pct is None and devices[MIG_A].parent_uuid == GPU1
    assert devices[GPU0].util_pct == 80.0 and devices[GPU0].power_w == 300.0

    assert (xid.gpu_uuid, xid.code) == (GPU1, 31)
    assert xid.mig is not None and (xid.mig.uuid, xid.mig.gi, xid.mig.ci) == (MIG_A, 9, 0)
    assert xid_at - written < 1.5


async def test_kubelet_restart_reconnects_without_stale_data(
    broker: Kafka, node: Node, collector: Collector
) -> None:
    probe = Probe(node.settings(broker))
    await probe.start()
    try:
        await collector.wait(lambda: latest_with(collector, AllocationSnapshot, lambda s: bool(s.entries)))
        connects = probe.allocations.client.connects
        await node.kubelet.stop()  # the kubelet goes away: its socket is deleted
        down_at = time.monotonic()
        down = await collector.wait(
            lambda: latest_with(
                collector,
                AllocationSnapshot,
                lambda s: health(s)["podresources"] == "unavailable",
                since=down_at,
            )
        )
        assert [e for e in down.entries if e.source is not AllocSource.CHECKPOINT] == []
        assert len([e for e in down.entries if e.source is AllocSource.CHECKPOINT]) == 2
        await collector.wait(
            lambda: latest_with(
                collector,
                DeviceInventory,
                lambda i: health(i)["podresources"] == "unavailable",
                since=down_at,
            )
        )
        await asyncio.sleep(1.5)  # periodic snapshots while down must not bring back the old entries

        node.kubelet.set_pods([POD_D])  # train-0 and friends ended while the kubelet was down
        await node.kubelet.start()
        up_at = time.monotonic()
        fresh = await collector.wait(
            lambda: latest_with(
                collector, AllocationSnapshot, lambda s: health(s)["podresources"] == "ok", since=up_at
            ),
            timeout=5,
        )
        fresh_at = next(t for t, o in collector.records if o is fresh)
        assert probe._live()[0]
    finally:
        await probe.stop()

    assert fresh_at - up_at < 2.0
    assert probe.allocations.client.connects == connects + 1
    pr = [(e.pod, e.device_ids) for e in fresh.entries if e.source is AllocSource.PODRESOURCES]
    assert pr == [("train-1", (GPU0 + "::2",))]
    between = [s for s in collector.of(AllocationSnapshot, since=down_at) if s.meta.seq < fresh.meta.seq]
    assert between and all(e.source is AllocSource.CHECKPOINT for s in between for e in s.entries)


async def test_corrupt_checkpoint_is_health_and_podresources_flows(
    broker: Kafka, node: Node, collector: Collector
) -> None:
    node.checkpoint.write_bytes(b'{"Data": {"PodDeviceEntries": [{"PodUID": ')
    probe = Probe(node.settings(broker))
    await probe.start()
    try:
        inv = await collector.wait(lambda: latest_with(collector, DeviceInventory, lambda i: bool(i.gpus)))
        snap = await collector.wait(
            lambda: latest_with(collector, AllocationSnapshot, lambda s: bool(s.entries))
        )
        node.kubelet.set_pods([POD_A, POD_B, POD_C, POD_D])
        grown = await collector.wait(
            lambda: latest_with(collector, AllocationSnapshot, lambda s: len(s.entries) == 4)
        )
        node.checkpoint.write_bytes(render_checkpoint(CHECKPOINT, {}))
        healed = await collector.wait(
            lambda: latest_with(collector, DeviceInventory, lambda i: health(i)["checkpoint"] == "ok")
        )
    finally:
        await probe.stop()
    assert health(inv)["checkpoint"] == "corrupt" and health(inv)["podresources"] == "ok"
    assert health(snap)["checkpoint"] == "corrupt"
    assert {e.source for e in snap.entries} == {AllocSource.PODRESOURCES, AllocSource.DRA}
    assert {e.pod for e in grown.entries} == {"train-0", "infer-0", "dra-0", "train-1"}
    assert healed.meta.seq > inv.meta.seq


async def test_event_time_follows_the_configured_clock(broker: Kafka, node: Node, collector: Collector
                                                       ) -> None:
    wall = time.time_ns() // 1_000_000
    probe = Probe(node.settings(broker, clock=f"sim:{wall - 10_000}:10"))  # 10 s ago, 10x: ~90 s ahead
    await probe.start()
    try:
        tel = await collector.wait(lambda: next(iter(collector.of(NodeTelemetry)), None))
    finally:
        await probe.stop()
    assert wall + 80_000 < tel.meta.time_ms < wall + 200_000
    assert wall + 80_000 < tel.meta.epoch <= tel.meta.time_ms


async def test_health_endpoints(broker: Kafka, node: Node) -> None:
    probe = Probe(node.settings(broker))
    await probe.start()
    try:
        base = f"http://127.0.0.1:{probe.health_port}"
        async with httpx.AsyncClient(base_url=base, timeout=5) as http:
            assert (await http.get("/healthz")).status_code == 200
            deadline = time.monotonic() + 10
            while (ready := await http.get("/readyz")).status_code != 200 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert ready.status_code == 200 and ready.json()["broker"] == "connected"
            assert ready.json()["sources"]["checkpoint"]["state"] == "ok"
            await asyncio.sleep(0.5)
            text = (await http.get("/metrics")).text
            assert f'periscope_probe_source_up{{node="{node.name}",source="podresources"}} 1.0' in text
            assert "periscope_probe_publish_latency_seconds_bucket" in text
            assert (
                f'periscope_probe_published_total{{node="{node.name}",topic="periscope.node.telemetry.v1"}}'
                in text
            )
            assert (await http.get("/nope")).status_code == 404
            await node.kubelet.stop()
            node.checkpoint.unlink()
            deadline = time.monotonic() + 5
            while (ready := await http.get("/readyz")).status_code == 200 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert ready.status_code == 503
            assert ready.json()["sources"]["podresources"]["state"] == "unavailable"
            assert ready.json()["sources"]["checkpoint"]["state"] == "absent"
    finally:
        await probe.stop()


async def test_broker_outage_loses_no_snapshot_or_xid(tmp_path: Path, unique: str) -> None:
    node = Node(tmp_path, f"gpu-{unique}")
    await node.start()
    port = free_port()
    first = EmbeddedBroker(port=port)
    bootstrap = embedded(await asyncio.to_thread(first.start))
    await ensure_topics(bootstrap, NODE_TOPICS)
    probe = Probe(node.settings(bootstrap, buffer_limit=40))
    second = EmbeddedBroker(port=port)
    collector = Collector(bootstrap, node.name)
    await probe.start()
    try:
        await Collector.wait(collector, lambda: probe.outbox.sent >= 5)
        await asyncio.to_thread(first.stop, 0.2)  # the broker dies; no graceful drain
        changes = {2: [POD_A], 5: [POD_A, POD_D], 8: [POD_D]}
        codes = {1: 13, 3: 31, 6: 43, 9: 79}
        for second_no in range(10):  # ten seconds without a broker
            await asyncio.sleep(1.0)
            if second_no in changes:
                node.kubelet.set_pods(changes[second_no])
            if second_no in codes:
                add_xid(node.nvml, GPU0, codes[second_no])
                write_nvml_state(node.nvml_path, node.nvml)
        await asyncio.sleep(0.5)
        assert not probe.outbox.connected
        pending = probe.buffer.items()
        assert len(pending) == 40
        wanted = {m.value.meta.seq for m in pending if m.kind in (Kind.ALLOCATION, Kind.XID)}  # type: ignore[attr-defined]
        dropped = dict(probe.buffer.dropped)
        assert dropped.get("telemetry", 0) > 0 and "allocation" not in dropped and "xid" not in dropped

        await asyncio.to_thread(second.start)  # same port, empty memory: topics must be created again
        await ensure_topics(bootstrap, NODE_TOPICS)
        await collector.start()
        await collector.wait(lambda: wanted <= {o.meta.seq for _, o in collector.records}, timeout=30)
        last_seq = max(m.value.meta.seq for m in pending)  # type: ignore[attr-defined]
        await collector.wait(lambda: any(o.meta.seq > last_seq for o in collector.of(NodeTelemetry)))
        metrics = probe.metrics.render().decode()
    finally:
        await probe.stop()
        await collector.stop()
        await asyncio.to_thread(second.stop, 0.2)
        await node.kubelet.stop()

    xids = collector.of(XidEvent)
    assert [x.code for x in xids] == [13, 31, 43, 79]
    snaps = collector.of(AllocationSnapshot)
    pods_seen = [{e.pod for e in s.entries if e.source is AllocSource.PODRESOURCES} for s in snaps]
    for expected in ({"train-0"}, {"train-0", "train-1"}, {"train-1"}):
        assert expected in pods_seen
    assert pods_seen[-1] == {"train-1"}
    assert f'periscope_probe_dropped_total{{kind="telemetry",node="{node.name}"}}' in metrics


async def test_allocations_are_polled_on_checkpoint_change_and_on_their_own_cadence(
    broker: Kafka, node: Node, collector: Collector
) -> None:
    # Long PodResources and snapshot periods: what arrives early arrives because the checkpoint changed.
    probe = Probe(node.settings(broker, podresources_interval=30.0, allocation_interval=30.0))
    await probe.start()
    try:
        await collector.wait(lambda: latest_with(collector, AllocationSnapshot, lambda s: bool(s.entries)))
        lists = node.kubelet.calls["List"]
        await asyncio.sleep(1.5)  # ~7 ticks, nothing changed: no gRPC call, no snapshot
        assert node.kubelet.calls["List"] == lists
        assert len(collector.of(AllocationSnapshot)) == 1

        # A new pod gets devices: the device manager rewrites its checkpoint, the next tick polls.
        node.kubelet.set_pods([POD_A, POD_B, POD_C, POD_D])
        node.checkpoint.write_bytes(
            render_checkpoint(
                [*CHECKPOINT, CheckpointEntry(UID_B, "cuda", "nvidia.com/gpu", (GPU0 + "::2",))], {}
            )
        )
        changed_at = time.monotonic()
        grown = await collector.wait(
            lambda: latest_with(
                collector, AllocationSnapshot, lambda s: "train-1" in {e.pod for e in s.entries}
            ),
            timeout=5,
        )
        seen_at = next(t for t, o in collector.records if o is grown)
    finally:
        await probe.stop()
    assert seen_at - changed_at < 3.0  # a tick (0.2 s) and the broker hop, with room for a busy machine
    assert len([e for e in grown.entries if e.source is AllocSource.CHECKPOINT]) == 3


async def test_a_changed_checkpoint_is_published_before_the_next_telemetry_sample(
    broker: Kafka, node: Node, collector: Collector
) -> None:
    # A pod's first sample must not come ahead of the snapshot that gives it its device (its GPU time
    # would be unattributed, and unbilled). Four changes at random phases of the two loops' ticks.
    probe = Probe(node.settings(broker, tick=0.5, podresources_interval=30.0, allocation_interval=30.0))
    await probe.start()
    try:
        await collector.wait(lambda: latest_with(collector, AllocationSnapshot, lambda s: bool(s.entries)))
        for n in range(4):
            grown = n % 2 == 0
            node.kubelet.set_pods([POD_A, POD_B, POD_C, *([POD_D] if grown else [])])
            extra = [CheckpointEntry(UID_B, "cuda", "nvidia.com/gpu", (GPU0 + "::2",))] if grown else []
            written_ms = time.time() * 1000
            node.checkpoint.write_bytes(render_checkpoint([*CHECKPOINT, *extra], {}))
            snap = await collector.wait(
                lambda g=grown, w=written_ms: latest_with(  # type: ignore[misc]
                    collector, AllocationSnapshot,
                    lambda s: s.meta.time_ms >= w and ("train-1" in {e.pod for e in s.entries}) == g),
                timeout=5,
            )
            ahead = [t.meta.time_ms for t in collector.of(NodeTelemetry)
                     if written_ms + 50 < t.meta.time_ms < snap.meta.time_ms]
            assert not ahead, (n, written_ms, snap.meta.time_ms, ahead)
            await asyncio.sleep(0.37 * (n + 1))  # another phase
    finally:
        await probe.stop()


async def test_unusable_checkpoint_means_podresources_every_tick(
    broker: Kafka, node: Node, collector: Collector
) -> None:
    node.checkpoint.unlink()  # nothing signals a change: List on every tick, as before
    probe = Probe(node.settings(broker, podresources_interval=30.0, allocation_interval=30.0))
    await probe.start()
    try:
        await collector.wait(lambda: latest_with(collector, AllocationSnapshot, lambda s: bool(s.entries)))
        node.kubelet.set_pods([POD_D])
        shrunk = await collector.wait(
            lambda: latest_with(
                collector, AllocationSnapshot, lambda s: {e.pod for e in s.entries} == {"train-1"}
            ),
            timeout=5,
        )
    finally:
        await probe.stop()
    assert health(shrunk)["checkpoint"] == "absent"


async def test_unchanged_allocations_are_asked_and_resent_on_their_periods(
    broker: Kafka, node: Node, collector: Collector
) -> None:
    probe = Probe(node.settings(broker, podresources_interval=0.5, allocation_interval=1.0))  # tick 0.2 s
    await probe.start()
    try:
        await collector.wait(lambda: latest_with(collector, AllocationSnapshot, lambda s: bool(s.entries)))
        lists, since = node.kubelet.calls["List"], time.monotonic()
        await asyncio.sleep(3.0)
        lists = node.kubelet.calls["List"] - lists
        # A pod that ended shows without any checkpoint change, within the PodResources period.
        node.kubelet.set_pods([POD_A, POD_C])
        ended_at = time.monotonic()
        shrunk = await collector.wait(
            lambda: latest_with(
                collector, AllocationSnapshot, lambda s: "infer-0" not in {e.pod for e in s.entries}
            ),
            timeout=5,
        )
        shrunk_at = next(t for t, o in collector.records if o is shrunk)
    finally:
        await probe.stop()
    resent = [s for s in collector.of(AllocationSnapshot, since) if s.meta.seq < shrunk.meta.seq]
    assert 1 <= lists <= 3.0 / 0.5 + 1  # not once per tick (15 ticks)
    assert 1 <= len(resent) <= 3.0 / 1.0 + 1  # the unchanged snapshot, once per allocation_interval
    assert shrunk_at - ended_at < 3.0


async def test_the_inventory_is_republished_unchanged_every_interval(
    broker: Kafka, node: Node, collector: Collector
) -> None:
    # The API believes GPU states only of GPUs an inventory on the topic reported: an unchanged node
    # must not let its inventory age out of the topic's retention.
    probe = Probe(node.settings(broker, inventory_interval=0.5))
    await probe.start()
    try:
        await collector.wait(lambda: len(collector.of(DeviceInventory)) >= 4, timeout=15)
    finally:
        await probe.stop()
    same = [(i.gpus, i.health) for i in collector.of(DeviceInventory)]
    assert any(a == b for a, b in itertools.pairwise(same))  # republished without a change
    quiet = Probe(node.settings(broker))  # the default (1h): at start, then only on change
    await quiet.start()
    try:
        await asyncio.sleep(2.0)
    finally:
        await quiet.stop()
    await asyncio.sleep(0.5)
    sent = [(i.gpus, i.health) for i in collector.of(DeviceInventory) if i.meta.epoch == quiet.epoch]
    # Only what start-up sends (the first inventory and its health settling), nothing by the clock.
    assert 1 <= len(sent) <= 2
