"""Is Faust's `processing_guarantee="exactly_once"` worth it on Apache Kafka? The same minimal worker
(bench/eos_worker.py: the joiner's workload shape, none of its code) under `at_least_once` and
`exactly_once`, on the same backlog and broker, in alternating runs.

What exactly_once does in this Faust (faust-streaming 0.15, aiokafka driver): the worker's consumer
reads with `isolation_level=read_committed`; on every assignment it starts one transactional producer
per assigned partition (transactional id `<app>-<group>-<partition>`); every record Faust sends for a
partition the consumer knows goes through that partition's producer inside an open transaction; every
commit (each `broker_commit_interval`, 2.8 s by default) sends the consumed offsets to each producer's
transaction, commits it and begins the next. A read_committed reader sees a record only once its
transaction is committed.

Measured per run (a fresh consumer group, so it reads the whole backlog):
- backlog: records handled per second between 10 % and 90 % of the backlog, the worker's CPU (all its
  threads) and the broker's CPU per record over the same span;
- live: records published at a steady rate; for each output record, the time from the newest input
  record it covers (its record time) to its arrival at a `read_committed` consumer in this process;
- after the run: per topic, offsets that hold no record (transaction markers: one per partition and
  commit), i.e. whether the writes were transactional at all.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition

from bench.common import Figure, kafka, median, percentile, rounded
from bench.processes import Process
from bench.workload import T0_MS, NodeShape, SyntheticNode
from periscope.bus import topics
from periscope.bus.admin import TopicPlan, ensure_topics
from periscope.bus.producer import Publisher

GUARANTEES = ("at_least_once", "exactly_once")
PARTITIONS = 4  # the deployment default: one transactional producer per partition under exactly_once


def _telemetry(sims: list[SyntheticNode], t_ms: int, n: int) -> list[tuple[str, object]]:
    return [(s.name, ev) for s in sims for topic, ev in s.tick(t_ms, n) if topic == topics.TELEMETRY]


async def preload(bootstrap: str, nodes: int, ticks: int, shape: NodeShape) -> int:
    """Telemetry of `nodes` nodes over `ticks` 1 s ticks of event time; returns records sent."""
    sims = [SyntheticNode(i, shape) for i in range(nodes)]
    sent = 0
    async with Publisher(kafka(bootstrap), "bench-eos-load") as pub:
        for n in range(ticks):
            items = _telemetry(sims, T0_MS + n * 1000, n)
            await pub.send_many(topics.TELEMETRY, items)
            sent += len(items)
    return sent


async def _live(bootstrap: str, live: str, output: str, rate: int, seconds: float, shape: NodeShape,
                first_node: int) -> dict[str, Any]:
    """Publish `rate` telemetry records/s to the run's own live topic for `seconds` (nodes tick in 10
    phases a second) while a read_committed consumer times every output record covering them."""
    live_topic = topics.Topic(live, "node", "NodeTelemetry")
    sims = [SyntheticNode(first_node + i, shape) for i in range(rate)]
    consumer = kafka(bootstrap).consumer(client_id="bench-eos-out", fetch_max_wait_ms=20,
                                         isolation_level="read_committed")
    await consumer.start()
    lat: list[float] = []
    stop = asyncio.Event()
    try:
        parts = [TopicPartition(output, p) for p in range(PARTITIONS)]
        consumer.assign(parts)
        await consumer.seek_to_end(*parts)
        for p in parts:
            await consumer.position(p)
        started_ms = time.time() * 1000

        async def read() -> None:
            while not stop.is_set():
                got = await consumer.getmany(timeout_ms=100)
                now_ms = time.time() * 1000
                for recs in got.values():
                    for r in recs:
                        _, newest_ms = json.loads(r.value)
                        if newest_ms >= started_ms:
                            lat.append((now_ms - newest_ms) / 1000)

        reader = asyncio.ensure_future(read())
        async with Publisher(kafka(bootstrap), "bench-eos-live", linger_ms=5) as pub:
            slots = [sims[k::10] for k in range(10)]
            t_next = time.time()
            n = 0
            while time.time() * 1000 - started_ms < seconds * 1000:
                for group in slots:
                    await asyncio.sleep(max(0.0, t_next - time.time()))
                    await pub.send_many(live_topic, _telemetry(group, int(time.time() * 1000), n))
                    t_next += 0.1
                n += 1
        await asyncio.sleep(4.0)  # the last transaction commits within a commit interval (2.8 s)
        stop.set()
        await reader
    finally:
        await consumer.stop()
    return {"outputs_timed": len(lat), "p50_s": percentile(lat, 50) if lat else None,
            "p99_s": percentile(lat, 99) if lat else None, "max_s": max(lat) if lat else None}


async def _markers(bootstrap: str, topic: str) -> dict[str, int]:
    """Records in `topic` and offsets that hold none (transaction markers), read from the start."""
    from periscope.bus.admin import partition_counts

    count = (await partition_counts(kafka(bootstrap), [topic])).get(topic, 0)
    c = kafka(bootstrap).consumer(client_id="bench-eos-count", max_partition_fetch_bytes=4 << 20)
    await c.start()
    try:
        parts = [TopicPartition(topic, p) for p in range(count)]
        c.assign(parts)
        ends = await c.end_offsets(parts)
        await c.seek_to_beginning(*parts)
        records = 0
        while [p for p in parts if await c.position(p) < ends[p]]:
            got = await c.getmany(timeout_ms=1000, max_records=10_000)
            records += sum(len(v) for v in got.values())
        return {"records": records, "offsets": sum(ends.values()),
                "markers": sum(ends.values()) - records}
    finally:
        await c.stop()


def _report(path: Path) -> dict[str, dict[str, float]]:
    if not path.exists():
        return {}
    return {line["mark"]: line for line in map(json.loads, path.read_text().splitlines())}


async def one_run(bootstrap: str, broker_pid: int | None, tmp: Path, guarantee: str, expected: int,
                  live_rate: int, live_s: float, shape: NodeShape, timeout_s: float) -> dict[str, Any]:
    app_id = f"bench-eos-{guarantee.split('_')[0]}-{uuid.uuid4().hex[:6]}"
    output, live = f"{app_id}.out", f"{app_id}.live"  # the live topic: so no run reads another's
    await ensure_topics(kafka(bootstrap), [topics.Topic(output, "node", "-", "output"),
                                           topics.Topic(live, "node", "NodeTelemetry")],
                        plan=TopicPlan(partitions=PARTITIONS))
    report = tmp / f"{app_id}.marks"
    env = {"EOS_BOOTSTRAP": bootstrap, "EOS_GUARANTEE": guarantee, "EOS_APP_ID": app_id,
           "EOS_OUTPUT": output, "EOS_LIVE_INPUT": live, "EOS_PARTITIONS": str(PARTITIONS),
           "EOS_EXPECTED": str(expected),
           "EOS_REPORT": str(report), "EOS_DATA_DIR": str(tmp / f"{app_id}-data"),
           "EOS_BROKER_PID": str(broker_pid or 0)}
    started = time.monotonic()
    worker = Process("eos", [sys.executable, "-m", "bench.eos_worker"], env, tmp / f"{app_id}.log")
    try:
        while "done" not in (marks := _report(report)):
            if worker.proc.poll() is not None:
                raise RuntimeError(f"eos worker exited with {worker.proc.returncode}:\n"
                                   f"{worker.log()[-2000:]}")
            if time.monotonic() - started > timeout_s:
                raise RuntimeError(f"eos worker handled {marks} of {expected} in {timeout_s:.0f}s:\n"
                                   f"{worker.log()[-2000:]}")
            await asyncio.sleep(0.1)
        done_s = time.monotonic() - started
        timed = await _live(bootstrap, live, output, live_rate, live_s, shape, first_node=100_000)
    finally:
        worker.stop()
    lo, hi = marks["lo"], marks["hi"]
    span, handled = hi["t"] - lo["t"], hi["handled"] - lo["handled"]
    return {
        "guarantee": guarantee, "records_per_s": handled / span if span > 0 else float("nan"),
        "worker_cpu_us_per_record": 1e6 * (hi["cpu_s"] - lo["cpu_s"]) / handled,
        "broker_cpu_us_per_record": 1e6 * (hi["broker_cpu_s"] - lo["broker_cpu_s"]) / handled,
        "worker_cpu_util": (hi["cpu_s"] - lo["cpu_s"]) / span if span > 0 else float("nan"),
        "start_to_backlog_done_s": done_s, "live": timed,
        "output_topic": await _markers(bootstrap, output),
        "changelog_topic": await _markers(bootstrap, f"{app_id}-state-changelog"),
        "log_tail": worker.log()[-600:] if "Traceback" in worker.log() else "",
    }


async def compare(bootstrap: str, broker_pid: int | None, tmp: Path, nodes: int, ticks: int, repeats: int,
                  live_rate: int, live_s: float, timeout_s: float = 300,
                  shape: NodeShape = NodeShape()) -> tuple[list[Figure], dict[str, Any]]:
    """Alternating runs of both guarantees on one backlog; figures of each and their ratio."""
    expected = await preload(bootstrap, nodes, ticks, shape)
    runs: dict[str, list[dict[str, Any]]] = {g: [] for g in GUARANTEES}
    for i in range(repeats):
        for g in (GUARANTEES if i % 2 == 0 else GUARANTEES[::-1]):
            runs[g].append(await one_run(bootstrap, broker_pid, tmp, g, expected, live_rate, live_s, shape,
                                         timeout_s))
    return figures(runs, nodes, ticks, expected, live_rate, live_s, shape)


def _med(rs: list[dict[str, Any]], key: str) -> float:
    return median(r[key] for r in rs)


def figures(runs: dict[str, list[dict[str, Any]]], nodes: int, ticks: int, expected: int, live_rate: int,
            live_s: float, shape: NodeShape) -> tuple[list[Figure], dict[str, Any]]:
    alo = runs["at_least_once"]
    rate = {g: [r["records_per_s"] for r in rs] for g, rs in runs.items()}
    cpu = {g: [r["worker_cpu_us_per_record"] for r in rs] for g, rs in runs.items()}
    p99 = {g: [r["live"]["p99_s"] for r in rs if r["live"]["p99_s"] is not None] for g, rs in runs.items()}
    p50 = {g: [r["live"]["p50_s"] for r in rs if r["live"]["p50_s"] is not None] for g, rs in runs.items()}
    transactional = {g: {"output_markers": [r["output_topic"]["markers"] for r in rs],
                         "changelog_markers": [r["changelog_topic"]["markers"] for r in rs]}
                     for g, rs in runs.items()}
    setup: dict[str, Any] = {
        "worker": "bench/eos_worker.py: one Faust worker (python -m bench.eos_worker), memory store, "
                  f"input {topics.TELEMETRY.name} ({PARTITIONS} partitions), take_events(2000, 20 ms); per "
                  "record a protobuf decode; per batch one changelog record per node seen and one output "
                  "record; Faust's default commit interval (2.8 s)",
        "backlog": f"{nodes} nodes x {ticks} s of telemetry ({expected} records, {shape.gpus} GPUs each)",
        "live": f"{live_rate} records/s for {live_s:g} s after the backlog; latency = arrival of an output "
                "at a read_committed consumer - record time of the newest input it covers",
        "repeats": len(alo), "order": "alternating, a fresh consumer group per run",
        "broker_cpu_us_per_record": {g: rounded(_med(rs, "broker_cpu_us_per_record")) for g, rs in
                                     runs.items()},
        "worker_cpu_util": {g: rounded(_med(rs, "worker_cpu_util")) for g, rs in runs.items()},
        "start_to_backlog_done_s": {g: rounded(_med(rs, "start_to_backlog_done_s"))
                                    for g, rs in runs.items()},
        "live_p50_s": {g: rounded(median(v)) if v else None for g, v in p50.items()},
        "transaction_markers": transactional,
    }
    ratios = [e / a for a, e in zip(cpu["at_least_once"], cpu["exactly_once"], strict=True)]
    rate_ratios = [e / a for a, e in zip(rate["at_least_once"], rate["exactly_once"], strict=True)]
    brief = f"minimal Faust worker, {expected:,} telemetry records backlog, {PARTITIONS} partitions"
    limit = ("the worker's CPU: decode and Faust's per-event path; exactly_once adds a transactional "
             "producer per partition, records sent per partition inside transactions, and a commit of "
             "every transaction each commit interval")
    figs = [
        Figure("eos_at_least_once_records_per_s", median(rate["at_least_once"]), "records/s", setup, limit,
               None, rate["at_least_once"], brief + ", at_least_once"),
        Figure("eos_exactly_once_records_per_s", median(rate["exactly_once"]), "records/s", setup, limit,
               None, rate["exactly_once"], brief + ", exactly_once",
               baseline="eos_at_least_once_records_per_s"),
        Figure("eos_at_least_once_cpu_us_per_record", median(cpu["at_least_once"]), "us", setup, limit,
               None, cpu["at_least_once"], brief + ", at_least_once: worker CPU per record"),
        Figure("eos_exactly_once_cpu_us_per_record", median(cpu["exactly_once"]), "us", setup, limit,
               None, cpu["exactly_once"], brief + ", exactly_once: worker CPU per record",
               baseline="eos_at_least_once_cpu_us_per_record"),
        Figure("eos_cpu_ratio", median(ratios), "x", {"what": "exactly_once / at_least_once worker CPU per "
                                                               "record, per pair of runs"},
               limit, None, ratios, "exactly_once / at_least_once CPU per record, paired runs"),
        Figure("eos_rate_ratio", median(rate_ratios), "x", {"what": "exactly_once / at_least_once records "
                                                                     "per second, per pair of runs"},
               limit, None, rate_ratios, "exactly_once / at_least_once throughput, paired runs"),
        Figure("eos_at_least_once_live_p99_s", median(p99["at_least_once"]) if p99["at_least_once"] else None,
               "s", setup, "take window, producer linger, one fetch", None, p99["at_least_once"],
               f"{live_rate} records/s live: input record time -> output at a read_committed consumer"),
        Figure("eos_exactly_once_live_p99_s", median(p99["exactly_once"]) if p99["exactly_once"] else None,
               "s", setup, "an output is readable once its transaction commits: up to one commit interval",
               None, p99["exactly_once"],
               f"{live_rate} records/s live: input record time -> output at a read_committed consumer",
               baseline="eos_at_least_once_live_p99_s"),
    ]
    details = {g: [{k: (rounded(v) if isinstance(v, float) else v) for k, v in r.items()} for r in rs]
               for g, rs in runs.items()}
    return figs, details


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - a manual entry for trying it alone
    import argparse
    import tempfile

    from bench import common
    from bench.common import broker

    ap = argparse.ArgumentParser(prog="bench/eos.py")
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--ticks", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--live-rate", type=int, default=400)
    ap.add_argument("--live-s", type=float, default=15)
    args = ap.parse_args(argv)
    common.use_broker("kafka")
    with tempfile.TemporaryDirectory(prefix="periscope-bench-eos-") as tmp, broker(Path(tmp)) as b:
        figs, details = asyncio.run(compare(b.bootstrap, b.pid, Path(tmp), args.nodes, args.ticks,
                                            args.repeats, args.live_rate, args.live_s))
    print(json.dumps({f.key: f.as_json() for f in figs} | {"details": details}, indent=1, default=str))
    return 0


if __name__ == "__main__":  # pragma: no cover
    os.environ.setdefault("PYTHONPATH", str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
