"""Each service against a real embedded broker that is paused (SIGSTOP: connections stay open and nothing
answers) and then resumed: the service notices, says it is not ready, and comes back by itself with
nothing lost. Every test has a broker of its own, as pausing the shared one would stall the others."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from periscope.bus import topics
from periscope.bus.admin import ensure_topics
from periscope.bus.broker import EmbeddedBroker
from periscope.bus.producer import Publisher
from periscope.core.model import AllocationSnapshot, NodeTelemetry, PodEvent, XidEvent
from periscope.sim.apiserver import FakeApiServer
from periscope.sim.nvml import add_xid, write_nvml_state
from services.api.server import ApiServer
from services.api.settings import ApiSettings
from services.kube_watcher.service import KubeWatcher
from services.kube_watcher.settings import WatcherSettings
from services.probe.service import Probe
from tests.integration.test_joiner import (
    NodeScript,
    OutputLog,
    Worker,
    caught_up,
    publish_samples,
    publish_state,
    reference,
    summary,
    workers,
)
from tests.integration.test_probe_service import GPU0, Collector, Node
from tests.integration.test_watcher import GPU_NODE, EventLog, PrivateTopics, gpu_pod
from tests.unit.test_api_samples import gpu

pytestmark = pytest.mark.slow


@pytest.fixture
def paused_broker() -> Iterator[EmbeddedBroker]:
    b = EmbeddedBroker()
    b.start()
    asyncio.run(ensure_topics(b.bootstrap))
    yield b
    if b.pid is not None:
        os.kill(b.pid, signal.SIGCONT)
    b.stop(1.0)


def pause(b: EmbeddedBroker) -> None:
    assert b.pid is not None
    os.kill(b.pid, signal.SIGSTOP)


def resume(b: EmbeddedBroker) -> None:
    assert b.pid is not None
    os.kill(b.pid, signal.SIGCONT)


async def until(pred: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await _call(pred):
        assert time.monotonic() < deadline, f"not in {timeout_s:g}s: {what}"
        await asyncio.sleep(0.2)


async def _call(pred: object) -> bool:
    result = pred()  # type: ignore[operator]
    if asyncio.iscoroutine(result):
        result = await result
    return bool(result)


async def test_probe_flushes_what_it_buffered_in_order(tmp_path: Path, paused_broker: EmbeddedBroker) -> None:
    node = Node(tmp_path, "gpu-paused")
    await node.start()
    probe = Probe(node.settings(paused_broker.bootstrap, stale_after=3.0))
    collector = Collector(paused_broker.bootstrap, node.name)
    await collector.start()
    await probe.start()
    url = f"http://127.0.0.1:{probe.health_port}/readyz"
    try:
        async with httpx.AsyncClient(timeout=5) as http:
            await until(lambda: probe.outbox.sent >= 5, 20, "first events published")
            await until(lambda: _status(http, url, 200), 20, "probe ready")
            pause(paused_broker)
            for code in (13, 31):  # XIDs while nothing reaches the broker
                await asyncio.sleep(4)
                add_xid(node.nvml, GPU0, code)
                write_nvml_state(node.nvml_path, node.nvml)
            await until(lambda: _status(http, url, 503), 20, "probe /readyz 503 while its events wait")
            body = (await http.get(url)).json()
            assert body["stale"] is True and body["data_age_s"] > 3 and body["buffered"] > 0
            await asyncio.sleep(12)
            resume(paused_broker)
            await until(lambda: [x.code for x in collector.of(XidEvent)] == [13, 31], 60, "XIDs delivered")
            await until(lambda: _status(http, url, 200), 30, "probe ready again")
            assert probe.buffer.dropped == {}
    finally:
        await probe.stop()
        await collector.stop()
        await node.kubelet.stop()
    # In order: per topic, sequence numbers grow in arrival order, and none is missing. A send that timed
    # out when the pause began may still be delivered after it (at least once): a repeat, which the
    # joiner counts as a duplicate, is allowed; going back to an older event is not.
    for cls in (NodeTelemetry, AllocationSnapshot, XidEvent):
        seqs = [o.meta.seq for o in collector.of(cls)]
        assert all(b >= a for a, b in itertools.pairwise(seqs)), (cls.__name__, seqs)
    every = sorted({o.meta.seq for _, o in collector.records})
    assert every == list(range(every[0], every[0] + len(every))), "a buffered event was lost"


async def _status(http: httpx.AsyncClient, url: str, code: int) -> bool:
    return (await http.get(url)).status_code == code


async def test_watcher_publishes_what_changed_while_the_broker_was_paused(
    tmp_path: Path, paused_broker: EmbeddedBroker
) -> None:
    bootstrap = paused_broker.bootstrap
    copies = {t.name: dataclasses.replace(t, name=f"{t.name}.paused") for t in (topics.PODS, topics.NODES,
                                                                                 topics.POLICY)}
    await ensure_topics(bootstrap, copies.values())
    server = FakeApiServer(bookmark_interval_s=0.2)
    server.start()
    settings = WatcherSettings(kubeconfig=str(server.write_kubeconfig(tmp_path / "kubeconfig")),
                               kafka_bootstrap=bootstrap, watch_timeout=5, unavailable_retry=0.3)
    log = EventLog(bootstrap, copies)
    await log.start()
    stop = asyncio.Event()
    try:
        async with Publisher(bootstrap, client_id="watcher-paused") as publisher:
            watcher = KubeWatcher(settings, PrivateTopics(publisher, copies))
            task = asyncio.create_task(watcher.run(stop))
            server.upsert("nodes", GPU_NODE)
            server.upsert("pods", gpu_pod("trainer-0", "uid-1"))
            await until(lambda: any(e.pod.uid == "uid-1" for e in log.of(PodEvent)), 30, "first pod")
            pause(paused_broker)
            server.upsert("pods", gpu_pod("trainer-1", "uid-2"))
            server.delete("pods", "ml", "trainer-0")
            await asyncio.sleep(35)  # past the producer's request timeout: a failed publish is retried
            resume(paused_broker)
            await until(lambda: any(e.pod.uid == "uid-1" and e.deleted for e in log.of(PodEvent)), 60,
                        "the delete made during the pause")
            assert any(e.pod.uid == "uid-2" for e in log.of(PodEvent))
            assert watcher.ready()[0]
            stop.set()
            await asyncio.wait_for(task, 15)
    finally:
        stop.set()
        await log.stop()
        server.stop()
    # A publish that timed out may have been stored all the same and is then sent again (at least once,
    # as the broker has no idempotent producer): a repeat is allowed, an older event after a newer is not.
    seqs = [e.meta.seq for e in log.of(PodEvent)]
    assert all(b >= a for a, b in itertools.pairwise(seqs)), seqs


@pytest.fixture
async def api(paused_broker: EmbeddedBroker) -> AsyncIterator[tuple[ApiServer, str]]:
    server = ApiServer(ApiSettings(api_port=0, kafka_bootstrap=paused_broker.bootstrap, api_stale_after=5,
                                   log_level="warning"))
    url = await server.start()
    try:
        yield server, url
    finally:
        await server.stop()


async def test_api_view_moves_again_after_a_45s_pause(paused_broker: EmbeddedBroker,
                                                       api: tuple[ApiServer, str]) -> None:
    """The pause outlasts the consumer's request timeout (the case that used to leave the view frozen)."""
    _, url = api
    stop = asyncio.Event()

    async def produce() -> None:
        while not stop.is_set():
            try:
                async with Publisher(paused_broker.bootstrap, "api-paused", request_timeout_ms=5000) as pub:
                    while not stop.is_set():
                        now = int(time.time() * 1000)
                        await asyncio.wait_for(pub.send(topics.GPUS, "GPU-p", gpu("GPU-p", as_of=now)), 6)
                        await asyncio.sleep(0.5)
            except Exception:  # the broker is paused: start again
                await asyncio.sleep(1)

    producer = asyncio.create_task(produce())
    try:
        async with httpx.AsyncClient(base_url=url, timeout=5) as http:
            await until(lambda: _status(http, f"{url}/readyz", 200), 30, "API ready")
            pause(paused_broker)
            await until(lambda: _status(http, f"{url}/readyz", 503), 30, "/readyz 503 with the broker paused")
            assert (await http.get("/healthz")).status_code == 200  # alive all the same
            await asyncio.sleep(45)
            resume(paused_broker)
            resumed = time.time()
            await until(lambda: _status(http, f"{url}/readyz", 200), 60, "/readyz 200 after the resume")

            async def newer() -> bool:
                items = (await http.get("/v1/gpus")).json()["items"]
                since = _iso(resumed)
                return any(g["gpu_uuid"] == "GPU-p" and (g["sample_at"] or "") >= since for g in items)

            await until(newer, 30, "a GPU state sent after the resume in /v1/gpus")
            body = (await http.get("/readyz")).json()
            assert body["stale"] is False and body["data_age_s"] < 5
    finally:
        stop.set()
        producer.cancel()
        await asyncio.gather(producer, return_exceptions=True)


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))


async def test_joiner_worker_resumes_after_a_45s_pause(paused_broker: EmbeddedBroker, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A real Faust worker: not ready while its inputs stopped, then back on its own, and its outputs
    after the pause are those of the pure core over the same events (no restart of the worker needed)."""
    bootstrap = paused_broker.bootstrap
    monkeypatch.setenv("PERISCOPE_STALE_AFTER", "5s")
    nodes = [NodeScript("gpu-p", 1)]
    with workers(Worker(bootstrap, "joiner-paused", tmp_path, "w")) as (w,):
        await w.ready()
        async with Publisher(bootstrap, "test-probe") as pub, OutputLog(bootstrap) as log:
            events = await publish_state(pub, nodes)
            await asyncio.sleep(0.5)
            events += await publish_samples([pub], nodes, range(10), pace_s=0.1)
            await log.wait_for("outputs of sample 9", caught_up(nodes, 9), timeout=60)
        pause(paused_broker)
        try:
            await until(lambda: w.get("/readyz")[0] == 503, 30, "joiner /readyz 503 while no input moves")
            assert '"data_age_s"' in w.get("/readyz")[1]
            await asyncio.sleep(40)
        finally:
            resume(paused_broker)
        async with Publisher(bootstrap, "test-probe-2") as pub, OutputLog(bootstrap) as log:
            # Probes tick on: the worker is ready again while inputs move (and stale once they stop).
            stream = asyncio.create_task(publish_samples([pub], nodes, range(10, 300), pace_s=0.1))
            await log.wait_for("outputs of sample 29 after the pause", caught_up(nodes, 29), timeout=120)
            await until(lambda: w.get("/readyz")[0] == 200, 30, "joiner ready again")
            events += await stream
            await log.wait_for("outputs of the last sample", caught_up(nodes, 299), timeout=60)
            latest = log.latest()
        assert w.stop() == 0
    expected = reference(events)
    for key, want in expected.items():
        assert latest[key] == want, f"{key}:\n got  {summary(latest[key])}\n want {summary(want)}"
