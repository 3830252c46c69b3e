"""Freshness: from a probe's sample event time to the sample's visibility in GET /v1/pods, under load.

A live load of simulated nodes publishes like probes do: every wall-clock second each node's telemetry
sample, stamped with the wall clock at sampling (its event time), plus the allocation snapshot every 5
ticks. One joiner worker joins them and the API service (`periscope api`, its own process) consumes the
outputs. A few of the nodes carry their pods in a namespace of their own; this process polls
GET /v1/pods?namespace=<that> and, whenever a node's rows show a newer `last_seen`, records
(time the response arrived - last_seen). Incumbent path for comparison: dcgm-exporter collects every
30 s and Prometheus scrapes every 15 s, independent phases, so the age of what a query sees is
U(0,30) + U(0,15) s: median 22.5 s, 99th percentile 42 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from bench import processes
from bench.common import Figure, Goal, percentile, rounded
from bench.workload import NAMESPACE, NodeShape, SyntheticNode
from periscope.bus import topics
from periscope.bus.producer import Publisher
from services.api.render import parse_time_ms

GOAL = Goal("<", 2.0, "p99 < 2 s")
MARKER_NS = "bench-fresh"
COLLECT_S, SCRAPE_S = 30.0, 15.0


def incumbent_staleness(p: float) -> float:
    """Percentile p (0..100) of U(0, COLLECT_S) + U(0, SCRAPE_S): the age of a dcgm-exporter value seen
    through Prometheus at a random instant."""
    a, b = max(COLLECT_S, SCRAPE_S), min(COLLECT_S, SCRAPE_S)
    q = p / 100
    if q <= b / (2 * a):  # lower triangle
        return (2 * a * b * q) ** 0.5
    if q <= 1 - b / (2 * a):  # flat middle
        return a * q + b / 2
    return a + b - (2 * a * b * (1 - q)) ** 0.5


SLOTS = 10  # nodes tick in 10 phases 100 ms apart, as independent probes would, not all at once


async def _load(sims: list[SyntheticNode], pub: Publisher, stop: asyncio.Event,
                stats: dict[str, Any]) -> None:
    """Every wall-clock second, each node's tick stamped with the wall clock (like a probe); node i
    ticks at phase (i mod SLOTS) / SLOTS of the second."""
    slots = [sims[k::SLOTS] for k in range(SLOTS)]
    n = 0
    next_at = float(int(time.time()) + 1)
    while not stop.is_set():
        for k, group in enumerate(slots):
            await asyncio.sleep(max(0.0, next_at + k / SLOTS - time.time()))
            t_ms = int(time.time() * 1000)
            by_topic: dict[topics.Topic, list[tuple[str, object]]] = {}
            for s in group:
                for topic, ev in s.tick(t_ms, n):
                    by_topic.setdefault(topic, []).append((s.name, ev))
            for topic, items in by_topic.items():
                await pub.send_many(topic, items)
            stats["max_send_s"] = max(stats.get("max_send_s", 0.0), time.time() - t_ms / 1000)
        stats["ticks"] = n = n + 1
        next_at += 1.0
        while next_at < time.time():  # fell behind by a whole tick: skip it, and say so
            next_at += 1.0
            stats["ticks_skipped"] = stats.get("ticks_skipped", 0) + 1


async def _poll(url: str, markers: set[str], record_after: float, poll_s: float, stop: asyncio.Event,
                ages: list[float], stats: dict[str, Any]) -> None:
    seen: dict[str, int] = {}
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        while not stop.is_set():
            r = await client.get("/v1/pods", params={"namespace": MARKER_NS})
            arrived = time.time()
            stats["polls"] = stats.get("polls", 0) + 1
            if r.status_code == 200:
                newest: dict[str, int] = {}
                for row in r.json()["items"]:
                    if row["node"] in markers and row["last_seen"]:
                        ms = parse_time_ms(row["last_seen"])
                        newest[row["node"]] = max(newest.get(row["node"], 0), ms)
                for node, ms in newest.items():
                    if ms > seen.get(node, 0):
                        if seen.get(node) and arrived >= record_after:
                            ages.append(arrived - ms / 1000)
                        seen[node] = ms
            await asyncio.sleep(poll_s)


async def run(bootstrap: str, tmp: Path, nodes: int, markers: int, warm_s: float, span_s: float,
              poll_s: float = 0.05, shape: NodeShape = NodeShape()) -> tuple[list[Figure], dict[str, Any]]:
    worker = processes.joiner(bootstrap, f"bench-fresh-{uuid.uuid4().hex[:8]}", tmp)
    api = processes.api(bootstrap, tmp)
    ages: list[float] = []
    stats: dict[str, Any] = {}
    try:
        await asyncio.to_thread(worker.wait_ready, 90)
        url = await asyncio.to_thread(api.wait_ready, 90)
        # Markers go to different tick phases (node i ticks in slot i mod SLOTS).
        marker_ix = {round(k * SLOTS / markers) for k in range(markers)} if markers <= SLOTS else set(
            range(markers))
        sims = [SyntheticNode(10_000 + i, shape, namespace=MARKER_NS if i in marker_ix else NAMESPACE)
                for i in range(nodes)]
        marker_names = {s.name for i, s in enumerate(sims) if i in marker_ix}
        async with Publisher(bootstrap, "bench-live", linger_ms=5) as pub:
            now_ms = int(time.time() * 1000)
            by_topic: dict[topics.Topic, list[tuple[str, object]]] = {}
            for s in sims:
                for topic, ev in s.setup(now_ms):
                    by_topic.setdefault(topic, []).append((s.name, ev))
            for topic, items in by_topic.items():
                await pub.send_many(topic, items)
            stop = asyncio.Event()
            started = time.time()
            tasks = [asyncio.ensure_future(_load(sims, pub, stop, stats)),
                     asyncio.ensure_future(_poll(url, marker_names, started + warm_s, poll_s,
                                                 stop, ages, stats))]
            await asyncio.sleep(warm_s)
            c_worker, c_api, t0 = worker.cpu_s(), api.cpu_s(), time.monotonic()
            await asyncio.sleep(span_s)
            span = time.monotonic() - t0
            util = {"worker_cpu_util": rounded((worker.cpu_s() - c_worker) / span),
                    "api_cpu_util": rounded((api.cpu_s() - c_api) / span)}
            stop.set()
            for t in tasks:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(t, 15)
    finally:
        worker.stop()
        api.stop()
    if len(ages) < 5:
        raise RuntimeError(f"only {len(ages)} freshness samples; worker log:\n{worker.log()[-1500:]}\n"
                           f"api log:\n{api.log()[-1500:]}")
    p50, p99 = percentile(ages, 50), percentile(ages, 99)
    inc50, inc99 = incumbent_staleness(50), incumbent_staleness(99)
    setup = {
        "load": f"{nodes} nodes x {shape.gpus} GPUs ({shape.processes} processes) at 1 s ticks = "
                f"{nodes * shape.gpus} device-samples/s, live, wall-clock event time",
        "pipeline": "load publisher -> embedded broker -> 1 joiner worker (python -m services.joiner) -> "
                    "output topics -> periscope api (own process, consumer + uvicorn) -> this process "
                    "polling "
                    f"GET /v1/pods?namespace={MARKER_NS} every {poll_s * 1000:.0f} ms",
        "markers": markers, "samples": len(ages), "warm_up_s": warm_s, "span_s": span_s,
        "joiner_lateness": "1s (default): a sample is joined once its node's next event shows the "
                           "watermark 1 s past it, so at 1 s ticks about one tick is inherent",
        "worker_env": processes.JOINER_ENV, **util, **{k: rounded(v) for k, v in stats.items()},
        "min_s": rounded(min(ages)), "max_s": rounded(max(ages)),
    }
    limit = ("the joiner's 1 s lateness (one tick at 1 s ticks) + publish after the table mark is acked + "
             "API "
             "consumer fetch + HTTP (the API's ~40 ms Nagle delay per response included)")
    inc = {"incumbent": "dcgm-exporter 30 s collect + Prometheus 15 s scrape: age ~ U(0,30)+U(0,15) s",
           "incumbent_p50_s": inc50, "incumbent_p99_s": inc99}
    brief = (f"{nodes} live nodes x {shape.gpus} GPUs at 1 s ticks ({nodes * shape.gpus} device-samples/s), "
             f"1 worker, API in its own process, /v1/pods polled every {poll_s * 1000:.0f} ms; "
             f"{len(ages)} samples")
    inc_brief = "age of a value seen through U(0,30 s) collect + U(0,15 s) scrape"
    figures = [
        Figure("freshness_p50_s", p50, "s", setup, limit, None, [p50], brief),
        Figure("freshness_p99_s", p99, "s", setup, limit, GOAL, [p99], brief),
        Figure("incumbent_staleness_p50_s", inc50, "s", inc, "collect and scrape intervals", None, [inc50],
               inc_brief),
        Figure("incumbent_staleness_p99_s", inc99, "s", inc, "collect and scrape intervals", None, [inc99],
               inc_brief),
        Figure("freshness_vs_incumbent_p50_ratio", inc50 / p50, "x",
               {"what": "incumbent_staleness_p50_s / freshness_p50_s (how many times fresher)"}, "", None,
               [inc50 / p50], "incumbent p50 / our p50"),
        Figure("freshness_vs_incumbent_p99_ratio", inc99 / p99, "x",
               {"what": "incumbent_staleness_p99_s / freshness_p99_s (how many times fresher)"}, "", None,
               [inc99 / p99], "incumbent p99 / our p99"),
    ]
    return figures, {"ages_s": [round(a, 3) for a in sorted(ages)]}


async def hop_latency(bootstrap: str, fetch_max_wait_ms: int, n: int) -> float:
    """Median ms from a produce (acks=all) to a waiting consumer's getmany returning it: one broker hop."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    topic = topics.DEADLETTER.name  # one partition, unused by the benchmark load
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0, acks="all")
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=fetch_max_wait_ms,
                                enable_auto_commit=False)
    await producer.start()
    await consumer.start()
    lat: list[float] = []
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_end(tp)
        await consumer.position(tp)

        async def drain() -> None:
            while len(lat) < n:
                got = await consumer.getmany(timeout_ms=2000)
                now = time.perf_counter()
                lat.extend(now - float(r.value) for recs in got.values() for r in recs)

        task = asyncio.ensure_future(drain())
        await asyncio.sleep(0.3)
        for _ in range(n):
            await producer.send_and_wait(topic, str(time.perf_counter()).encode(), partition=0)
            await asyncio.sleep(0.137)  # not a multiple of any broker timer
        await asyncio.wait_for(task, 10)
    finally:
        await producer.stop()
        await consumer.stop()
    return percentile(lat, 50) * 1000
