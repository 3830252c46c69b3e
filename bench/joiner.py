"""The Faust joiner on a broker (the embedded one or Apache Kafka, bench.common.PROFILE): sustained
throughput of one worker and of three workers of one group against the raw consume rate of the same
topic, and per pod-device row memory of the worker.

The input topics are preloaded with `nodes` simulated nodes (8 GPUs, 8 processes) over `ticks` 1 s
ticks of event time (plus pods, node labels, inventory and the allocation snapshot republished every 5
ticks, as the watcher and probe publish them). A fresh worker (new APP_ID, so a new consumer group
reading from the start) then works through the backlog; every device-sample it processes yields one
GpuState record on periscope.gpus.v1, which a bare consumer in this process counts as they arrive.
The rate is taken between 10% and 90% of the expected records, so group join and the tail are left out.
Three workers of one new group then work through the same backlog, in runs paired and alternating with
the one-worker runs; the input topics need at least as many partitions as workers (run.py creates 12).
The transport limit is a bare aiokafka consumer reading the telemetry topic from the start (no group,
no decoding; and once more with protobuf decoding).

Memory per row is a slope, so the worker's fixed costs (fetch and producer buffers, Faust and the
event loop warming up) cancel: after the other runs, MEM_NODES_FACTOR x as many further nodes (MEM_TICKS
ticks each) are appended, as many fresh workers as there were one-worker runs work through the larger
backlog in turn, and the extra RSS each shows over the one-worker runs (their median) is divided by the
extra rows; the figure is the median of those slopes (one worker's settled RSS is some 10 MB either way
from the next's: how the allocator's arenas end up after catching up).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from bench import processes
from bench.common import (
    JOINER_ROW_GOAL,
    Figure,
    Goal,
    broker_label,
    end_offsets,
    kafka,
    median,
    proc_cpu_s,
    rounded,
)
from bench.workload import T0_MS, NodeShape, SyntheticNode
from periscope.bus import codec, topics
from periscope.bus.producer import Publisher

GOAL = Goal(">=", 20_000, ">= 20,000 device-samples/s (stretch 50,000)")  # the 3x of raw consume: RATIO_GOAL
PERSISTS = "periscope_joiner_state_persists_total"  # the worker's counter of node states written
PROCESSED = "periscope_joiner_device_samples_total"  # the worker's counter of device samples processed
POLL_S = 0.2
SETTLE_S = 3.0  # after a backlog: the end of catch-up (outputs, persists) is over
RATIO_GOAL = Goal("<", 3.0, "< 3 (raw consume rate / joiner rate)")
MEM_NODES_FACTOR = 40  # the memory run appends this many times the rate runs' nodes (costs per node show) ...
MEM_TICKS = 30  # ... with this many ticks each (many rows, so the fixed costs are small beside them)
SCALE_WORKERS = 3  # the scale-out runs: this many workers of one group


async def publish(bootstrap: str, batches: list[list[tuple[topics.Topic, Any]]]) -> int:
    """Publish events in order (batch by batch, one send_many per topic); returns records sent."""
    sent = 0
    async with Publisher(kafka(bootstrap), "bench-load") as pub:
        for batch in batches:
            by_topic: dict[topics.Topic, list[tuple[str, object]]] = {}
            for topic, ev in batch:
                by_topic.setdefault(topic, []).append((ev.meta.node, ev))
            for topic, items in by_topic.items():
                await pub.send_many(topic, items)
                sent += len(items)
    return sent


async def preload(bootstrap: str, nodes: int, ticks: int, shape: NodeShape, first: int = 0) -> dict[str, int]:
    """Append the events of nodes first .. first+nodes-1 over `ticks` ticks to the input topics."""
    sims = [SyntheticNode(i, shape) for i in range(first, first + nodes)]
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
    from periscope.bus.admin import partition_counts

    count = (await partition_counts(kafka(bootstrap), [topic]))[topic]
    c = kafka(bootstrap).consumer(client_id="bench-raw", max_partition_fetch_bytes=4 * 1024 * 1024,
                                  fetch_max_bytes=16 * 1024 * 1024)
    await c.start()
    parts = [TopicPartition(topic, p) for p in range(count)]
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


class Progress:
    """Device samples processed by a set of workers, read from their own /metrics counters, with the
    time each reading was taken (outputs cannot tell: they are published on change, not per sample)."""

    def __init__(self, workers: list[processes.Process]) -> None:
        self.workers = workers
        self.marks: list[tuple[float, float]] = []  # (monotonic time, device samples so far)
        self.origin: tuple[float, float] | None = None  # (when the workers were started, 0), if known
        self.count = 0.0

    async def _read(self) -> float:
        values = await asyncio.gather(*(asyncio.to_thread(w.metric, PROCESSED) for w in self.workers))
        return sum(v for v in values if v == v)  # a worker not listening yet reads as NaN

    async def until(self, expected: int, timeout_s: float, stall_s: float, on_mark: Any = None) -> None:
        deadline = time.monotonic() + timeout_s
        last_progress = time.monotonic()
        while self.count < expected and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
            got = await self._read()
            now = time.monotonic()
            if got > self.count:
                self.count = got
                self.marks.append((now, got))
                last_progress = now
                if on_mark is not None:
                    on_mark(got)
            elif self.count and now - last_progress > stall_s:
                break
            for w in self.workers:
                if w.proc.poll() is not None:
                    raise RuntimeError(f"joiner exited with {w.proc.returncode}:\n{w.log()[-2000:]}")

    def rate(self, expected: int, lo: float = 0.1, hi: float = 0.9) -> tuple[float, float, float]:
        """(device samples/s between lo and hi of `expected`, time of lo, time of hi). Where one poll
        saw the count pass both (a worker's alignment can release most of its samples at once), the
        span starts at the poll before instead: a longer span, never none."""
        i_lo = next(i for i, (_, n) in enumerate(self.marks) if n >= lo * expected)
        t_lo, n_lo = self.marks[i_lo]
        t_hi, n_hi = next(((t, n) for t, n in self.marks if n >= hi * expected), self.marks[-1])
        if t_hi <= t_lo:
            # (Where the first poll did, its answers slow to come from busy workers: from their start,
            # not from when the last of them listened, by which time the others may have worked.)
            before = self.marks[i_lo - 1] if i_lo else self.origin
            if before is not None:
                t_lo, n_lo = before
        if t_hi <= t_lo:  # done by the first poll: too small a backlog to time
            return float("nan"), t_lo, t_hi
        return (n_hi - n_lo) / (t_hi - t_lo), t_lo, t_hi


async def settle(bootstrap: str, topic: topics.Topic, quiet_s: float = 1.0, timeout_s: float = 15) -> None:
    """Wait until nothing more is appended to `topic` (a stopped worker's last records), so the next
    run starts on a quiet broker."""
    deadline = time.monotonic() + timeout_s
    last = await end_offsets(bootstrap, topic.name)
    while time.monotonic() < deadline:
        await asyncio.sleep(quiet_s)
        now = await end_offsets(bootstrap, topic.name)
        if now == last:
            return
        last = now


async def one_worker_run(bootstrap: str, tmp: Path, expected: int, broker_pid: int | None,
                         timeout_s: float, wrap: list[str] | None = None, workers: int = 1) -> dict[str, Any]:
    """Start fresh workers (one consumer group, new APP_ID) on the preloaded backlog and measure the
    device samples they process per second, from their own counters."""
    app_id = f"bench-joiner-{uuid.uuid4().hex[:8]}"
    spawned = time.monotonic()
    procs = [processes.joiner(bootstrap, app_id, tmp, wrap, instance=i) for i in range(workers)]
    progress = Progress(procs)
    progress.origin = (spawned, 0.0)
    cpu: dict[str, tuple[float, float, float]] = {}  # fraction -> (its poll's time, worker CPU, broker CPU)
    polled: list[tuple[float, float]] = []  # (device samples, worker CPU) at each poll that saw progress

    def cpu_s() -> float:
        return sum(w.cpu_s() for w in procs) if wrap is None else 0.0

    def on_mark(n: float) -> None:
        worker = cpu_s()  # one reading a poll, for every figure taken from it
        if wrap is None:
            polled.append((n, worker))
        for frac in (0.1, 0.9):
            if n >= frac * expected and str(frac) not in cpu and all(w.proc.poll() is None for w in procs):
                broker = proc_cpu_s(broker_pid) if broker_pid else 0.0
                cpu[str(frac)] = (progress.marks[-1][0], worker, broker)

    try:
        urls = await asyncio.gather(*(asyncio.to_thread(w.wait_url, 90) for w in procs))
        listening_s = time.monotonic() - spawned
        cpu_listening = cpu_s()  # started: what follows is the backlog's work
        rss_start = sum(w.rss() for w in procs) if wrap is None else 0
        await progress.until(expected, timeout_s, stall_s=15, on_mark=on_mark)
        cpu_done = cpu_s()
        rss_done = sum(w.rss() for w in procs) if wrap is None else 0
        # The workers' loops are free again once the backlog is done; by then they have also published
        # what they gathered while catching up and persisted every node (RSS steps up within a second).
        await asyncio.sleep(SETTLE_S)
        rss_settled = sum(w.rss() for w in procs) if wrap is None else 0
        nodes_held = sum([await asyncio.to_thread(w.metric, "periscope_joiner_nodes") for w in procs])
        # How often a catch-up persists moves its CPU and RSS most (each persist encodes a node's state).
        persists = sum([await asyncio.to_thread(w.metric, PERSISTS) for w in procs])
    finally:
        if wrap is None:
            for w in procs:
                w.stop()
            await settle(bootstrap, topics.GPUS)
    if progress.count < 0.9 * expected:
        raise RuntimeError(f"joiner processed {progress.count:.0f} of {expected} device samples:\n"
                           f"{procs[0].log()[-2000:]}")
    rate, t_lo, t_hi = progress.rate(expected)
    span = t_hi - t_lo
    out: dict[str, Any] = {
        "device_samples_per_s": rate, "workers": workers, "listening_s": listening_s,
        "first_progress_s": progress.marks[0][0] - spawned, "measured_s": span,
        "device_samples_counted": progress.count, "url": urls[0], "worker": procs[0],
        "rss_start": rss_start, "rss_done": rss_done, "rss_settled": rss_settled,
        "nodes_held": nodes_held, "persists": persists,
    }
    # The CPU marks were taken at the polls that passed 10% and 90%: only comparable with that span (not
    # with one that `rate` started at an earlier poll).
    if "0.1" in cpu and "0.9" in cpu and span > 0 and (cpu["0.1"][0], cpu["0.9"][0]) == (t_lo, t_hi):
        out["worker_cpu_util"] = (cpu["0.9"][1] - cpu["0.1"][1]) / span
        out["broker_cpu_util"] = (cpu["0.9"][2] - cpu["0.1"][2]) / span
        out["worker_cpu_us_per_device_sample"] = 1e6 * (cpu["0.9"][1] - cpu["0.1"][1]) / (span * rate)
    if wrap is None and progress.count:
        # The whole backlog, from the moment the workers listen (their startup done) to the last sample.
        out["worker_cpu_us_per_device_sample_whole"] = 1e6 * (cpu_done - cpu_listening) / progress.count
        # Worker CPU from listening at each poll: the whole backlog up to any count of samples.
        out["cpu_by_samples"] = [(n, c - cpu_listening) for n, c in polled]
    return out


def _count(x: float) -> int | None:
    return int(x) if x == x else None  # NaN: the worker's /metrics did not answer


async def rss_per_row(bootstrap: str, broker_pid: int | None, tmp: Path, nodes: int, ticks: int,
                      shape: NodeShape, runs: list[dict[str, Any]], timeout_s: float) -> Figure:
    """Worker RSS per pod-device row, as the slope between the one-worker runs' backlog (`nodes` over
    `ticks`) and the same backlog with MEM_NODES_FACTOR x `nodes` further nodes (MEM_TICKS ticks)
    appended, for each of as many workers on the larger backlog as there are `runs`."""
    extra = MEM_NODES_FACTOR * nodes
    more = await preload(bootstrap, extra, MEM_TICKS, shape, first=nodes)
    bigs = []
    for _ in runs:  # as many fresh workers on the larger backlog
        big = await one_worker_run(bootstrap, tmp, nodes * ticks * shape.gpus + more["device_samples"],
                                   broker_pid, timeout_s)
        big.pop("worker")
        bigs.append(big)
    held = [r["rss_settled"] for r in runs]
    rows, extra_rows = nodes * shape.gpus, extra * shape.gpus
    slopes = [(b["rss_settled"] - median(held)) / extra_rows for b in bigs]
    per_row = median(slopes)
    big = bigs[sorted(range(len(bigs)), key=lambda i: slopes[i])[len(bigs) // 2]]  # the median run
    # (Not growths from the moment each worker listens: it starts consuming at once, so that reading
    # lands anywhere in its first seconds of work, 10-30 MB apart between runs of the same worker.)
    grown = [r["rss_done"] - r["rss_start"] for r in runs]
    setup: dict[str, Any] = {
        "what": f"worker RSS per pod-device row: (RSS of a worker {SETTLE_S:g} s after it worked through "
                f"the backlog with {extra} more nodes x {MEM_TICKS} s appended - median RSS of the "
                f"one-worker rate runs {SETTLE_S:g} s after their {nodes}-node x {ticks} s backlog) / the "
                f"{extra_rows} extra rows; the same code started the same way, so the fixed costs (modules, "
                "fetch/producer buffers, Faust internals) cancel, and by then each worker has published what "
                "it gathered while catching up and persisted every node; the extra rows hold "
                f"{MEM_TICKS} s of history (one open window; see joiner_bytes_per_row for an hour)",
        "rows_small": rows, "rows_large": rows + extra_rows, "extra_rows_ticks": MEM_TICKS,
        "rss_settled_small_bytes": [int(h) for h in held],
        "rss_settled_large_bytes": [int(b["rss_settled"]) for b in bigs],
        "rss_at_done_small_bytes": [int(r["rss_done"]) for r in runs],
        "rss_at_done_large_bytes": [int(b["rss_done"]) for b in bigs],
        "rss_listening_small_bytes": [int(r["rss_start"]) for r in runs],
        "rss_listening_large_bytes": [int(b["rss_start"]) for b in bigs],
        "growth_per_row_small_bytes": rounded(median(grown) / rows),
        "nodes_held_large": big["nodes_held"],
        "persists_small": [_count(r["persists"]) for r in runs], "persists_large": _count(big["persists"]),
    }
    return Figure("joiner_bytes_per_row", per_row, "bytes/row", setup,
                  "core state per row (last sample, window, last outputs) and the table records Faust keeps "
                  "in memory", JOINER_ROW_GOAL, slopes,
                  f"worker RSS slope over {extra_rows} extra rows ({extra} nodes x {MEM_TICKS} s appended to "
                  f"the {nodes}-node backlog), {SETTLE_S:g} s after each backlog; fixed costs cancel; median "
                  f"of {len(bigs)} workers on the larger backlog")


async def throughput(bootstrap: str, broker_pid: int | None, tmp: Path, nodes: int, ticks: int, repeats: int,
                     timeout_s: float, shape: NodeShape = NodeShape()) -> tuple[list[Figure], dict[str, Any]]:
    from periscope.bus.admin import partition_counts

    partitions = (await partition_counts(kafka(bootstrap), [topics.TELEMETRY.name]))[topics.TELEMETRY.name]
    load = await preload(bootstrap, nodes, ticks, shape)
    expected = load["device_samples"]
    runs, pairs = [], []
    retried: list[str] = []
    n = SCALE_WORKERS
    for i in range(repeats):
        # One worker and three workers in turn (the order alternating), so both see the same load from
        # the rest of the machine.
        got: dict[int, dict[str, Any]] = {}
        for workers in ((1, n) if i % 2 == 0 else (n, 1)):
            try:
                r = await one_worker_run(bootstrap, tmp, expected, broker_pid, timeout_s, workers=workers)
            except RuntimeError as e:
                # A run that did not finish (a worker that restarted itself after its stall watch
                # fired, seen on a heavily loaded machine) is run once more, and said so.
                retried.append(f"{workers} worker(s), repeat {i + 1}: {str(e)[:600]}")
                print(f"bench: joiner run retried: {str(e)[:300]}", file=sys.stderr, flush=True)
                r = await one_worker_run(bootstrap, tmp, expected, broker_pid, timeout_s, workers=workers)
            r.pop("worker")
            got[workers] = r
        runs.append(got[1])
        pairs.append(got[n])
    raw = [await raw_consume(bootstrap, topics.TELEMETRY, shape.gpus, decode=False) for _ in range(repeats)]
    raw_dec = [await raw_consume(bootstrap, topics.TELEMETRY, shape.gpus, decode=True)
               for _ in range(repeats)]
    try:
        rss_fig = await rss_per_row(bootstrap, broker_pid, tmp, nodes, ticks, shape, runs, timeout_s)
    except RuntimeError as e:  # the memory run alone failed: keep the rate figures, say why it is missing
        print(f"bench: joiner memory run failed: {str(e)[:500]}", file=sys.stderr, flush=True)
        rss_fig = Figure("joiner_bytes_per_row", None, "bytes/row", {"error": str(e)[:2000]},
                         "the memory run failed (see setup.error)", JOINER_ROW_GOAL, [],
                         "worker RSS slope: not measured in this run")
    rates = [r["device_samples_per_s"] for r in runs]
    scale_rates = [r["device_samples_per_s"] for r in pairs]
    ratios = [b / a for a, b in zip(rates, scale_rates, strict=True)]
    joiner_rate, raw_rate = median(rates), median(raw)
    cores = os.cpu_count()
    setup: dict[str, Any] = {
        "workers": 1, "nodes": nodes, "gpus_per_node": shape.gpus, "processes_per_node": shape.processes,
        "tick": "1s (event time)", "ticks": ticks, **load, "repeats": repeats,
        "how": f"backlog preloaded on {broker_label()} (input topics: {partitions} partitions); a fresh "
               "`python -m services.joiner` worker (new APP_ID) consumes it; progress read from its own "
               f"{PROCESSED} counter every {POLL_S:g} s; rate between 10% and 90% of the backlog's device "
               "samples",
        "worker_env": processes.JOINER_ENV,
        "history": f"rows hold up to {ticks // 60 + 1} one-minute windows (a fresh worker); see "
                   "replay_steady_device_samples_per_s for the cost at 1 h of windows",
        "worker_cpu_util": rounded(median([r.get("worker_cpu_util", float("nan")) for r in runs])),
        "broker_cpu_util": rounded(median([r.get("broker_cpu_util", float("nan")) for r in runs])),
        "worker_cpu_us_per_device_sample": rounded(median(
            [r.get("worker_cpu_us_per_device_sample", float("nan")) for r in runs])),
        "first_progress_s": rounded(median([r["first_progress_s"] for r in runs])),
        "runs_retried": retried,
    }
    raw_setup: dict[str, Any] = {
        "consumer": f"AIOKafkaConsumer, no group, all {partitions} partitions assigned, from the start, "
                    "getmany(max_records=10000), values not decoded",
        "topic": topics.TELEMETRY.name, "records": load["telemetry_records"], "repeats": repeats,
        "with_decode_device_samples_per_s": rounded(median(raw_dec)),
    }
    # Per repeat: the k-th raw consume against the k-th one-worker run (raw consumes follow the
    # worker runs, not interleaved with them).
    by_repeat = [r / j for r, j in zip(raw, rates, strict=True)]
    ratio = median(by_repeat)
    util, butil = setup["worker_cpu_util"], setup["broker_cpu_util"]
    us = setup["worker_cpu_us_per_device_sample"]
    limit = (f"CPU: the worker used {util:.0%} of a core and the broker {butil:.0%} ({cores} cores in all), "
             f"{us} us of worker CPU per device sample; the worker takes input records in batches and steps "
             "the core for each; per batch and node it writes one mark and hands the outputs to the "
             "producer as whole record batches; input records go from each fetch to the worker in batches, "
             "past Faust's conductor and stream (hot spots: bench/run.py --profile)")
    if util is not None and util < 0.8:
        limit = (f"the worker got {util:.0%} of a core (broker {butil:.0%}; the {cores} cores are shared "
                 f"with other work): at {us} us of worker CPU per device sample a whole core would do about "
                 f"{1e6 / us:,.0f}/s" if us else f"the worker got {util:.0%} of a core")
    brief = (f"1 worker, {nodes} nodes x {shape.gpus} GPUs ({shape.processes} processes) x {ticks} s of 1 s "
             "ticks "
             f"preloaded on {broker_label()} ({partitions} partitions); median of {repeats}")
    scale_setup = {
        **{k: setup[k] for k in ("nodes", "gpus_per_node", "ticks", "device_samples", "repeats",
                                 "worker_env")},
        "workers": n, "input_partitions": partitions, "machine_cores": cores,
        "how": f"the same backlog on the same broker; {n} fresh workers of one new consumer group, started "
               f"together, split the {partitions} input partitions; their processed-sample counters summed; "
               "runs alternate with the one-worker runs (paired)",
        "worker_cpu_util": rounded(median([r.get("worker_cpu_util", float("nan")) for r in pairs])),
        "broker_cpu_util": rounded(median([r.get("broker_cpu_util", float("nan")) for r in pairs])),
        "device_samples_counted": [rounded(r["device_samples_counted"]) for r in pairs],
    }
    scale_limit = (f"the machine has {cores} cores in all and the broker shares them: {n} workers cannot get "
                 f"{n} cores; on a cluster each worker has its own")
    figures = [
        Figure("joiner_device_samples_per_s", joiner_rate, "device-samples/s", setup, limit, GOAL, rates,
               brief, baseline="raw_consume_device_samples_per_s"),
        Figure("joiner_three_workers_device_samples_per_s", median(scale_rates), "device-samples/s",
               scale_setup, scale_limit, None, scale_rates,
               f"{n} workers, one group, same backlog ({partitions} partitions); {cores} cores in all, "
               f"broker included; median of {repeats}", baseline="joiner_device_samples_per_s"),
        Figure("joiner_scale_out_ratio", median(ratios), "x",
               {"what": "joiner_three_workers_device_samples_per_s / joiner_device_samples_per_s, per pair "
                        "of runs", "machine_cores": cores},
               scale_limit, None, ratios, f"{n} workers / 1 worker, paired runs on the same backlog"),
        Figure("joiner_worker_cpu_us_per_device_sample", us, "us", setup,
               "what one worker spends per device sample (decode, core, encode, Faust, producer); less "
               "sensitive than the rate to other work on the machine", None,
               [r.get("worker_cpu_us_per_device_sample", float("nan")) for r in runs],
               "worker CPU time / device samples, same runs as joiner_device_samples_per_s"),
        Figure("raw_consume_device_samples_per_s", raw_rate, "device-samples/s", raw_setup,
               f"aiokafka fetch + Python record objects; {broker_label()}'s fetch path", None, raw,
               f"bare aiokafka consumer, same topic and run, no decoding (with decoding: "
               f"{median(raw_dec):,.0f}/s)"),
        Figure("raw_consume_decode_device_samples_per_s", median(raw_dec), "device-samples/s",
               {**raw_setup, "consumer": raw_setup["consumer"].replace("values not decoded",
                                                                       "every value decoded (codec.decode)")},
               "protobuf -> domain conversion in Python (periscope.bus.convert)", None, raw_dec,
               "bare aiokafka consumer, same topic and run, every record decoded",
               baseline="raw_consume_device_samples_per_s"),
        Figure("joiner_vs_raw_ratio", ratio, "x", {"what": "raw consume rate / joiner rate of each repeat "
                                                             "(the k-th raw consume against the k-th "
                                                             "one-worker run), same run; median"},
               "see joiner_device_samples_per_s", RATIO_GOAL, by_repeat,
               f"raw consume rate / joiner rate, same run, per repeat; median of {repeats}"),
        rss_fig,
    ]

    def brief_run(r: dict[str, Any]) -> dict[str, Any]:
        return {k: rounded(v) if isinstance(v, float) else v for k, v in r.items()
                if k not in ("url", "cpu_by_samples")}

    return figures, {"runs": [brief_run(r) for r in runs], "three_worker_runs": [brief_run(r) for r in pairs]}
