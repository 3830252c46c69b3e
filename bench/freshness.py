"""Freshness: from a probe's sample event time to the sample's visibility in GET /v1/pods, under load.

Live load: simulated nodes publish as probes and the watcher do (every wall-clock second each node's
telemetry sample stamped with the wall clock, the allocation snapshot every 5 ticks; nodes tick in 10
phases over the second, as independent probes would). On top, a few real probes (`python -m
services.probe`, each with the fake NVML, a /proc tree, a checkpoint and a PodResources socket served
from this process) publish their nodes; the watcher part of those nodes (node and pod events) comes from
the load. One joiner worker joins everything and the API (`periscope api`, its own process) consumes
the outputs. The marker nodes' pods live in a namespace of their own; this process polls
GET /v1/pods?namespace=<that> and, whenever a row shows a newer `last_seen` (the sample's event time),
records (time the response arrived - last_seen). The headline figures are the real probes' rows; the
synthetic markers' rows (exact 1 s ticks) and the age at the output topic are reported beside them.

Incumbent path for comparison: dcgm-exporter collects every 30 s and Prometheus scrapes every 15 s,
independent phases, so the age of what a query sees is U(0,30) + U(0,15) s: median 22.5 s, p99 42 s.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import subprocess
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
from aiokafka.errors import KafkaError

from bench import probe as probes
from bench import processes
from bench.common import Figure, Goal, broker_label, kafka, median, percentile, rounded
from bench.workload import NAMESPACE, NodeShape, SyntheticNode, pod_uid
from periscope.bus import codec, topics
from periscope.bus.producer import Publisher
from periscope.contract.values import parse_time_ms
from periscope.core.engine import DEFAULT_CONFIG

T = TypeVar("T")
GOAL = Goal("<", 1.5, "p99 < 1.5 s")
MARKER_NS = "bench-fresh"
COLLECT_S, SCRAPE_S = 30.0, 15.0
PROBE_NODE0 = 30_000  # node indices of the real probes


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


LATENESS_S = DEFAULT_CONFIG.lateness_ms / 1000  # the joiner's (PERISCOPE_LATENESS is not set here)
SLOTS = 10  # nodes tick in 10 phases 100 ms apart, as independent probes would, not all at once
ON_SCHEDULE_SLACK_MS = 200  # a synthetic node's next tick this much later than 1 s is late


async def _load(sims: list[SyntheticNode], pub: Publisher, stop: asyncio.Event,
                stats: dict[str, Any], published: dict[str, list[int]]) -> None:
    """Every wall-clock second, each node's tick stamped with the wall clock (like a probe); node i
    ticks at phase (i mod SLOTS) / SLOTS of the second. `published`: each node's event times sent."""
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
            try:
                for topic, items in by_topic.items():
                    await pub.send_many(topic, items)
            except KafkaError:  # the broker is paused (the outage run): this tick is skipped, as a probe's
                stats["ticks_failed"] = stats.get("ticks_failed", 0) + 1  # oldest samples would be
                continue
            stats["max_send_s"] = max(stats.get("max_send_s", 0.0), time.time() - t_ms / 1000)
            for s in group:
                published.setdefault(s.name, []).append(t_ms)
        stats["ticks"] = n = n + 1
        next_at += 1.0
        while next_at < time.time():  # fell behind by a whole tick: skip it, and say so
            next_at += 1.0
            stats["ticks_skipped"] = stats.get("ticks_skipped", 0) + 1


async def _poll(url: str, record_after: float, poll_s: float, stop: asyncio.Event,
                ages: dict[tuple[str, int], float], stats: dict[str, Any]) -> None:
    """Poll the marker namespace. A sample (node, event time) counts as visible once every row of its
    node that showed the previous sample shows it: its age is taken at the last of those rows."""
    seen: dict[tuple[str, str], int] = {}
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        while not stop.is_set():
            r = await client.get("/v1/pods", params={"namespace": MARKER_NS})
            arrived = time.time()
            stats["polls"] = stats.get("polls", 0) + 1
            if r.status_code == 200:
                for row in r.json()["items"]:
                    if not row["last_seen"]:
                        continue
                    key, ms = (row["pod_uid"], row["device_id"]), parse_time_ms(row["last_seen"])
                    if ms > seen.get(key, 0):
                        if key in seen and arrived >= record_after:
                            sample = (row["node"], ms)
                            ages[sample] = max(ages.get(sample, 0.0), arrived - ms / 1000)
                        seen[key] = ms
            await asyncio.sleep(poll_s)


async def _watch_outputs(bootstrap: str, pod_uids: set[str], record_after: float, stop: threading.Event,
                         ages: list[tuple[str, int, float]]) -> None:
    """(node, sample time, age) of each marker PodAttribution when it reaches periscope.attribution.v1
    (joiner side of the pipeline), read with a 20 ms fetch wait on a thread of its own so this watcher
    adds little."""
    from aiokafka import TopicPartition

    from periscope.bus.admin import partition_counts

    count = (await partition_counts(kafka(bootstrap), [topics.ATTRIBUTION.name]))[topics.ATTRIBUTION.name]
    c = kafka(bootstrap).consumer(client_id="bench-freshness", fetch_max_wait_ms=20)
    await c.start()
    try:
        parts = [TopicPartition(topics.ATTRIBUTION.name, p) for p in range(count)]
        c.assign(parts)
        await c.seek_to_end(*parts)
        seen: dict[str, int] = {}
        while not stop.is_set():
            got = await c.getmany(timeout_ms=200)
            now = time.time()
            for recs in got.values():
                for r in recs:
                    uid = (r.key or b"").decode()
                    if uid not in pod_uids:
                        continue
                    pa = codec.decode(topics.ATTRIBUTION, r.value)
                    newest = max((row.last_seen_ms for row in pa.rows), default=0)
                    if newest > seen.get(uid, 0):
                        if seen.get(uid) and now >= record_after:
                            ages.append((pa.node, newest, now - newest / 1000))
                        seen[uid] = newest
    finally:
        await c.stop()


def lateness_effect(ages: dict[tuple[str, int], float], nodes: set[str],
                    lateness_ms: int = DEFAULT_CONFIG.lateness_ms
                    ) -> dict[str, Any]:
    """How often a node's next sample came less than `lateness_ms` after the previous one (so the
    previous one had to wait for a later event), and the ages of those samples against the others."""
    by_node: dict[str, list[int]] = {}
    for node, ms in ages:
        if node in nodes:
            by_node.setdefault(node, []).append(ms)
    early: list[float] = []
    other: list[float] = []
    for node, times in by_node.items():
        times.sort()
        for a, b in itertools.pairwise(times):
            (early if b - a < lateness_ms else other).append(ages[(node, a)])
    n = len(early) + len(other)
    return {"next_tick_early_share": rounded(len(early) / n) if n else None,
            "age_p50_s_when_next_tick_early": rounded(percentile(early, 50)) if early else None,
            "age_p50_s_otherwise": rounded(percentile(other, 50)) if other else None}


def on_schedule(sampled: list[tuple[str, int, float]], published: dict[str, list[int]],
                slack_ms: int = ON_SCHEDULE_SLACK_MS) -> dict[str, Any]:
    """The synthetic markers' ages at the output topic split by whether their node's next tick was
    published on schedule (at most a tick and `slack_ms` later). A sample is joined once a later event
    of its node arrives, so one whose next tick this process sent late (it shares the machine with
    the pipeline and falls behind now and then) waits for that tick: the load's delay, not the joiner's."""
    on: list[float] = []
    late: list[float] = []
    for node, t, age in sampled:
        times = published.get(node)
        if not times:
            continue  # a real probe's node: its ticks are not known here
        i = bisect.bisect_right(times, t)
        if i == len(times):
            continue  # no later tick sent before the measurement ended
        (on if times[i] - t <= 1000 + slack_ms else late).append(age)
    return {"synthetic_next_tick_on_schedule": _quantiles(on),
            "synthetic_next_tick_late": _quantiles(late),
            "next_tick_late_means": f"the node's next tick was sent more than {1000 + slack_ms} ms after "
                                    "the sample (this process fell behind)"}


def span_quantiles(ages: dict[tuple[str, int], float], out_sampled: list[tuple[str, int, float]],
                   published: dict[str, list[int]], headline: set[str], start_s: float, span_s: float,
                   spans: int) -> list[dict[str, Any]]:
    """Each span's own figures: the headline nodes' ages at the API (p50, p99) and the synthetic
    markers' at the output topic whose next tick came on schedule (p99), samples split by event time."""
    heads = [(ms, a) for (node, ms), a in ages.items() if node in headline]
    api = [[a for _, a in span] for span in _in_spans(heads, [ms for ms, _ in heads], start_s, span_s, spans)]
    topic = _in_spans(out_sampled, [ms for _, ms, _ in out_sampled], start_s, span_s, spans)
    out = []
    for k in range(spans):
        q, timely = _quantiles(api[k]), on_schedule(topic[k], published)["synthetic_next_tick_on_schedule"]
        out.append({"p50_s": q.get("p50_s"), "p99_s": q.get("p99_s"), "samples": q["samples"],
                    "output_topic_p99_s": timely.get("p99_s"), "output_topic_samples": timely["samples"]})
    return out


def _quantiles(xs: list[float]) -> dict[str, Any]:
    if not xs:
        return {"samples": 0}
    return {"p50_s": rounded(percentile(xs, 50)), "p99_s": rounded(percentile(xs, 99)),
            "max_s": rounded(max(xs)), "samples": len(xs)}


def by_span(times_ms: list[int], start_s: float, span_s: float, spans: int) -> list[int]:
    """The measured span each sample falls in, by its event time: consecutive spans of `span_s` from
    `start_s` (epoch seconds); a sample before the first counts in it, one after the last in that."""
    return [min(spans - 1, max(0, int((ms / 1000 - start_s) // span_s))) for ms in times_ms]


def _in_spans(items: list[T], times_ms: list[int], start_s: float, span_s: float, spans: int
              ) -> list[list[T]]:
    """`items` (whose event times are `times_ms`) in the spans `by_span` puts them in."""
    out: list[list[T]] = [[] for _ in range(spans)]
    for item, i in zip(items, by_span(times_ms, start_s, span_s, spans), strict=True):
        out[i].append(item)
    return out


async def run(bootstrap: str, tmp: Path, nodes: int, markers: int, real_probes: int, warm_s: float,
              span_s: float, poll_s: float = 0.05, shape: NodeShape = NodeShape(),
              outage: Callable[[str, str], Awaitable[tuple[Figure, dict[str, Any]]]] | None = None,
              spans: int = 1) -> tuple[list[Figure], dict[str, Any]]:
    """With `outage`, it is awaited (API url, marker namespace) once the spans were measured, and its
    figure is added; the freshness figures come from the spans alone. `spans` consecutive spans of
    `span_s` are measured in one live run: each figure is the median over them, and its runs are the
    spans' own (each span's percentiles from its samples, split by the sample's event time)."""
    worker = processes.joiner(bootstrap, f"bench-fresh-{uuid.uuid4().hex[:8]}", tmp)
    api = processes.api(bootstrap, tmp)
    ages: dict[tuple[str, int], float] = {}
    out_ages: list[tuple[str, int, float]] = []
    published: dict[str, list[int]] = {}
    stats: dict[str, Any] = {}
    running: list[subprocess.Popen[bytes]] = []
    with probes.Kubelets() as kubelets:
        try:
            await asyncio.to_thread(worker.wait_ready, 90)
            url = await asyncio.to_thread(api.wait_ready, 90)
            # Synthetic markers go to different tick phases (node i ticks in slot i mod SLOTS).
            marker_ix = {round(k * SLOTS / markers) for k in range(markers)} if markers <= SLOTS else set(
                range(markers))
            sims = [SyntheticNode(10_000 + i, shape, namespace=MARKER_NS if i in marker_ix else NAMESPACE)
                    for i in range(nodes)]
            synthetic = {s.name for i, s in enumerate(sims) if i in marker_ix}
            # The real probes' nodes: node and pod events from here, the rest from the probe.
            watched = [SyntheticNode(PROBE_NODE0 + k, probes.SHAPE, namespace=MARKER_NS)
                       for k in range(real_probes)]
            real = {w.name for w in watched}
            marker_uids = {pod_uid(s.index, p) for s in [*sims, *watched] if s.name in synthetic | real
                           for p in range(shape.gpus)}
            async with Publisher(kafka(bootstrap), "bench-live", linger_ms=5) as pub:
                now_ms = int(time.time() * 1000)
                by_topic: dict[topics.Topic, list[tuple[str, object]]] = {}
                for s in sims:
                    for topic, ev in s.setup(now_ms):
                        by_topic.setdefault(topic, []).append((s.name, ev))
                for w in watched:
                    by_topic.setdefault(topics.NODES, []).append((w.name, w.node_event(now_ms)))
                    by_topic.setdefault(topics.PODS, []).extend((w.name, ev) for ev in w.pods(now_ms))
                for topic, items in by_topic.items():
                    await pub.send_many(topic, items)
                for w in watched:
                    env = probes.prepare(tmp / f"probe-{w.name}", probes.SHAPE, w.index)
                    kubelets.add(env, w.index, MARKER_NS)
                    running.append(probes.start_probe(env, bootstrap, 1.0, tmp / f"probe-{w.name}.log"))
                stop = asyncio.Event()
                started = time.time()
                stop_watch = threading.Event()
                watch = threading.Thread(target=asyncio.run, daemon=True, args=(_watch_outputs(
                    bootstrap, marker_uids, started + warm_s, stop_watch, out_ages),))
                watch.start()
                tasks = [asyncio.ensure_future(_load(sims, pub, stop, stats, published)),
                         asyncio.ensure_future(_poll(url, started + warm_s, poll_s, stop, ages, stats))]
                await asyncio.sleep(warm_s)
                c_worker, c_api, t0 = worker.cpu_s(), api.cpu_s(), time.monotonic()
                await asyncio.sleep(spans * span_s)
                span = time.monotonic() - t0
                util = {"worker_cpu_util": rounded((worker.cpu_s() - c_worker) / span),
                        "api_cpu_util": rounded((api.cpu_s() - c_api) / span)}
                measured, measured_out = dict(ages), list(out_ages)
                outage_figure = await outage(url, MARKER_NS) if outage is not None else None
                stop.set()
                stop_watch.set()
                watch.join(15)
                for t in tasks:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(t, 15)
        finally:
            for p in running:
                probes.stop_probe(p)
            worker.stop()
            api.stop()
    ages, out_sampled = measured, measured_out
    topic_ages = [age for _, _, age in out_sampled]
    by_kind = {"real": [a for (n, _), a in ages.items() if n in real],
               "synthetic": [a for (n, _), a in ages.items() if n in synthetic]}
    headline = by_kind["real"] if real else by_kind["synthetic"]
    if len(headline) < 5:
        raise RuntimeError(f"only {len(headline)} freshness samples ({len(by_kind['real'])} of real probes, "
                           f"{len(by_kind['synthetic'])} of synthetic markers, {len(topic_ages)} at the "
                           f"output topic); worker log:\n{worker.log()[-1500:]}\n"
                           f"api log:\n{api.log()[-1500:]}")
    per_span = span_quantiles(ages, out_sampled, published, real or synthetic, started + warm_s, span_s,
                              spans)
    p50s = [q["p50_s"] for q in per_span if q["samples"]]
    p99s = [q["p99_s"] for q in per_span if q["samples"]]
    p50, p99 = median(p50s), median(p99s)
    topic_p99s = [q["output_topic_p99_s"] for q in per_span if q["output_topic_p99_s"] is not None]
    inc50, inc99 = incumbent_staleness(50), incumbent_staleness(99)
    setup = {
        "load": f"{nodes} synthetic nodes x {shape.gpus} GPUs at 1 s ticks = {nodes * shape.gpus} "
                f"device-samples/s, live, wall-clock event time; plus {real_probes} real probes "
                f"(8 GPUs x 64 processes each, 1 s tick)",
        "pipeline": f"probes and load publisher -> {broker_label()} -> 1 joiner worker (python -m "
                    "services.joiner) -> output topics -> periscope api (own process, consumer + uvicorn) "
                    f"-> this process polling GET /v1/pods?namespace={MARKER_NS} every "
                    f"{poll_s * 1000:.0f} ms",
        "samples": "one per published node sample, taken when the last of the node's rows shows it "
                   "(rows are published on change or at the joiner's heartbeat, 5 s by default: the real "
                   "probes' utilization is steady, so their samples are mostly heartbeats; the synthetic "
                   "markers' utilization moves every tick); headline: the real probes' nodes"
                   if real else "one per published node sample; synthetic markers (no real probe)",
        "real_probes": {**_quantiles(by_kind["real"]), **lateness_effect(ages, real)},
        "synthetic_markers": {**_quantiles(by_kind["synthetic"]), **lateness_effect(ages, synthetic)},
        "at_output_topic": {**_quantiles(topic_ages),
                            "what": "sample event time -> the marker PodAttribution arriving on "
                                    "periscope.attribution.v1 (a 20 ms fetch-wait consumer in this process)",
                            **on_schedule(out_sampled, published)},
        "warm_up_s": warm_s, "span_s": span_s, "spans": spans,
        "by_span": per_span if spans > 1 else None,
        "joiner_lateness": f"{LATENESS_S:g}s (default): a sample is joined once a later event of its node "
                           f"shows the watermark at least {LATENESS_S:g} s past it",
        "worker_env": processes.JOINER_ENV, **util, **{k: rounded(v) for k, v in stats.items()},
    }
    late = lateness_effect(ages, real or synthetic)
    early = late["next_tick_early_share"] or 0.0
    topic_p50 = _quantiles(topic_ages).get("p50_s")
    limit = (f"the joiner's lateness: a sample is joined once a later event of its node is at least "
             f"{LATENESS_S:g} s newer (with 1 s ticks, the next tick; {early:.0%} of samples had their next "
             "tick come sooner and waited for the one after); then the mark write is acked before "
             "publishing. "
             f"Age at the output topic p50 {topic_p50} s, so the API (consumer fetch + HTTP) adds the rest")
    inc = {"incumbent": "dcgm-exporter 30 s collect + Prometheus 15 s scrape: age ~ U(0,30)+U(0,15) s",
           "incumbent_p50_s": inc50, "incumbent_p99_s": inc99}
    over = f"; median of {spans} consecutive {span_s:g} s spans" if spans > 1 else ""
    brief = (f"{nodes} live nodes x {shape.gpus} GPUs at 1 s ticks ({nodes * shape.gpus} device-samples/s) "
             f"+ {real_probes} real probes, 1 worker, API in its own process, /v1/pods polled every "
             f"{poll_s * 1000:.0f} ms; {len(headline)} samples{over}")
    inc_brief = "age of a value seen through U(0,30 s) collect + U(0,15 s) scrape"
    # The goal's figure: the pipeline's own delay. A sample is joined once a later event of its node
    # arrives, so one whose next tick this process sent late waited for the load, not the pipeline;
    # those are left out and counted (one tick of every marker in a 60 s span, in the runs of
    # 2026-11-30: the load process, sharing two cores with everything else, fell a tick behind).
    topic = setup["at_output_topic"]
    timely = topic["synthetic_next_tick_on_schedule"]
    topic_p99 = median(topic_p99s) if topic_p99s else None
    left_out = topic["synthetic_next_tick_late"].get("samples", 0)
    figures = [
        Figure("freshness_p50_s", p50, "s", setup, limit, None, p50s, brief,
               baseline="incumbent_staleness_p50_s"),
        Figure("freshness_p99_s", p99, "s", setup, limit, GOAL, p99s, brief,
               baseline="incumbent_staleness_p99_s"),
        # The issue's own measure: the API's consumer and HTTP left out.
        Figure("freshness_output_topic_p99_s", topic_p99, "s", setup,
               "the joiner's lateness (one tick), then the mark write acked before publishing", GOAL,
               topic_p99s,
               f"{nodes} live nodes x {shape.gpus} GPUs at 1 s ticks, 1 worker; synthetic marker sample "
               f"event time -> its PodAttribution on the output topic; {timely.get('samples', 0):,} "
               f"samples whose node's next tick was sent on time (left out: {left_out} whose next tick "
               f"was late; every sample: p99 {topic.get('p99_s')} s){over}"),
        Figure("incumbent_staleness_p50_s", inc50, "s", inc, "collect and scrape intervals", None, [inc50],
               inc_brief),
        Figure("incumbent_staleness_p99_s", inc99, "s", inc, "collect and scrape intervals", None, [inc99],
               inc_brief),
        Figure("freshness_vs_incumbent_p50_ratio", inc50 / p50, "x",
               {"what": "incumbent_staleness_p50_s / freshness_p50_s (how many times fresher)"}, "", None,
               [inc50 / x for x in p50s], "incumbent p50 / our p50"),
        Figure("freshness_vs_incumbent_p99_ratio", inc99 / p99, "x",
               {"what": "incumbent_staleness_p99_s / freshness_p99_s (how many times fresher)"}, "", None,
               [inc99 / x for x in p99s], "incumbent p99 / our p99"),
    ]
    if outage_figure is not None:
        figures.append(outage_figure[0])
    return figures, {"ages_s": {k: sorted(round(a, 3) for a in v) for k, v in by_kind.items()}}


async def hop_latency(bootstrap: str, fetch_max_wait_ms: int, n: int) -> float:
    """Median ms from a produce (acks=all) to a waiting consumer's getmany returning it: one broker hop."""
    from aiokafka import TopicPartition

    topic = topics.DEADLETTER.name  # one partition, unused by the benchmark load
    producer = kafka(bootstrap).producer("bench-hop", linger_ms=0)
    consumer = kafka(bootstrap).consumer(client_id="bench-hop", fetch_max_wait_ms=fetch_max_wait_ms)
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
