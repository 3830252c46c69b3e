"""The joiner against a bare batched loop over the same parts, in the same run on the same backlog.

The bare loop is what the joiner would be without Faust and without its durability protocol: one
aiokafka consumer (no group) assigned every input partition from the start, fetching as much a
partition at a time as the worker's consumer (the broker profile's `fetch_partition_bytes`),
`getmany` batches of at most the joiner's TAKE_MAX records, and per batch the joiner's own parts:
`codec.decode`, the pure core (`step`, and `mark_inputs` with the same at-end flags the worker
computes from the partitions' end offsets), the worker's catch-up rule (while catching up on a node,
the core's views paused and its outputs gathered, then the newest per key), `record_of` (the encoder)
and `RecordBatches` (the worker's producer path, over an aiokafka producer with the joiner's producer
settings). The engine
configuration is the joiner's default. No tables, no marks, no persists, no acknowledgements, no
commits.

Runs alternate with one-worker joiner runs (bench.joiner.one_worker_run) on one preloaded backlog, so
each pair sees the same load from the rest of the machine; both are timed over the whole backlog (the
goal's: the worker up to the poll that counted as many samples as the bare loop joined) and between 10 %
and 90 % of the backlog's device samples joined. The bare loop runs in its own process (`python -m
bench.joiner_baseline`), as the worker does, and reports its own CPU time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import Figure, Goal, MachineSpeed, kafka, kafka_env, median, rounded
from bench.joiner import one_worker_run, preload, settle
from bench.workload import NodeShape
from periscope.bus import codec, topics

RATIO_GOAL = Goal("<", 1.3001, "<= 1.3 (joiner CPU per device sample / bare loop's, same run)")
REPO = Path(__file__).resolve().parent.parent


class _Producer:
    """What RecordBatches needs of Faust's producer, over a plain aiokafka producer."""

    def __init__(self, aio: Any) -> None:
        self._aio = aio

    def _ensure_producer(self) -> Any:
        return self._aio

    def key_partition(self, topic: str, key: bytes) -> Any:
        # As Faust's transport does: the producer's own partitioner on the serialized key.
        return _TP(self._aio._partition(topic, None, None, None, key, None))


class _TP:
    __slots__ = ("partition",)

    def __init__(self, partition: int) -> None:
        self.partition = partition


async def bare_loop(bootstrap: str, expected: int) -> dict[str, Any]:
    """Work through every input partition from the start to its end offset as the joiner's parts would
    without Faust; device-samples/s and CPU per device sample between 10 % and 90 % of `expected`."""
    from aiokafka import TopicPartition

    from periscope.bus.admin import partition_counts
    from periscope.core.engine import (
        NodeState,
        apply,
        mark_inputs,
        new_state,
        pause_views,
        refresh_views,
        resume_views,
    )
    from periscope.core.model import Output
    from periscope.settings.joiner import JoinerSettings
    from services.joiner.app import TAKE_MAX
    from services.joiner.catchup import Gathered, catching_up
    from services.joiner.delivery import RecordBatches, record_of
    from services.joiner.slots import node_of
    from services.joiner.worker import STREAM_OF_TOPIC

    config = JoinerSettings(kafka_bootstrap=bootstrap).engine_config()
    telemetry = topics.TELEMETRY.name
    k = kafka(bootstrap)
    names = [t.name for t in topics.NODE_INPUTS]
    counts = await partition_counts(k, names)
    parts = [TopicPartition(n, p) for n in names for p in range(counts[n])]
    # Fetching as the worker's Faust consumer does (its per-partition size from the profile, aiokafka's
    # total), so neither loop reads further ahead of its joins for a larger fetch.
    consumer = k.consumer(client_id="bench-bare", max_partition_fetch_bytes=k.profile.fetch_partition_bytes)
    aio = k.producer("bench-bare")
    await consumer.start()
    await aio.start()
    try:
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        batches = RecordBatches(_Producer(aio))
        states: dict[str, NodeState] = {}
        partition_of: dict[str, int] = {}
        processed: dict[tuple[str, int], int] = {}
        told: dict[int, tuple[Any, ...]] = {}
        pending: list[Any] = []
        gathered: dict[str, Gathered] = {}
        samples = 0
        marks = [(time.perf_counter(), time.process_time(), 0)]  # (wall, CPU, samples) per batch
        started = marks[0][0]
        while True:
            got = await consumer.getmany(timeout_ms=1000, max_records=TAKE_MAX)
            if not got and all([await consumer.position(tp) >= ends[tp] for tp in parts]):
                break
            outs: dict[str, list[Output]] = {}
            stamped: dict[str, int] = {}  # node -> its oldest record's broker timestamp (ms) in the batch
            taken_at = {tp.partition: records[0].offset for tp, records in got.items()
                        if tp.topic == telemetry and records}
            for tp, records in got.items():
                topic = topics.BY_NAME[tp.topic]
                for r in records:
                    processed[(tp.topic, tp.partition)] = r.offset
                    obj = codec.decode(topic, r.value)
                    node = node_of(r.key, obj)
                    if node is None:
                        continue
                    state = states.get(node)
                    if state is None:
                        state = states[node] = new_state(node)
                        partition_of[node] = tp.partition
                    stamped[node] = min(stamped.get(node, r.timestamp), r.timestamp)
                    o = apply(state, obj, config)
                    if o:
                        outs.setdefault(node, []).extend(o)
            if config.align:  # the worker's at-end flags, told to the nodes of a partition when they change
                for p in {tp.partition for tp in got}:
                    flags = tuple((stream, processed.get((name, p), -1) + 1 >= ends[TopicPartition(name, p)])
                                  for name, stream in STREAM_OF_TOPIC.items())
                    if told.get(p) != flags:
                        told[p] = flags
                        at_end = dict(flags)
                        for node, state in states.items():
                            if partition_of[node] == p:
                                outs.setdefault(node, []).extend(mark_inputs(state, config, at_end=at_end))
            # As the worker counts it: the partition's telemetry on the broker when the batch was taken.
            backlog: dict[int, int] = {}
            for p in {tp.partition for tp in got}:
                position = taken_at.get(p, processed.get((telemetry, p), -1) + 1)
                backlog[p] = ends[TopicPartition(telemetry, p)] - position
            records = []
            wall_ms = time.time() * 1000
            for node, node_outs in outs.items():  # as the worker: gathered while catching up on the node
                g = gathered.setdefault(node, Gathered())
                g.add(node_outs)
                waited_s = (wall_ms - stamped.get(node, wall_ms)) / 1000
                if catching_up(node_outs, backlog.get(partition_of[node]), waited_s):
                    pause_views(states[node])
                else:
                    g.add(resume_views(states[node], config))
                    records.extend(record_of(o) for o in g.take())
            if records:
                pending.extend(await batches.send(records))
            if got:  # device samples joined so far (alignment and lateness hold some back): as the worker
                samples = sum(state.counters.device_samples for state in states.values())
                marks.append((time.perf_counter(), time.process_time(), samples))
        # What is still gathered goes out at the end, as a worker's persist would publish it.
        for node, g in gathered.items():
            g.add(refresh_views(states[node], config))
        records = [record_of(o) for g in gathered.values() for o in g.take()]
        if records:
            pending.extend(await batches.send(records))
        await asyncio.gather(*pending)
        total_s = time.perf_counter() - started
    finally:
        await consumer.stop()
        await aio.stop()
    # Between the batches that passed 10 % and 90 % of the samples; a backlog of a few batches: all of it.
    (t0, c0, n0) = next(m for m in marks if m[2] >= 0.1 * expected)
    (t1, c1, n1) = next(m for m in marks if m[2] >= 0.9 * expected)
    if n1 <= n0:
        (t0, c0, n0), (t1, c1, n1) = marks[0], marks[-1]
    rate = (n1 - n0) / (t1 - t0)
    # The whole backlog, from before the first fetch (the consumer assigned and positioned) to the last
    # sample. Alignment holds samples until the allocation streams are read, so the bare loop joins most
    # of them in a few large batches: its 10-90 % window can start after much of its decoding.
    whole = 1e6 * (marks[-1][1] - marks[0][1]) / max(1, marks[-1][2])
    return {"device_samples_per_s": rate, "cpu_us_per_device_sample": 1e6 * (c1 - c0) / (n1 - n0),
            "cpu_us_per_device_sample_whole": whole, "batches_with_samples": len(marks) - 1,
            "cpu_util": (c1 - c0) / (t1 - t0), "device_samples": samples, "total_s": total_s}


def bare_run(bootstrap: str, expected: int, timeout_s: float) -> dict[str, Any]:
    """The bare loop in its own process (as the worker runs in its own), its JSON result."""
    env = {**os.environ, **kafka_env()}
    out = subprocess.run([sys.executable, "-m", "bench.joiner_baseline", "--bootstrap", bootstrap,
                          "--expected", str(expected)], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=timeout_s, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"bare loop exited with {out.returncode}:\n{out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


async def compare(bootstrap: str, broker_pid: int | None, tmp: Path, nodes: int, ticks: int, repeats: int,
                  timeout_s: float, shape: NodeShape = NodeShape()) -> tuple[list[Figure], dict[str, Any]]:
    load = await preload(bootstrap, nodes, ticks, shape)
    expected = load["device_samples"]
    pairs: list[dict[str, dict[str, Any]]] = []
    failed: list[str] = []
    for i in range(repeats):
        got: dict[str, dict[str, Any]] = {}
        by_samples: list[tuple[float, float]] = []
        for what in (("joiner", "bare") if i % 2 == 0 else ("bare", "joiner")):
            speed = MachineSpeed()
            if what == "joiner":
                try:
                    async with speed:
                        r = await one_worker_run(bootstrap, tmp, expected, broker_pid, timeout_s)
                except RuntimeError as e:  # a worker that stalled on a loaded machine: this pair is void
                    failed.append(str(e).splitlines()[0])
                    break
                r.pop("worker")
                got[what] = {"device_samples_per_s": r["device_samples_per_s"],
                             "cpu_us_per_device_sample": r.get("worker_cpu_us_per_device_sample"),
                             "cpu_us_per_device_sample_to_last":
                                 r.get("worker_cpu_us_per_device_sample_whole"),
                             "cpu_util": r.get("worker_cpu_util")}
                by_samples = r.get("cpu_by_samples") or []
            else:
                async with speed:
                    got[what] = await asyncio.to_thread(bare_run, bootstrap, expected, timeout_s)
                await settle(bootstrap, topics.GPUS)
            got[what].update(speed.summary())
        if len(got) == 2:
            joined = got["bare"]["device_samples"]
            got["joiner"]["cpu_us_per_device_sample_whole"] = same_samples(by_samples, joined)
            pairs.append(got)
    if not pairs:
        raise RuntimeError(f"no joiner run completed: {failed}")
    ratios = [p["joiner"]["cpu_us_per_device_sample"] / p["bare"]["cpu_us_per_device_sample"] for p in pairs
              if p["joiner"]["cpu_us_per_device_sample"]]
    whole = "cpu_us_per_device_sample_whole"
    whole_ratios = [p["joiner"][whole] / p["bare"][whole] for p in pairs if p["joiner"].get(whole)]
    to_last = [p["joiner"]["cpu_us_per_device_sample_to_last"] / p["bare"][whole] for p in pairs
               if p["joiner"].get("cpu_us_per_device_sample_to_last")]
    rate_ratios = [p["bare"]["device_samples_per_s"] / p["joiner"]["device_samples_per_s"] for p in pairs]
    bare_us = [p["bare"]["cpu_us_per_device_sample"] for p in pairs]
    bare_rates = [p["bare"]["device_samples_per_s"] for p in pairs]
    # The machine's speed over the pairs: the slowest moment's fixed work against the fastest's.
    speeds = [r[k] for p in pairs for r in p.values() for k in ("fixed_work_ms_min", "fixed_work_ms_max")
              if r.get(k)]
    setup: dict[str, Any] = {
        "nodes": nodes, "gpus_per_node": shape.gpus, "ticks": ticks, **load, "repeats": repeats,
        "how": "one preloaded backlog; one-worker joiner runs (fresh consumer group) alternating with "
               "bare-loop runs (own process, no group); CPU per device sample of each over the whole "
               "backlog (the goal's) and between 10% and 90% of the backlog's device samples joined; the "
               "ratio per pair",
        "bare_loop": __doc__.split("\n\n")[1].replace("\n", " ") if __doc__ else "",
        # Up to the worker's last sample instead: each node's last ticks, held for the lateness until the
        # worker's tick finds the node quiet, seconds after the rest (2026-12-01: 0.16-0.27 s of worker
        # CPU between the bare loop's count and the last sample, on a backlog of 3-4 s of CPU).
        "ratio_whole_backlog_to_last_sample": [rounded(r) for r in to_last],
        "pairs": [{w: {k: rounded(v) for k, v in r.items()} for w, r in p.items()} for p in pairs],
        "void_pairs": failed,
        "machine_speed": "each run's fixed_work_ms: CPU ms of a fixed Python loop in the bench process "
                         "every 0.5 s during the run (bench.common.MachineSpeed); slowest / fastest over "
                         "every run of the pairs: "
                         + (f"{max(speeds) / min(speeds):.2f}" if speeds else "not measured"),
    }
    limit = ("what the joiner pays beyond the bare loop: Faust's consumer thread and fetch loop, tables, "
             "the mark and persist writes to the changelogs, acknowledgements and commits, metrics")
    figures = [
        Figure("joiner_bare_loop_cpu_us_per_device_sample", median(bare_us), "us", setup,
               "decode, core, encode and produce only", None, bare_us,
               "bare batched aiokafka loop over the joiner's decoder, core, encoder and producer path"),
        Figure("joiner_bare_loop_device_samples_per_s", median(bare_rates), "device-samples/s", setup,
               "one process on a shared machine", None, bare_rates,
               "the bare loop's rate, same backlog and run as the joiner"),
        Figure("joiner_vs_bare_loop_cpu_ratio", median(ratios) if ratios else None, "x", setup,
               f"{limit}; and how much of each loop's decoding precedes the window", None, ratios,
               "the same between 10 % and 90 % of the device samples joined, paired runs"),
        Figure("bare_loop_vs_joiner_rate_ratio", median(rate_ratios), "x", setup, limit, None, rate_ratios,
               "bare loop device-samples/s / joiner's, paired runs"),
        # The goal's: every device sample's work counted on both sides. A window on samples joined leaves
        # out the decoding done before it, and how much differs between the loops with how far each
        # reads ahead of its joins (alignment holds samples until the allocation streams are read): on
        # Apache Kafka on 2026-11-30 the bare loop's window held 39-43 us a device sample of its 58-66
        # over the whole backlog, the worker's 53-68 of 64-73. The whole backlog's own bias is against
        # the joiner: its count starts when the worker listens, before its rebalance and first fetch.
        # Both count the same samples: the bare loop ends without the last ticks of each node that wait
        # for the lateness, so the worker's count stops where it has joined as many (see same_samples).
        Figure("joiner_vs_bare_loop_cpu_ratio_whole_backlog", median(whole_ratios) if whole_ratios else None,
               "x", setup, f"{limit}; and the worker's start (its rebalance), which the bare loop has not",
               RATIO_GOAL, whole_ratios,
               "joiner CPU per device sample / bare loop's over each run's whole backlog (joiner: from "
               "listening to the poll that counted the samples the bare loop joined; bare loop: from its "
               "first fetch), paired runs"),
    ]
    return figures, {"pairs": setup["pairs"], "void_pairs": failed}


def same_samples(by_samples: list[tuple[float, float]], joined: int) -> float | None:
    """The worker's CPU per device sample (us) from listening to the first poll that counted at least
    `joined` samples: the bare loop's count over the same backlog. The last samples of each node wait
    for the lateness until the node goes quiet (the worker's tick releases them seconds later, with
    nothing else to do meanwhile but its timers and polls); the bare loop ends without them."""
    hit = next(((n, cpu) for n, cpu in by_samples if n >= joined), None)
    return None if hit is None or not hit[0] else 1e6 * hit[1] / hit[0]


def main() -> None:
    ap = argparse.ArgumentParser(description="The bare batched loop once; prints one JSON line.")
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--expected", type=int, required=True, help="device samples in the backlog")
    args = ap.parse_args()
    print(json.dumps(asyncio.run(bare_loop(args.bootstrap, args.expected))))


if __name__ == "__main__":
    main()
