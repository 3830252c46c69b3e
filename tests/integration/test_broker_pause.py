"""Each service against a real embedded broker that is paused (SIGSTOP: connections stay open and nothing
answers) and then resumed: the service notices, says it is not ready, and comes back by itself with
nothing lost.

Every scenario has a broker of its own, as pausing a shared one would stall the others. A scenario mostly
waits out its pause, so the four run at once (one module fixture, each scenario an asyncio task with its
own time limit, so one that fails or hangs cannot stall another) and each test reports its own scenario:
its failure as raised there, else the checks made on what it observed."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from periscope.bus import topics
from periscope.bus.admin import ensure_topics
from periscope.bus.producer import Publisher
from periscope.core.model import (
    AllocationSnapshot,
    DeviceInventory,
    GpuInfo,
    Meta,
    NodeTelemetry,
    Output,
    PodEvent,
    XidEvent,
)
from periscope.devkit.embedded import EmbeddedBroker
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
from tests.kafka_tier import embedded, settings_of
from tests.unit.test_api_samples import gpu

# The first test's setup runs all four scenarios (the longest, the joiner's, takes about 90 s alone).
SCENARIO_LIMIT_S = 240
pytestmark = [pytest.mark.slow, pytest.mark.timeout(SCENARIO_LIMIT_S + 60)]


@contextlib.asynccontextmanager
async def paused_broker() -> AsyncIterator[EmbeddedBroker]:
    b = EmbeddedBroker()
    await asyncio.to_thread(b.start)
    try:
        await ensure_topics(embedded(b.bootstrap))
        yield b
    finally:
        if b.pid is not None:
            os.kill(b.pid, signal.SIGCONT)
        await asyncio.to_thread(b.stop, 1.0)


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


# ---------------------------------------------------------------- scenarios


@dataclasses.dataclass
class ProbeSeen:
    seqs: dict[str, list[int]]  # per event type, in arrival order
    every: list[int]  # every sequence number that arrived, sorted, once


async def probe_flushes_what_it_buffered(tmp_path: Path) -> ProbeSeen:
    async with paused_broker() as broker:
        node = Node(tmp_path, "gpu-paused")
        await node.start()
        probe = Probe(node.settings(embedded(broker.bootstrap), stale_after=3.0))
        collector = Collector(embedded(broker.bootstrap), node.name)
        await collector.start()
        await probe.start()
        url = f"http://127.0.0.1:{probe.health_port}/readyz"
        try:
            async with httpx.AsyncClient(timeout=5) as http:
                await until(lambda: probe.outbox.sent >= 5, 20, "first events published")
                await until(lambda: _status(http, url, 200), 20, "probe ready")
                pause(broker)
                for code in (13, 31):  # XIDs while nothing reaches the broker
                    await asyncio.sleep(4)
                    add_xid(node.nvml, GPU0, code)
                    write_nvml_state(node.nvml_path, node.nvml)
                await until(lambda: _status(http, url, 503), 20, "probe /readyz 503 while its events wait")
                body = (await http.get(url)).json()
                assert body["stale"] is True and body["data_age_s"] > 3 and body["buffered"] > 0
                await asyncio.sleep(12)
                resume(broker)
                await until(lambda: [x.code for x in collector.of(XidEvent)] == [13, 31], 60,
                            "XIDs delivered")
                await until(lambda: _status(http, url, 200), 30, "probe ready again")
                assert probe.buffer.dropped == {}
        finally:
            await probe.stop()
            await collector.stop()
            await node.kubelet.stop()
    return ProbeSeen(seqs={cls.__name__: [o.meta.seq for o in collector.of(cls)]
                           for cls in (NodeTelemetry, AllocationSnapshot, XidEvent)},
                     every=sorted({o.meta.seq for _, o in collector.records}))


async def _status(http: httpx.AsyncClient, url: str, code: int) -> bool:
    return (await http.get(url)).status_code == code


async def watcher_publishes_what_changed(tmp_path: Path) -> list[int]:
    """The pod events' sequence numbers, in arrival order."""
    async with paused_broker() as broker:
        bootstrap = embedded(broker.bootstrap)
        copies = {t.name: dataclasses.replace(t, name=f"{t.name}.paused")
                  for t in (topics.PODS, topics.NODES, topics.POLICY)}
        await ensure_topics(bootstrap, copies.values())
        server = FakeApiServer(bookmark_interval_s=0.2)
        server.start()
        settings = WatcherSettings(kubeconfig=str(server.write_kubeconfig(tmp_path / "kubeconfig")),
                                   **settings_of(bootstrap), watch_timeout=5, unavailable_retry=0.3)
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
                pause(broker)
                server.upsert("pods", gpu_pod("trainer-1", "uid-2"))
                server.delete("pods", "ml", "trainer-0")
                await asyncio.sleep(35)  # past the producer's request timeout: a failed publish is retried
                resume(broker)
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
    return [e.meta.seq for e in log.of(PodEvent)]


async def api_view_moves_again(tmp_path: Path) -> None:
    """The pause outlasts the consumer's request timeout (the case that used to leave the view frozen)."""
    async with paused_broker() as broker:
        kafka = embedded(broker.bootstrap)
        server = ApiServer(ApiSettings(api_port=0, **settings_of(kafka), api_stale_after=5,
                                       log_level="warning"))
        url = await server.start()
        stop = asyncio.Event()

        async def produce() -> None:
            while not stop.is_set():
                try:
                    async with Publisher(kafka, "api-paused", request_timeout_ms=5000) as pub:
                        # The probe's inventory: the API believes GPU states of reported GPUs only.
                        inv = DeviceInventory(Meta("n-p", "probe/n-p", 1, 1, int(time.time() * 1000)),
                                              (GpuInfo("GPU-p", 0),))
                        await asyncio.wait_for(pub.send(topics.INVENTORY, "n-p", inv), 6)
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
                pause(broker)
                await until(lambda: _status(http, f"{url}/readyz", 503), 30,
                            "/readyz 503 with the broker paused")
                assert (await http.get("/healthz")).status_code == 200  # alive all the same
                await asyncio.sleep(45)
                resume(broker)
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
            await server.stop()


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))


@dataclasses.dataclass
class JoinerSeen:
    exit_code: int
    latest: dict[str, Output]  # the worker's last output per key after the pause
    expected: dict[str, Output]  # the pure core's over the same events


async def joiner_worker_resumes(tmp_path: Path) -> JoinerSeen:
    """A real Faust worker: not ready while its inputs stopped, then back on its own, and its outputs
    after the pause are those of the pure core over the same events (no restart of the worker needed)."""
    async with paused_broker() as broker:
        bootstrap = embedded(broker.bootstrap)
        # Set only while the worker's environment is built: the services in this process must not read it.
        with pytest.MonkeyPatch.context() as env:
            env.setenv("PERISCOPE_STALE_AFTER", "5s")
            worker = Worker(bootstrap, "joiner-paused", tmp_path, "w")
        nodes = [NodeScript("gpu-p", 1)]
        with workers(worker) as (w,):
            await w.ready()
            async with Publisher(bootstrap, "test-probe") as pub, OutputLog(bootstrap) as log:
                events = await publish_state(pub, nodes)
                await asyncio.sleep(0.5)
                events += await publish_samples([pub], nodes, range(10), pace_s=0.1)
                await log.wait_for("outputs of sample 9", caught_up(nodes, 9), timeout=60)
            pause(broker)
            try:
                await until(lambda: _ready_code(w, 503), 30, "joiner /readyz 503 while no input moves")
                assert '"data_age_s"' in (await asyncio.to_thread(w.get, "/readyz"))[1]
                await asyncio.sleep(40)
            finally:
                resume(broker)
            async with Publisher(bootstrap, "test-probe-2") as pub, OutputLog(bootstrap) as log:
                # Probes tick on: the worker is ready again while inputs move (and stale once they stop).
                stream = asyncio.create_task(publish_samples([pub], nodes, range(10, 300), pace_s=0.1))
                await log.wait_for("outputs of sample 29 after the pause", caught_up(nodes, 29), timeout=120)
                await until(lambda: _ready_code(w, 200), 30, "joiner ready again")
                events += await stream
                await log.wait_for("outputs of the last sample", caught_up(nodes, 299), timeout=60)
                latest = log.latest()
            exit_code = await asyncio.to_thread(w.stop)
    return JoinerSeen(exit_code, latest, reference(events))


async def _ready_code(w: Worker, code: int) -> bool:
    # In a thread: the four scenarios share one event loop, which a blocking request would stall.
    return (await asyncio.to_thread(w.get, "/readyz"))[0] == code


SCENARIOS: dict[str, Callable[[Path], Awaitable[Any]]] = {
    "probe": probe_flushes_what_it_buffered,
    "watcher": watcher_publishes_what_changed,
    "api": api_view_moves_again,
    "joiner": joiner_worker_resumes,
}


class Outcomes(dict[str, Any]):
    """Each scenario's result, or the exception it failed with (shown in short in a failure's report)."""

    def __repr__(self) -> str:
        return repr({k: type(v).__name__ for k, v in self.items()})


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> Outcomes:

    async def one(name: str) -> Any:
        tmp = tmp_path_factory.mktemp(f"paused-{name}")
        limit = asyncio.timeout(SCENARIO_LIMIT_S)
        try:
            async with limit:
                return await SCENARIOS[name](tmp)
        except Exception as e:  # reported by this scenario's own test
            if limit.expired():
                return AssertionError(f"the {name} scenario did not finish in {SCENARIO_LIMIT_S}s: {e!r}")
            return e

    async def every() -> Outcomes:
        results = await asyncio.gather(*(one(name) for name in SCENARIOS))
        return Outcomes(zip(SCENARIOS, results, strict=True))

    return asyncio.run(every())


def result(outcome: Outcomes, name: str) -> Any:
    got = outcome[name]
    if isinstance(got, Exception):
        raise got
    return got


# ---------------------------------------------------------------- tests


def test_probe_flushes_what_it_buffered_in_order(outcome: Outcomes) -> None:
    seen: ProbeSeen = result(outcome, "probe")
    # In order: per topic, sequence numbers grow in arrival order, and none is missing. A send that timed
    # out when the pause began may still be delivered after it (at least once): a repeat, which the
    # joiner counts as a duplicate, is allowed; going back to an older event is not.
    for name, seqs in seen.seqs.items():
        assert all(b >= a for a, b in itertools.pairwise(seqs)), (name, seqs)
    every = seen.every
    assert every == list(range(every[0], every[0] + len(every))), "a buffered event was lost"


def test_watcher_publishes_what_changed_while_the_broker_was_paused(outcome: Outcomes) -> None:
    seqs: list[int] = result(outcome, "watcher")
    # A publish that timed out may have been stored all the same and is then sent again (at least once,
    # as the broker has no idempotent producer): a repeat is allowed, an older event after a newer is not.
    assert all(b >= a for a, b in itertools.pairwise(seqs)), seqs


def test_api_view_moves_again_after_a_45s_pause(outcome: Outcomes) -> None:
    result(outcome, "api")  # its checks are made as it runs (readiness before, during and after the pause)


def test_joiner_worker_resumes_after_a_45s_pause(outcome: Outcomes) -> None:
    seen: JoinerSeen = result(outcome, "joiner")
    assert seen.exit_code == 0
    for key, want in seen.expected.items():
        assert seen.latest[key] == want, f"{key}:\n got  {summary(seen.latest[key])}\n want {summary(want)}"
