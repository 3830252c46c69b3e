"""The Faust joiner on the embedded broker: sustained throughput of one worker against the raw consume
rate of the same topic, and per pod-device row memory of the worker.

The input topics are preloaded with `nodes` simulated nodes (8 GPUs, 8 processes) over `ticks` 1 s
ticks of event time (plus pods, node labels, inventory and the allocation snapshot republished every 5
ticks, as the watcher and probe publish them). A fresh worker (new APP_ID, so a new consumer group
reading from the start) then works through the backlog; every device-sample it processes yields one
GpuState record on periscope.gpus.v1, which a bare consumer in this process counts as they arrive.
The rate is taken between 10% and 90% of the expected records, so group join and the tail are left out.
The transport limit is a bare aiokafka consumer reading the telemetry topic from the start (no group,
no decoding; and once more with protobuf decoding).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from bench import processes
from bench.common import Figure, Goal, end_offsets, kafka_kwargs, kafka_security, median, proc_cpu_s, rounded
from bench.workload import T0_MS, NodeShape, SyntheticNode
from periscope.bus import codec, topics
from periscope.bus.producer import Publisher

GOAL = Goal(">=", 8000, ">= 8,000 device-samples/s, within 3x of raw consume")
RATIO_GOAL = Goal("<", 3.0, "< 3 (raw consume rate / joiner rate)")


async def publish(bootstrap: str, batches: list[list[tuple[topics.Topic, Any]]]) -> int:
    """Publish events in order (batch by batch, one send_many per topic); returns records sent."""
    sent = 0
    async with Publisher(bootstrap, "bench-load", linger_ms=20, security=kafka_security()) as pub:
        for batch in batches:
            by_topic: dict[topics.Topic, list[tuple[str, object]]] = {}
            for topic, ev in batch:
                by_topic.setdefault(topic, []).append((ev.meta.node, ev))
            for topic, items in by_topic.items():
                await pub.send_many(topic, items)
                sent += len(items)
    return sent


async def preload(bootstrap: str, nodes: int, ticks: int, shape: NodeShape) -> dict[str, int]:
    sims = [SyntheticNode(i, shape) for i in range(nodes)]
    batches: list[list[tuple[topics.Topic, Any]]] = [[e for s in sims for e in s.setup(T0_MS - 1)]]
    chunk: list[tuple[topics.Topic, Any]] = []
    for n in range(ticks):
        for s in sims:
            chunk.extend(s.tick(T0_MS + n * 1000, n))
        if len(chunk) >= 2000:
            batches.append(chunk)
            chunk = []
    batches.append(chunk)
    records = await publish(bootstrap, batches)
    return {"records": records, "telemetry_records": nodes * ticks,
            "device_samples": nodes * ticks * shape.gpus}


async def _consumer(bootstrap: str, topic: str) -> tuple[AIOKafkaConsumer, list[TopicPartition]]:
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
                         **kafka_kwargs(),
                         max_partition_fetch_bytes=4 * 1024 * 1024, fetch_max_bytes=16 * 1024 * 1024)
    await c.start()
    await c.topics()  # a metadata fetch, so partitions_for_topic knows the topic
    parts = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic) or ())]
    c.assign(parts)
    return c, parts


async def raw_consume(bootstrap: str, topic: topics.Topic, per_record: int, decode: bool) -> float:
    """Device-samples/s of a bare consumer reading `topic` from the start to its current end."""
    c, parts = await _consumer(bootstrap, topic.name)
    try:
        ends = await c.end_offsets(parts)
        await c.seek_to_beginning(*parts)
        n, started = 0, time.perf_counter()
        while [p for p in parts if await c.position(p) < ends[p]]:
            batches = await c.getmany(timeout_ms=1000, max_records=10_000)
            for recs in batches.values():
                n += len(recs)
                if decode:
                    for r in recs:
                        codec.decode(topic, r.value)
        return n * per_record / (time.perf_counter() - started)
    finally:
        await c.stop()


class OutputCounter:
    """Counts records appended to an output topic after `start()`, with their arrival times."""

    def __init__(self, bootstrap: str, topic: topics.Topic) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.marks: list[tuple[float, int]] = []  # (monotonic time, records so far)
        self.count = 0

    async def start(self) -> None:
        self.consumer, parts = await _consumer(self.bootstrap, self.topic.name)
        await self.consumer.seek_to_end(*parts)
        for p in parts:
            await self.consumer.position(p)  # resolve the end now, before the worker writes

    async def until(self, expected: int, timeout_s: float, stall_s: float,
                    on_mark: Any = None) -> None:
        deadline = time.monotonic() + timeout_s
        last_progress = time.monotonic()
        while self.count < expected and time.monotonic() < deadline:
            batches = await self.consumer.getmany(timeout_ms=200, max_records=20_000)
            got = sum(len(r) for r in batches.values())
            now = time.monotonic()
            if got:
                self.count += got
                self.marks.append((now, self.count))
                last_progress = now
                if on_mark is not None:
                    on_mark(self.count)
            elif self.count and now - last_progress > stall_s:
                break

    async def stop(self) -> None:
        await self.consumer.stop()

    def rate(self, expected: int, lo: float = 0.1, hi: float = 0.9) -> tuple[float, float, float]:
        """(records/s between lo and hi of `expected`, time of lo, time of hi)."""
        t_lo = next(t for t, n in self.marks if n >= lo * expected)
        n_lo = next(n for t, n in self.marks if n >= lo * expected)
        t_hi, n_hi = next(((t, n) for t, n in self.marks if n >= hi * expected), self.marks[-1])
        return (n_hi - n_lo) / (t_hi - t_lo), t_lo, t_hi


async def settle(bootstrap: str, topic: topics.Topic, quiet_s: float = 1.0, timeout_s: float = 15) -> None:
    """Wait until nothing more is appended to `topic` (a stopped worker's last records), so the next
    run counts only its own."""
    deadline = time.monotonic() + timeout_s
    last = await end_offsets(bootstrap, topic.name)
    while time.monotonic() < deadline:
        await asyncio.sleep(quiet_s)
        now = await end_offsets(bootstrap, topic.name)
        if now == last:
            return
        last = now


async def one_worker_run(bootstrap: str, tmp: Path, expected: int, broker_pid: int | None,
                         timeout_s: float, wrap: list[str] | None = None) -> dict[str, Any]:
    """Start a fresh worker on the preloaded backlog and measure its output rate."""
    counter = OutputCounter(bootstrap, topics.GPUS)
    await counter.start()
    app_id = f"bench-joiner-{uuid.uuid4().hex[:8]}"
    spawned = time.monotonic()
    worker = processes.joiner(bootstrap, app_id, tmp, wrap)
    cpu: dict[str, tuple[float, float]] = {}

    def on_mark(n: int) -> None:
        for frac in (0.1, 0.9):
            if n >= frac * expected and str(frac) not in cpu and worker.proc.poll() is None:
                broker = proc_cpu_s(broker_pid) if broker_pid else 0.0
                cpu[str(frac)] = (worker.cpu_s() if wrap is None else 0.0, broker)

    try:
        counting = asyncio.ensure_future(counter.until(expected, timeout_s, stall_s=15, on_mark=on_mark))
        url = await asyncio.to_thread(worker.wait_url, 90)
        listening_s = time.monotonic() - spawned
        rss_start = worker.rss() if wrap is None else 0
        await counting
        rss_done = worker.rss() if wrap is None else 0
        await asyncio.sleep(1.0)  # the worker's loop is free again once the backlog is done
        nodes_held = await asyncio.to_thread(worker.metric, "periscope_joiner_nodes")
    finally:
        await counter.stop()
        if wrap is None:
            worker.stop()
            await settle(bootstrap, topics.GPUS)
    if counter.count < 0.9 * expected:
        raise RuntimeError(f"joiner produced {counter.count} of {expected} GpuState records:\n"
                           f"{worker.log()[-2000:]}")
    rate, t_lo, t_hi = counter.rate(expected)
    span = t_hi - t_lo
    out: dict[str, Any] = {
        "device_samples_per_s": rate, "listening_s": listening_s,
        "first_output_s": counter.marks[0][0] - spawned,
        "measured_s": span, "outputs_seen": counter.count, "url": url, "worker": worker,
        "rss_start": rss_start, "rss_done": rss_done, "nodes_held": nodes_held,
    }
    if "0.1" in cpu and "0.9" in cpu:
        out["worker_cpu_util"] = (cpu["0.9"][0] - cpu["0.1"][0]) / span
        out["broker_cpu_util"] = (cpu["0.9"][1] - cpu["0.1"][1]) / span
    return out


async def throughput(bootstrap: str, broker_pid: int | None, tmp: Path, nodes: int, ticks: int, repeats: int,
                     timeout_s: float, shape: NodeShape = NodeShape()) -> tuple[list[Figure], dict[str, Any]]:
    load = await preload(bootstrap, nodes, ticks, shape)
    expected = load["device_samples"]  # one GpuState per GPU per tick
    runs = []
    for _ in range(repeats):
        r = await one_worker_run(bootstrap, tmp, expected, broker_pid, timeout_s)
        r.pop("worker")
        runs.append(r)
    raw = [await raw_consume(bootstrap, topics.TELEMETRY, shape.gpus, decode=False) for _ in range(repeats)]
    raw_dec = [await raw_consume(bootstrap, topics.TELEMETRY, shape.gpus, decode=True)
               for _ in range(repeats)]
    rates = [r["device_samples_per_s"] for r in runs]
    joiner_rate, raw_rate = median(rates), median(raw)
    rows = nodes * shape.gpus
    mem = [(r["rss_done"] - r["rss_start"]) / rows for r in runs]
    setup: dict[str, Any] = {
        "workers": 1, "nodes": nodes, "gpus_per_node": shape.gpus, "processes_per_node": shape.processes,
        "tick": "1s (event time)", "ticks": ticks, **load, "repeats": repeats,
        "how": "backlog preloaded on the embedded broker (input topics: 4 partitions); a fresh `python -m "
               "services.joiner` worker (new APP_ID) consumes it; GpuState records counted on "
               "periscope.gpus.v1 by a bare consumer; rate between 10% and 90% of the expected records",
        "worker_env": processes.JOINER_ENV,
        "history": f"rows hold up to {ticks // 60 + 1} one-minute windows (a fresh worker); see "
                   "replay_steady_device_samples_per_s for the cost at 1 h of windows",
        "worker_cpu_util": rounded(median([r.get("worker_cpu_util", float("nan")) for r in runs])),
        "broker_cpu_util": rounded(median([r.get("broker_cpu_util", float("nan")) for r in runs])),
        "first_output_s": rounded(median([r["first_output_s"] for r in runs])),
    }
    raw_setup: dict[str, Any] = {
        "consumer": "AIOKafkaConsumer, no group, all 4 partitions assigned, from the start, "
                    "getmany(max_records=10000), values not decoded",
        "topic": topics.TELEMETRY.name, "records": load["telemetry_records"], "repeats": repeats,
        "with_decode_device_samples_per_s": rounded(median(raw_dec)),
    }
    ratio = raw_rate / joiner_rate
    util, butil = setup["worker_cpu_util"], setup["broker_cpu_util"]
    limit = (f"CPU: the worker used {util:.0%} of a core and the broker {butil:.0%} (2 cores in all); per "
             "sample the worker decodes, steps the core, encodes a PodAttribution and a GpuState (handed to "
             "the producer as whole record batches), writes a mark per input record and state records to "
             "changelog tables; Faust and the event loop schedule every input record (hot spots: "
             "bench/run.py --profile)")
    if util is not None and util < 0.8:
        limit = (f"not CPU-bound (worker {util:.0%} of a core, broker {butil:.0%}): waits on broker round "
                 "trips")
    brief = (f"1 worker, {nodes} nodes x {shape.gpus} GPUs ({shape.processes} processes) x {ticks} s of 1 s "
             "ticks "
             f"preloaded on the embedded broker; median of {repeats}")
    figures = [
        Figure("joiner_device_samples_per_s", joiner_rate, "device-samples/s", setup, limit, GOAL, rates,
               brief),
        Figure("raw_consume_device_samples_per_s", raw_rate, "device-samples/s", raw_setup,
               "aiokafka fetch + Python record objects; the embedded broker's fetch path", None, raw,
               f"bare aiokafka consumer, same topic and run, no decoding (with decoding: "
               f"{median(raw_dec):,.0f}/s)"),
        Figure("raw_consume_decode_device_samples_per_s", median(raw_dec), "device-samples/s",
               {**raw_setup, "consumer": raw_setup["consumer"].replace("values not decoded",
                                                                       "every value decoded (codec.decode)")},
               "protobuf -> domain conversion in Python (periscope.bus.convert)", None, raw_dec,
               "bare aiokafka consumer, same topic and run, every record decoded"),
        Figure("joiner_vs_raw_ratio", ratio, "x", {"what": "raw_consume_device_samples_per_s / "
                                                             "joiner_device_samples_per_s, same run"},
               "see joiner_device_samples_per_s", RATIO_GOAL, [ratio],
               "raw consume rate / joiner rate, same run"),
        Figure("joiner_bytes_per_row", median(mem), "bytes/row",
               {"rows": rows, "what": "RSS growth of the worker process from listening (no state) to the "
                                      "end of the backlog, per pod-device row it holds (core state + Faust "
                                      "in-memory "
                                      "tables + buffers)", "history": f"{ticks}s of 1s ticks"},
               "per-row window lists, last emitted outputs, and the JSON copies in the in-memory tables",
               None, mem,
               "worker RSS growth / rows over the backlog (fixed fetch/producer buffers included)"),
    ]
    return figures, {"runs": [{k: rounded(v) if isinstance(v, float) else v for k, v in r.items()
                               if k != "url"} for r in runs]}
