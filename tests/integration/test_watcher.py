"""The kube_watcher end to end: the real `kubernetes` client against the fake apiserver over HTTP,
publishing through the real Publisher to the embedded broker, read back with aiokafka."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from periscope.bus import codec, topics
from periscope.bus.admin import ensure_topics
from periscope.bus.clients import Kafka
from periscope.bus.producer import Publisher
from periscope.bus.topics import Topic
from periscope.core.model import NodeEvent, PodEvent, PolicyEvent
from periscope.settings.watcher import WatcherSettings
from periscope.sim.apiserver import FakeApiServer
from services.kube_watcher.service import KubeWatcher
from tests.kafka_tier import settings_of

Event = PodEvent | NodeEvent | PolicyEvent
GPU_NODE = {
    "metadata": {"name": "gpu-a", "labels": {"nvidia.com/gpu.present": "true"}},
    "status": {"capacity": {"nvidia.com/gpu": "2"}},
}


def gpu_pod(name: str, uid: str, node: str = "gpu-a", ns: str = "ml") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": uid,
            "ownerReferences": [{"kind": "StatefulSet", "name": "trainer", "controller": True}],
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
        "status": {"phase": "Running", "qosClass": "BestEffort"},
    }


class PrivateTopics:
    """Publishes to per-test copies of the registry topics (the broker is shared by the test run)."""

    def __init__(self, publisher: Publisher, copies: dict[str, Topic]) -> None:
        self.publisher, self.copies = publisher, copies

    async def send(self, topic: Topic, key: str, value: Any) -> None:
        await self.publisher.send(self.copies[topic.name], key, value)


class EventLog:
    """Everything published on the private topics, decoded, in arrival order per topic."""

    def __init__(self, broker: Kafka, copies: dict[str, Topic]) -> None:
        self.by_name = {t.name: t for t in copies.values()}
        self.consumer = broker.consumer(*self.by_name, client_id="test-event-log")
        self.records: list[tuple[str, Event]] = []
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.consumer.start()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            for tp, batch in (await self.consumer.getmany(timeout_ms=100)).items():
                for rec in batch:
                    assert rec.key is not None and rec.value is not None
                    self.records.append((rec.key.decode(), codec.decode(self.by_name[tp.topic], rec.value)))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.consumer.stop()

    def of(self, kind: type[Any]) -> list[Any]:
        return [v for _, v in self.records if isinstance(v, kind)]

    async def wait_for(self, pred: Callable[[EventLog], bool], timeout: float = 20.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not pred(self):
            if loop.time() > deadline:
                raise AssertionError(
                    f"condition not met in {timeout}s; got {len(self.records)} events: "
                    f"{[_brief(v) for _, v in self.records][-20:]}"
                )
            await asyncio.sleep(0.05)


def _brief(ev: Event) -> str:
    if isinstance(ev, PodEvent):
        flags = "".join(f for f, on in (("D", ev.deleted), ("R", ev.relist)) if on)
        return f"pod:{ev.pod.uid}{':' + flags if flags else ''}"
    return f"node:{ev.name}" if isinstance(ev, NodeEvent) else f"policy:{ev.crd}"


@dataclasses.dataclass
class Harness:
    server: FakeApiServer
    log: EventLog
    watcher: KubeWatcher

    def pods(self, uid: str | None = None) -> list[PodEvent]:
        return [e for e in self.log.of(PodEvent) if uid is None or e.pod.uid == uid]


@pytest.fixture
def apiserver(request: pytest.FixtureRequest) -> Iterator[FakeApiServer]:
    opts = getattr(request, "param", {})
    server = FakeApiServer(bookmark_interval_s=0.2, **opts)
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def harness(
    apiserver: FakeApiServer, broker: Kafka, unique: str, tmp_path: Path
) -> AsyncIterator[Harness]:
    copies = {
        t.name: dataclasses.replace(t, name=f"{t.name}.{unique}")
        for t in (topics.PODS, topics.NODES, topics.POLICY)
    }
    await ensure_topics(broker, copies.values())
    settings = WatcherSettings(
        kubeconfig=str(apiserver.write_kubeconfig(tmp_path / "kubeconfig")),
        **settings_of(broker),
        watch_timeout=5,
        unavailable_retry=0.3,
    )
    log = EventLog(broker, copies)
    await log.start()
    async with Publisher(broker, client_id=f"watcher-{unique}") as publisher:
        watcher = KubeWatcher(settings, PrivateTopics(publisher, copies))
        stop = asyncio.Event()
        task = asyncio.create_task(watcher.run(stop))
        try:
            yield Harness(apiserver, log, watcher)
        finally:
            stop.set()
            await asyncio.wait_for(task, 15)
            await log.stop()


def assert_ordered(h: Harness) -> None:
    """One source, one epoch, sequence numbers strictly increasing in publish order per topic."""
    for kind in (PodEvent, NodeEvent, PolicyEvent):
        metas = [e.meta for e in h.log.of(kind)]
        assert all(m.source == "kube_watcher" and m.epoch == h.watcher.epoch for m in metas)
        assert [m.seq for m in metas] == sorted({m.seq for m in metas})


async def test_churn_with_name_reuse_yields_distinct_uids_and_deletes(harness: Harness) -> None:
    h = harness
    h.server.upsert("nodes", GPU_NODE)
    h.server.upsert("pods", gpu_pod("trainer-0", "uid-1"))
    await h.log.wait_for(lambda _: bool(h.pods("uid-1")))
    # The StatefulSet controller deletes and recreates trainer-0 three times: same name, new UIDs.
    for n in (2, 3, 4):
        h.server.upsert("pods", gpu_pod("trainer-0", f"uid-{n}"))
    await h.log.wait_for(lambda _: bool(h.pods("uid-4")))
    olds = ("uid-1", "uid-2", "uid-3")
    await h.log.wait_for(lambda _: all(any(e.deleted for e in h.pods(u)) for u in olds))
    for old in olds:
        events = h.pods(old)
        assert not events[0].deleted and events[-1].deleted, old
    assert not any(e.deleted for e in h.pods("uid-4"))
    assert {e.pod.name for e in h.pods()} == {"trainer-0"} and len({e.pod.uid for e in h.pods()}) == 4
    pod_keys = {k for k, v in h.log.records if isinstance(v, PodEvent)}
    assert pod_keys == {"gpu-a"}
    node = h.log.of(NodeEvent)[0]
    assert node.name == "gpu-a" and node.label("nvidia.com/gpu.present") == "true"
    assert_ordered(h)


async def test_unscheduled_pod_is_keyed_by_empty_node(harness: Harness) -> None:
    h = harness
    h.server.upsert("pods", gpu_pod("queued", "uid-q", node=""))
    h.server.upsert(
        "pods",
        {
            "metadata": {"name": "web", "namespace": "ml", "uid": "uid-cpu"},
            "spec": {"nodeName": "cpu-1", "containers": [{"name": "nginx"}]},
        },
    )
    await h.log.wait_for(lambda _: bool(h.pods("uid-q")))
    assert [k for k, v in h.log.records if isinstance(v, PodEvent)] == [""]
    assert not h.pods("uid-cpu")  # not a GPU pod, not on a GPU node


@pytest.mark.parametrize(
    "apiserver", [{}, {"gone_as_http": True}], indirect=True, ids=["error-event", "http-410"]
)
async def test_forced_410_relists_and_sends_a_full_snapshot(harness: Harness) -> None:
    h = harness
    h.server.upsert("nodes", GPU_NODE)
    for name, uid in (("a", "uid-a"), ("b", "uid-b")):
        h.server.upsert("pods", gpu_pod(name, uid))
    await h.log.wait_for(lambda _: bool(h.pods("uid-a") and h.pods("uid-b")))
    # While the watch is down, b goes away and c appears; then the history is compacted away.
    h.server.stop()
    h.server.delete("pods", "ml", "b")
    h.server.upsert("pods", gpu_pod("c", "uid-c"))
    h.server.compact()
    lists_before = h.server.stats["list", "pods"]
    h.server.start()
    await h.log.wait_for(lambda _: any(e.deleted for e in h.pods("uid-b")) and bool(h.pods("uid-c")))
    assert h.server.stats["gone", "pods"] >= 1 and h.server.stats["list", "pods"] > lists_before
    gone = [e for e in h.pods("uid-b") if e.deleted]
    assert len(gone) == 1 and gone[0].relist
    assert all(e.relist for e in h.pods("uid-c"))
    # a, unchanged, is re-sent as part of the snapshot.
    await h.log.wait_for(lambda _: any(e.relist and not e.deleted for e in h.pods("uid-a")[1:]))
    assert sum(w.stats.expired for w in h.watcher.watches if w.kind == "pods") >= 1
    assert_ordered(h)


async def test_compaction_kills_open_watches_and_forces_a_relist(harness: Harness) -> None:
    h = harness
    h.server.upsert("nodes", GPU_NODE)
    h.server.upsert("pods", gpu_pod("a", "uid-a"))
    await h.log.wait_for(lambda _: bool(h.pods("uid-a")))
    h.server.compact()  # ERROR 410 on the open watch stream
    await h.log.wait_for(lambda _: any(e.relist for e in h.pods("uid-a")[1:]))


async def test_apiserver_restart_is_survived(harness: Harness) -> None:
    h = harness
    h.server.upsert("nodes", GPU_NODE)
    h.server.upsert("pods", gpu_pod("a", "uid-a"))
    await h.log.wait_for(lambda _: bool(h.pods("uid-a")))
    lists = h.server.stats["list", "pods"]
    h.server.stop()
    await asyncio.sleep(0.5)  # the watcher sees refused connections and backs off
    h.server.upsert("pods", gpu_pod("b", "uid-b"))
    h.server.start()
    await h.log.wait_for(lambda _: bool(h.pods("uid-b")))
    # Resumed from its resourceVersion: a plain ADDED, no relist needed.
    assert not h.pods("uid-b")[0].relist and h.server.stats["list", "pods"] == lists
    # A restart that loses everything (a new store) still converges: 410, relist, deletes.
    h.server.restart(keep_state=False)
    h.server.upsert("nodes", GPU_NODE)
    await h.log.wait_for(lambda _: all(any(e.deleted for e in h.pods(u)) for u in ("uid-a", "uid-b")))
    assert_ordered(h)


@pytest.mark.parametrize("apiserver", [{"crd_installed": False, "dra_installed": False}], indirect=True)
async def test_missing_crd_and_dra_are_a_status(harness: Harness) -> None:
    h = harness
    await h.log.wait_for(lambda _: bool(h.log.of(PolicyEvent)))
    first = h.log.of(PolicyEvent)[0]
    assert (first.crd, first.name, first.dra_available) == ("not-installed", "", False)
    assert [k for k, v in h.log.records if isinstance(v, PolicyEvent)] == ["cluster"]
    # Installing the operator later is picked up without a restart.
    h.server.set_crd_installed(True)
    h.server.upsert(
        "clusterpolicies",
        {
            "metadata": {"name": "cluster-policy"},
            "spec": {"dcgmExporter": {"enabled": False}},
            "status": {"state": "ready"},
        },
    )
    h.server.upsert(
        "daemonsets",
        {
            "metadata": {"name": "nvidia-device-plugin-daemonset", "namespace": "gpu-operator"},
            "status": {"desiredNumberScheduled": 1, "numberReady": 1},
        },
    )
    await h.log.wait_for(
        lambda _: any(
            p.crd == "installed" and p.name and any(o.present for o in p.operands)
            for p in h.log.of(PolicyEvent)
        )
    )
    last = h.log.of(PolicyEvent)[-1]
    assert (last.name, last.state, last.components) == ("cluster-policy", "ready", (("dcgmExporter", False),))
    ready = h.watcher.ready()
    assert ready[0] and ready[1]["crd"] == "installed"


async def test_dra_claim_devices_reach_the_pod_event(harness: Harness) -> None:
    h = harness
    pod = {
        "metadata": {"name": "infer", "namespace": "serve", "uid": "uid-dra"},
        "spec": {
            "nodeName": "gpu-b",
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one"}],
            "containers": [{"name": "srv", "resources": {"claims": [{"name": "gpu"}]}}],
        },
        "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "infer-gpu-7x2"}]},
    }
    h.server.upsert("pods", pod)
    await h.log.wait_for(lambda _: bool(h.pods("uid-dra")))
    assert h.pods("uid-dra")[-1].pod.claim_devices == ()
    # The scheduler allocates the claim afterwards: the pod is re-sent with its device.
    h.server.upsert(
        "resourceclaims",
        {
            "metadata": {"name": "infer-gpu-7x2", "namespace": "serve"},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "gpu-b", "device": "gpu-3"}
                        ]
                    }
                }
            },
        },
    )
    await h.log.wait_for(lambda _: bool(h.pods("uid-dra")[-1].pod.claim_devices))
    dev = h.pods("uid-dra")[-1].pod.claim_devices[0]
    assert (dev.claim_name, dev.driver, dev.pool, dev.device) == (
        "infer-gpu-7x2",
        "gpu.nvidia.com",
        "gpu-b",
        "gpu-3",
    )
    assert h.log.of(PolicyEvent)[-1].dra_available is True


async def test_a_malformed_object_is_skipped_not_fatal(harness: Harness) -> None:
    h = harness
    h.server.upsert(
        "daemonsets",
        {
            "metadata": {"name": "nvidia-dcgm-exporter", "namespace": "gpu-operator"},
            "status": {"desiredNumberScheduled": "many"},
        },
    )
    await asyncio.sleep(0.5)
    h.server.upsert("pods", gpu_pod("after", "uid-after"))
    await h.log.wait_for(lambda _: bool(h.pods("uid-after")))
    assert h.watcher.handle_errors >= 1
    assert "periscope_watcher_mapping_errors_total" in h.watcher.metrics()
